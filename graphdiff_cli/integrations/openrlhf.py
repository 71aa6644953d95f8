"""graphdiff fed from OpenRLHF's custom reward function: rollouts counted into training steps, from any process.

OpenRLHF (checked against 0.11.2) loads ``--reward.remote_url reward_func.py`` in every vLLM engine (each a
Ray actor process) and calls ``reward_func(queries, prompts, labels)`` once per rollout, in worker threads,
several at a time; it passes no training step and no prompt id, and it swallows the function's exceptions
(the reward silently becomes None). Each training step consumes one generation wave: ``rollout.batch_size``
prompt groups of ``n_samples_per_prompt`` rollouts that pass dynamic filtering (a filtered group is
replaced by a fresh prompt), or fewer when the episode's prompts run out.

``StepRecorder.record(id, reward, score)`` is called by the reward function for each training rollout (the
id travels in the data set's label field, e.g. as JSON: ``parse_label``). Every call, from every process
and thread, appends the rollout under one file lock to ``<STATE>.openrlhf/pending-<T>.jsonl`` (wave T's
file; each process reads only the lines added since its last call); the call that completes the
wave - ``batch_size`` complete groups that pass the filter (strictly ``lo < mean score < hi``, as OpenRLHF
filters), or ``episode_prompts`` groups in the episode - applies every complete group of the wave (the
filtered ones too: they are outcomes of the same policy) as exactly one STATE step, T = the STATE's step
+ 1. The close is first written, atomically, as ``closing.json`` (the wave's rollouts, the rollouts that
belong to the next wave, the episode count) and then carried out idempotently (next wave's file, episode
count, the STATE step if the STATE is not yet at T, this wave's file removed), so a crash at any point
leaves the wave applied exactly once: the next call finds ``closing.json`` and finishes it.

A failure (an id not in the STATE, a group with more than n rollouts, a STATE moved by someone else, or
anything unexpected) is raised, written in one line to ``<STATE>.openrlhf/ERROR`` and printed on stderr, and every later call raises it again
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
from ..io.outcomes import THRESHOLD_HINT, check_threshold, is_binary
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
                 success_threshold: float | None = None, folder=None, device: str | None = "cpu", durable: bool = True):
        self.state = Path(state)
        self.batch_size, self.n_samples = int(batch_size), int(n_samples)
        if self.batch_size < 1 or self.n_samples < 1:
            raise InvalidArgumentError(f"batch_size and n_samples must be >= 1, got {batch_size}, {n_samples}")
        self.filter_range = None if filter_range is None else tuple(float(x) for x in filter_range)
        if self.filter_range is not None and (len(self.filter_range) != 2 or
                                              not self.filter_range[0] < self.filter_range[1]):
            raise InvalidArgumentError(f"filter_range must be two numbers lo < hi, got {filter_range!r}")
        self.episode_prompts = None if episode_prompts in (None, 0, "") else int(episode_prompts)
        self.success_threshold = check_threshold(success_threshold)  # None: 0/1 rewards only
        self.folder = Path(folder) if folder else self.state.parent / f"{self.state.name}.openrlhf"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.target = StateTarget(self.state, outcomes_dir=self.folder, device=device, durable=durable)
        self._ids: set[str] | None = None
        self._cache: tuple[str, int, dict] | None = None  # (pending file, bytes read, rollouts by prompt)

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
            with file_lock(self.folder / "lock", timeout=3600.0, record_pid=True,
                           busy=lambda holder: f"{self.folder}/lock held by pid {holder} for an hour"):
                if error.exists():
                    raise StateError(f"graphdiff's OpenRLHF recorder stopped earlier: {error.read_text().strip()} "
                                     f"(remove {error} once fixed)")
                self._finish_closing()
                pid = self._known(str(prompt_id))
                if self.success_threshold is None and not is_binary(float(reward)):  # refused at once, not at the close
                    raise DataError(f"prompt {pid!r} got reward {float(reward):g}, not 0 or 1; set "
                                    f"GRAPHDIFF_SUCCESS_THRESHOLD ({THRESHOLD_HINT.split(': ', 1)[1]})")
                row = {"id": pid, "reward": float(reward), "score": float(reward if score is None else score)}
                self._append(row)
                return self._maybe_close()
        except Exception as exc:  # noqa: BLE001 - OpenRLHF hides whatever the reward function raises
            if not error.exists():
                line = " ".join(f"{type(exc).__name__}: {exc}".split()) if not isinstance(exc, GraphdiffError) \
                    else " ".join(str(exc).split())
                atomic_write_text(error, f"{line}\n")
                print(f"graphdiff (OpenRLHF recorder): {line}", file=sys.stderr, flush=True)
            raise

    # -- under the lock ------------------------------------------------------------------------------

    def _known(self, pid: str) -> str:
        """The id, refused unless the STATE has it (the id set is re-read once on a miss: extend adds ids)."""
        if self._ids is None or pid not in self._ids:
            self._ids = set(self.target.ids)
            if pid not in self._ids:
                self.target.nodes([pid], "the reward function's prompt id")  # raises the usual one-line error
        return pid

    def _pending_path(self, step: int) -> Path:
        return self.folder / f"pending-{step:08d}.jsonl"  # the rollouts of wave `step` recorded so far

    def _append(self, row: dict) -> None:
        path = self._pending_path(self.target.step + 1)
        with open(path, "ab+") as f:
            size = f.seek(0, os.SEEK_END)
            if size and os.pread(f.fileno(), 1, size - 1) != b"\n":
                # an append cut short by a crash left a last line without its newline: drop it (rare, so
                # only then is the file read)
                f.seek(0)
                f.truncate(f.read().rfind(b"\n") + 1)
            f.write((json.dumps(row) + "\n").encode())

    def _groups(self) -> dict[str, list[dict]]:
        """The current wave's rollouts by prompt, read incrementally: this process remembers how far it read
        (a wave's file only grows; the next wave has a file of its own), so a call costs its new lines."""
        path = self._pending_path(self.target.step + 1)
        if self._cache is None or self._cache[0] != path.name:
            self._cache = (path.name, 0, {})
        _, offset, groups = self._cache
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            data = b""
        end = data.rfind(b"\n") + 1  # a partial last line is not a rollout (yet)
        for line in data[:end].splitlines():
            if line.strip():
                r = json.loads(line)
                groups.setdefault(r["id"], []).append(r)
        self._cache = (path.name, offset + end, groups)
        return groups

    def _episode(self) -> int:
        path = self.folder / "episode.json"
        return int(json.loads(path.read_text())["prompts"]) if path.exists() else 0

    def _maybe_close(self) -> int | None:
        groups = self._groups()
        over = [pid for pid, g in groups.items() if len(g) > self.n_samples]
        if over:
            raise DataError(f"prompt {over[0]!r} got {len(groups[over[0]])} rollouts in one wave, more than "
                            f"n_samples = {self.n_samples}: is GRAPHDIFF_N_SAMPLES the trainer's n_samples_per_prompt?")
        done = {pid for pid, g in groups.items() if len(g) == self.n_samples}
        passing = sum(self._passes(groups[pid]) for pid in done)
        episode = self._episode() + len(done)
        end_of_episode = self.episode_prompts is not None and episode >= self.episode_prompts
        if passing < self.batch_size and not end_of_episode:
            return None
        step = self.target.step + 1
        wave = [r for pid in done for r in groups[pid]]
        rest = [r for pid, g in groups.items() if pid not in done for r in g]
        # one atomic file says everything the close does; _finish_closing carries it out and is idempotent,
        # so a crash at any point leaves the wave applied exactly once and the rest pending for the next wave
        atomic_write_text(self.folder / "closing.json", json.dumps(
            {"step": step, "rows": wave, "rest": rest, "episode": 0 if end_of_episode else episode}) + "\n")
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
        if cur not in (step - 1, step):
            raise StateError(f"{self.state} is at step {cur} but the wave being closed is step {step}: another "
                             "writer moved the STATE (one recorder folder per STATE and run)")
        nxt = self._pending_path(step + 1)  # the rollouts of the next wave that were already in this one's file
        if not nxt.exists() or cur == step - 1:
            atomic_write_text(nxt, "".join(json.dumps(r) + "\n" for r in closing["rest"]))
        atomic_write_text(self.folder / "episode.json", json.dumps({"prompts": int(closing["episode"])}))
        if cur == step - 1:  # the outcomes file step_<T>.jsonl stays in the folder; the STATE's log has its hash
            ids, n, s = count_outcomes([(0, r["id"], r["reward"]) for r in closing["rows"]], self.success_threshold)
            self.target.apply(step, ids, n, s)
        self._pending_path(step).unlink(missing_ok=True)
        self._cache = None
        path.unlink()
