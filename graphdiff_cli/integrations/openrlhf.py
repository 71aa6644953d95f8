"""graphdiff fed from OpenRLHF's custom reward function: rollouts counted into training steps, from any process.

OpenRLHF (checked against 0.11.2) loads ``--reward.remote_url reward_func.py`` in every vLLM engine (each a
Ray actor process) and calls ``reward_func(queries, prompts, labels)`` once per rollout, in worker threads,
several at a time; it passes no training step and no prompt id, and it swallows the function's exceptions
(the reward silently becomes None). Each training step consumes one generation wave: ``rollout.batch_size``
prompt groups of ``n_samples_per_prompt`` rollouts that pass dynamic filtering (a filtered group is
replaced by a fresh prompt), or fewer when the episode's prompts run out.

``StepRecorder.record(id, reward, score)`` is called by the reward function for each training rollout (the
id travels in the data set's label field, e.g. as JSON: ``parse_label``). Every call, from every process
and thread, appends the rollout under one file lock in ``<STATE>.openrlhf/``; the call that completes the
wave - ``batch_size`` complete groups that pass the filter (strictly ``lo < mean score < hi``, as OpenRLHF
filters), or ``episode_prompts`` groups in the episode - applies every complete group of the wave (the
filtered ones too: they are outcomes of the same policy) as exactly one STATE step, T = the STATE's step
+ 1. The wave is first moved, atomically, from ``pending.jsonl`` to ``closing.json`` and only then applied,
so a crash at any point leaves it applied once: a later call finds ``closing.json`` and applies it if the
STATE is not yet at T.

A failure (an id not in the STATE, a group with more than n rollouts, a STATE moved by someone else) is
raised, written to ``<STATE>.openrlhf/ERROR`` and printed on stderr, and every later call raises it again
until the file is removed: OpenRLHF would otherwise hide it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from ..errors import DataError, GraphdiffError, InvalidArgumentError, StateError
from ..io.atomic import atomic_write_text
from ..io.locks import file_lock
from .tracking import StateTarget, count_outcomes

ENV = {"state": "GRAPHDIFF_STATE", "batch_size": "GRAPHDIFF_BATCH_SIZE", "n_samples": "GRAPHDIFF_N_SAMPLES",
       "filter_range": "GRAPHDIFF_FILTER_RANGE", "episode_prompts": "GRAPHDIFF_EPISODE_PROMPTS",
       "success_threshold": "GRAPHDIFF_SUCCESS_THRESHOLD"}


def parse_label(label) -> tuple[str, dict]:
    """(prompt id, the label's other fields) from a label holding JSON with an "id" (or a dict)."""
    meta = label if isinstance(label, dict) else None
    if meta is None:
        try:
            meta = json.loads(label)
        except (TypeError, ValueError):
            meta = None
    if not isinstance(meta, dict) or "id" not in meta:
        raise DataError(f"the label {str(label)[:80]!r} holds no JSON object with an \"id\": put each prompt's id "
                        "into the data set's label field, e.g. {\"id\": \"p17\", \"answer\": \"42\"}")
    return str(meta["id"]), meta


class StepRecorder:
    """Rollouts from OpenRLHF's reward function -> one graphdiff step per training step (see the module)."""

    def __init__(self, state, *, batch_size: int, n_samples: int, filter_range=None, episode_prompts=None,
                 success_threshold: float = 1.0, folder=None, device: str | None = "cpu", durable: bool = True):
        self.state = Path(state)
        self.batch_size, self.n_samples = int(batch_size), int(n_samples)
        if self.batch_size < 1 or self.n_samples < 1:
            raise InvalidArgumentError(f"batch_size and n_samples must be >= 1, got {batch_size}, {n_samples}")
        self.filter_range = None if filter_range is None else tuple(float(x) for x in filter_range)
        if self.filter_range is not None and (len(self.filter_range) != 2 or
                                              not self.filter_range[0] < self.filter_range[1]):
            raise InvalidArgumentError(f"filter_range must be two numbers lo < hi, got {filter_range!r}")
        self.episode_prompts = None if episode_prompts in (None, 0, "") else int(episode_prompts)
        self.success_threshold = float(success_threshold)
        self.folder = Path(folder) if folder else self.state.parent / f"{self.state.name}.openrlhf"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.target = StateTarget(self.state, outcomes_dir=self.folder, device=device, durable=durable)

    @classmethod
    def from_env(cls, **overrides) -> StepRecorder:
        """Settings from GRAPHDIFF_STATE, _BATCH_SIZE (rollout.batch_size), _N_SAMPLES
        (rollout.n_samples_per_prompt), _FILTER_RANGE ("lo,hi" when dynamic filtering is on),
        _EPISODE_PROMPTS (prompts per episode, for its short last step) and _SUCCESS_THRESHOLD."""
        kw = {}
        for key, var in ENV.items():
            if key in overrides or not os.environ.get(var):
                continue
            value = os.environ[var]
            kw[key] = [float(x) for x in value.split(",")] if key == "filter_range" else value
        kw.update(overrides)
        missing = [ENV[k] for k in ("state", "batch_size", "n_samples") if k not in kw]
        if missing:
            raise InvalidArgumentError(f"set {', '.join(missing)} for graphdiff's OpenRLHF recorder")
        return cls(**kw)

    # -- the one entry point -----------------------------------------------------------------------

    def record(self, prompt_id: str, reward: float, score: float | None = None) -> int | None:
        """Record one training rollout; returns the step applied when this call completed a wave."""
        error = self.folder / "ERROR"
        try:
            with file_lock(self.folder / "lock", timeout=3600.0,
                           busy=lambda holder: f"{self.folder}/lock held by pid {holder} for an hour"):
                if error.exists():
                    raise StateError(f"graphdiff's OpenRLHF recorder stopped earlier: {error.read_text().strip()} "
                                     f"(remove {error} once fixed)")
                self._finish_closing()
                self.target.nodes([str(prompt_id)], "the reward function's prompt id")  # unknown: refused now
                row = {"id": str(prompt_id), "reward": float(reward),
                       "score": float(reward if score is None else score)}
                with open(self.folder / "pending.jsonl", "a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
                return self._maybe_close()
        except GraphdiffError as exc:
            if not error.exists():
                atomic_write_text(error, f"{exc}\n")
                print(f"graphdiff (OpenRLHF recorder): {exc}", file=sys.stderr, flush=True)
            raise

    # -- under the lock ------------------------------------------------------------------------------

    def _pending(self) -> list[dict]:
        path = self.folder / "pending.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    def _episode(self) -> int:
        path = self.folder / "episode.json"
        return int(json.loads(path.read_text())["prompts"]) if path.exists() else 0

    def _maybe_close(self) -> int | None:
        rows = self._pending()
        groups: dict[str, list[dict]] = {}
        for r in rows:
            groups.setdefault(r["id"], []).append(r)
        over = [pid for pid, g in groups.items() if len(g) > self.n_samples]
        if over:
            raise DataError(f"prompt {over[0]!r} got {len(groups[over[0]])} rollouts in one wave, more than "
                            f"n_samples = {self.n_samples}: is GRAPHDIFF_N_SAMPLES the trainer's n_samples_per_prompt?")
        done = [pid for pid, g in groups.items() if len(g) == self.n_samples]
        passing = sum(self._passes(groups[pid]) for pid in done)
        episode = self._episode() + len(done)
        end_of_episode = self.episode_prompts is not None and episode >= self.episode_prompts
        if passing < self.batch_size and not end_of_episode:
            return None
        step = self.target.step + 1
        wave = [r for r in rows if r["id"] in set(done)]
        rest = [r for r in rows if r["id"] not in set(done)]
        # move the wave out of pending first: from here a crash leaves closing.json, applied exactly once
        atomic_write_text(self.folder / "closing.json", json.dumps({"step": step, "rows": wave}) + "\n")
        atomic_write_text(self.folder / "pending.jsonl", "".join(json.dumps(r) + "\n" for r in rest))
        atomic_write_text(self.folder / "episode.json", json.dumps({"prompts": 0 if end_of_episode else episode}))
        self._finish_closing()
        return step

    def _passes(self, group: list[dict]) -> bool:
        if self.filter_range is None:
            return True
        mean = float(np.mean([r["score"] for r in group]))
        return self.filter_range[0] < mean < self.filter_range[1]

    def _finish_closing(self) -> None:
        path = self.folder / "closing.json"
        if not path.exists():
            return
        closing = json.loads(path.read_text(encoding="utf-8"))
        step, cur = int(closing["step"]), self.target.step
        if cur == step - 1:  # the outcomes file step_<T>.jsonl stays in the folder; the STATE's log has its hash
            ids, n, s = count_outcomes([(0, r["id"], r["reward"]) for r in closing["rows"]], self.success_threshold)
            self.target.apply(step, ids, n, s)
        elif cur != step:
            raise StateError(f"{self.state} is at step {cur} but the wave being closed is step {step}: another "
                             "writer moved the STATE (one recorder folder per STATE and run)")
        path.unlink()
