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

``PromptChooser`` is the other direction: installed in the trainer process by ``install`` (Ray's job-level
``worker_process_setup_hook``), it replaces the loader ``openrlhf.trainer.ppo_trainer.prepare_datasets`` returns,
so every prompt OpenRLHF generates - a wave's B and each replacement for a filtered group - is graphdiff's choice.

A failure (an id not in the STATE, a group with more than n rollouts, a STATE moved by someone else, or
anything unexpected) is raised, written in one line to ``<STATE>.openrlhf/ERROR`` and printed on stderr, and every later call raises it again
until the file is removed: OpenRLHF would otherwise hide it.

Every row is checked where it is read - a wave's file and a close's rows alike: a JSON object with a string or
number id the STATE has, finite numeric reward and score (0 or 1 without a success threshold), and the run
field of this recorder. A row that is not is set aside in ``rejected-<T>.jsonl`` (where it was, why, its text)
and named by file and line on stderr once, and is never counted or carried into a close; a ``closing.json``
that is not a close at all is refused, naming it, until it is removed. Runs are told apart by ``run_id()``: a
recorder without one cannot tell a crashed run's rollouts from another process's of its own, so its first
call refuses, in one line and changing nothing, a wave file or close it finds already begun.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import json
import math
import os
import sys
from collections import deque
from pathlib import Path

import numpy as np

from ..core import decisions as dec
from ..errors import DataError, GraphdiffError, InvalidArgumentError, StateError
from ..io.atomic import append_nofollow, atomic_write_text, make_dirs, open_nofollow
from ..io.locks import file_lock
from ..io.outcomes import THRESHOLD_REASON, check_threshold, is_binary
from ..io.tables import unique_keys
from .dynamic_sampling import DEFAULT_EXPLORE, DS_MODES, CandidateDraw
from .options import Option, as_float, as_int, read_options
from .tracking import BatchChooser, StateTarget, count_outcomes, resume_mismatch

ENV = {"state": "GRAPHDIFF_STATE", "batch_size": "GRAPHDIFF_BATCH_SIZE", "n_samples": "GRAPHDIFF_N_SAMPLES",
       "filter_range": "GRAPHDIFF_FILTER_RANGE", "episode_prompts": "GRAPHDIFF_EPISODE_PROMPTS",
       "success_threshold": "GRAPHDIFF_SUCCESS_THRESHOLD"}
# the recorder's settings, as the environment gives them (text; StepRecorder checks them)
RECORDER_OPTIONS = {key: Option(env=var) for key, var in ENV.items()}


def run_id() -> str | None:
    """This training run's identity, shared by all its processes and new for a restarted run:
    ``GRAPHDIFF_RUN_ID`` when set, else the Ray job id (OpenRLHF's vLLM engines are actors of the job; a
    resumed run is a new job), else None (then rollouts left by a crashed run cannot be told apart)."""
    if os.environ.get("GRAPHDIFF_RUN_ID"):
        return os.environ["GRAPHDIFF_RUN_ID"]
    ray = sys.modules.get("ray")  # never imported here: only a process that runs under Ray has it
    try:
        if ray is not None and ray.is_initialized():
            return str(ray.get_runtime_context().get_job_id())
    except Exception:  # noqa: BLE001 - a Ray without a runtime context is a run without an identity
        return None
    return None


def recorder_folder(state, folder=None) -> Path:
    """The recorder's folder next to the STATE (``<STATE>.openrlhf``), shared with the prompt chooser."""
    state = Path(state)
    return Path(folder) if folder else state.parent / f"{state.name}.openrlhf"


def parse_label(label) -> tuple[str, dict]:
    """(prompt id, the label's other fields) from a label holding JSON with an "id" (or a dict)."""
    meta = label if isinstance(label, dict) else None
    if meta is None:
        try:
            meta = json.loads(label, object_pairs_hook=unique_keys)
        except DataError as exc:  # {"id": "p1", "id": "p2"}: which prompt is it?
            raise DataError(f"the label {str(label)[:80]!r}: {exc}") from None
        except (TypeError, ValueError, RecursionError):
            meta = None
    if not isinstance(meta, dict) or "id" not in meta:
        raise DataError(f"the label {str(label)[:80]!r} holds no JSON object with an \"id\": put each prompt's id "
                        "into the data set's label field, e.g. {\"id\": \"p17\", \"answer\": \"42\"}")
    return str(meta["id"]), meta


def _finite(value, what: str) -> float:
    """``value`` as a finite float (a bool is 0 or 1), else a one-line DataError starting with ``what``."""
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        x = math.nan
    if not math.isfinite(x):
        raise DataError(f"{what} {_show(value)}, not a finite number")
    return x


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class StepRecorder:
    """Rollouts from OpenRLHF's reward function -> one graphdiff step per training step (see the module)."""

    def __init__(self, state, *, batch_size: int, n_samples: int, filter_range=None, episode_prompts=None,
                 success_threshold: float | None = None, folder=None, device: str | None = "cpu", durable: bool = True,
                 run: str | None = None):
        self.state = Path(state)
        self.run = run if run is not None else run_id()  # every rollout is tagged with it
        self.batch_size, self.n_samples = int(batch_size), int(n_samples)
        if self.batch_size < 1 or self.n_samples < 1:
            raise InvalidArgumentError(f"batch_size and n_samples must be >= 1, got {batch_size}, {n_samples}")
        self.filter_range = None if filter_range is None else tuple(float(x) for x in filter_range)
        if self.filter_range is not None and (len(self.filter_range) != 2 or
                                              not self.filter_range[0] < self.filter_range[1]):
            raise InvalidArgumentError(f"filter_range must be two numbers lo < hi, got {filter_range!r}")
        self.episode_prompts = None if episode_prompts in (None, 0, "") else int(episode_prompts)
        self.success_threshold = check_threshold(success_threshold)  # None: 0/1 rewards only
        self.folder, self.durable = recorder_folder(self.state, folder), durable
        make_dirs(self.folder, durable)
        self.target = StateTarget(self.state, outcomes_dir=self.folder, device=device, durable=durable)
        self._ids: set[str] | None = None
        self._cache: tuple[str, int, int, dict] | None = None  # (pending file, bytes, lines read, rollouts by id)
        self._rejected: dict[str, tuple[int, set]] = {}  # rejected-<T>.jsonl -> (bytes read, (where, text) in it)
        self._mine: tuple[str, int] | None = None  # (pending file, inode) known to hold this run's rollouts
        self._episode_cache: tuple[tuple, dict[int, int]] | None = None  # (episode.json's stat, its counts)
        self._started = False  # whether this recorder's first call found nothing it cannot place (run-less only)

    @classmethod
    def from_env(cls, **overrides) -> StepRecorder:
        """Settings from GRAPHDIFF_STATE, _BATCH_SIZE (rollout.batch_size), _N_SAMPLES
        (rollout.n_samples_per_prompt), _FILTER_RANGE ("lo,hi" when dynamic filtering is on),
        _EPISODE_PROMPTS (prompts per episode, for its short last step) and _SUCCESS_THRESHOLD."""
        kw = {key: [float(x) for x in value.split(",")] if key == "filter_range" else value
              for key, value in read_options(RECORDER_OPTIONS).items() if value is not None and key not in overrides}
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
                self._check_start()
                self._finish_closing()
                pid = self._known(str(prompt_id))
                reward = _finite(reward, f"prompt {pid!r} got reward")  # refused at once, not at the close
                score = reward if score is None else _finite(score, f"prompt {pid!r} got score")
                if self.success_threshold is None and not is_binary(reward):
                    raise DataError(f"prompt {pid!r} got reward {reward:g}, not 0 or 1; set "
                                    f"GRAPHDIFF_SUCCESS_THRESHOLD ({THRESHOLD_REASON})")
                row = {"id": pid, "reward": reward, "score": score}
                if self.run is not None:
                    row["run"] = self.run
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

    def _is_known(self, pid: str) -> bool:
        if self._ids is None or pid not in self._ids:
            self._ids = set(self.target.ids)
        return pid in self._ids

    def _check_start(self) -> None:
        """A recorder without a run id (no GRAPHDIFF_RUN_ID, no Ray job) writes rollouts that say nothing of who
        wrote them, so at its first call it cannot tell a wave begun by a crashed run from one begun by another
        process of its own: rather than take them into its wave, it refuses in one line, changing nothing."""
        if self.run is not None or self._started:
            return
        found = [p.name for p in (self.folder / "closing.json",) if p.exists()]
        path = self._pending_path(self.target.step + 1)
        try:
            with os.fdopen(open_nofollow(path, os.O_RDONLY), "rb") as f:  # a link there is refused, not read
                data = f.read()
        except FileNotFoundError:
            data = b""
        if data[:data.rfind(b"\n") + 1].strip():
            found.append(path.name)
        if found:
            raise StateError(
                f"graphdiff's OpenRLHF recorder has no run id (GRAPHDIFF_RUN_ID unset, no Ray job) and found "
                f"{' and '.join(found)} in {self.folder} already begun: rollouts of a crashed run or of another "
                "process of this one, it cannot tell which; set GRAPHDIFF_RUN_ID (one value for every process of a "
                f"run, new for each restart), or delete {' and '.join(found)} if no process of this run wrote them")
        self._started = True

    def _row(self, row, owner: str | None) -> tuple[dict | None, str]:
        """(the rollout, "") for a row this recorder would have written for run ``owner``, else (None, why)."""
        if not isinstance(row, dict):
            return None, f"not a JSON object but {type(row).__name__}"
        pid = row.get("id")
        if isinstance(pid, bool) or not isinstance(pid, (str, int, float)):
            return None, "no \"id\"" if pid is None else f"its \"id\" {_show(pid)} is not a string or a number"
        pid = str(pid)
        if not self._is_known(pid):
            return None, f"unknown prompt id {pid!r} (not in {self.state})"
        got = {}
        for key in ("reward", "score"):
            x = row.get(key, got.get("reward")) if key == "score" else row.get(key)
            try:
                ok = isinstance(x, (int, float)) and math.isfinite(x)  # a bool is 0 or 1, as record() takes it
            except OverflowError:  # an integer too large for a float
                ok = False
            if not ok:
                return None, f"its \"{key}\" {_show(x)} is not a finite number"
            got[key] = float(x)
        if self.success_threshold is None and not is_binary(got["reward"]):
            return None, f"reward {got['reward']:g} is not 0 or 1 and no GRAPHDIFF_SUCCESS_THRESHOLD is set"
        run = row.get("run")
        if run != owner:
            mine = f"this run's ({owner})" if owner is not None else "this recorder has none"
            return None, f"its \"run\" is {_show(run)}, {mine}: another run's rollout"
        out = {"id": pid, **got}
        if run is not None:
            out["run"] = run
        return out, ""

    def _reject(self, wave: int, where: str, text: str, why: str) -> None:
        """A row that is not a rollout, set aside in ``rejected-<wave>.jsonl`` (its place, why, its text) and said
        on stderr once, however many processes read it: never counted, never carried into a close."""
        path = self.folder / f"rejected-{wave:08d}.jsonl"
        offset, seen = self._rejected.get(path.name, (0, set()))
        try:  # what any process set aside since this one last looked (read incrementally: it only grows)
            with os.fdopen(open_nofollow(path, os.O_RDONLY), "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            data = b""
        end = data.rfind(b"\n") + 1
        for line in data[:end].split(b"\n")[:-1]:
            try:
                old = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(old, dict) and isinstance(old.get("where"), str) and isinstance(old.get("text"), str):
                seen.add((old["where"], old["text"]))
        self._rejected[path.name] = (offset + end, seen)
        if (where, text) in seen:
            return
        entry = {"where": where, "reason": why, "text": text}
        append_nofollow(path, (json.dumps(entry) + "\n").encode(), durable=self.durable, create=True, drop_torn=True)
        seen.add((where, text))
        print(f"graphdiff (OpenRLHF recorder): {where}: {why}; set aside in {path.name}, not counted",
              file=sys.stderr, flush=True)

    def _pending_path(self, step: int) -> Path:
        return self.folder / f"pending-{step:08d}.jsonl"  # the rollouts of wave `step` recorded so far

    def _set_aside_stale(self, path: Path, force: bool = False) -> None:
        """A wave's file begun by another run (a crashed one: the resumed run generates that wave afresh) is
        renamed to ``stale-<file>`` - kept for inspection, never mixed into this run's wave. ``force``: whoever
        began it (the file of a wave a crashed run's close already applied)."""
        try:
            with open(path, "rb") as f:
                first, ino = f.readline(), os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            return
        if not force and (self._mine == (path.name, ino) or not first.strip()):
            return
        try:
            doc = json.loads(first)
        except (ValueError, RecursionError):
            doc = None
        owner = doc.get("run") if isinstance(doc, dict) else None
        owner = owner if isinstance(owner, str) else None  # a row that names no run: begun by an unknown one
        if owner == self.run and not force:
            self._mine = (path.name, ino)
            return
        stale = path.with_name(f"stale-{owner or 'unknown'}-{path.name}".replace(os.sep, "_"))
        os.replace(path, stale)
        self._cache = None
        if not force:
            print(f"graphdiff (OpenRLHF recorder): {path.name} was begun by another run ({owner or 'unnamed'}), "
                  f"a crashed one; its rollouts are set aside as {stale.name}, not mixed into this run's wave",
                  file=sys.stderr, flush=True)

    def _append(self, row: dict) -> None:
        path = self._pending_path(self.target.step + 1)
        if self.run is not None:
            self._set_aside_stale(path)
        # never through a link; a last line a crash cut short is dropped first; fsynced before the reward call
        # returns (OpenRLHF never sends the rollout again)
        append_nofollow(path, (json.dumps(row) + "\n").encode(), durable=self.durable, create=True, drop_torn=True)

    def _groups(self) -> dict[str, list[dict]]:
        """The current wave's rollouts by prompt, read incrementally: this process remembers how far it read
        (a wave's file only grows; the next wave has a file of its own), so a call costs its new lines."""
        wave = self.target.step + 1
        path = self._pending_path(wave)
        if self._cache is None or self._cache[0] != path.name:
            self._cache = (path.name, 0, 0, {})
        _, offset, lineno, groups = self._cache
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            data = b""
        end = data.rfind(b"\n") + 1  # a partial last line is not a rollout (yet)
        for line in data[:end].split(b"\n")[:-1]:
            lineno += 1
            if not line.strip():
                continue
            try:
                r, why = self._row(json.loads(line, object_pairs_hook=unique_keys), self.run)
            except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, a key twice
                r, why = None, f"not JSON ({' '.join(str(exc).split())[:120]})"
            if r is None:
                self._reject(wave, f"{path.name} line {lineno}", line.decode("utf-8", "replace"), why)
            else:
                groups.setdefault(r["id"], []).append(r)
        self._cache = (path.name, offset + end, lineno, groups)
        return groups

    def _episodes(self) -> dict[int, int]:
        """The count of the episode's prompts after each wave, by STATE step (``episode.json``): a resumed run
        whose STATE was rolled back to its checkpoint's step reads that step's count, not the crashed run's.
        Parsed once per version of the file (it is read at every rollout, under the lock)."""
        path = self.folder / "episode.json"
        try:
            st = path.stat()
        except FileNotFoundError:
            return {}
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._episode_cache is None or self._episode_cache[0] != key:
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
                if "by_step" in doc:
                    counts = {int(k): int(v) for k, v in doc["by_step"].items()}
                else:  # written before 2026-11-27: one count, taken as the current step's
                    counts = {self.target.step: int(doc["prompts"])}
            except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as exc:
                raise DataError(f"{path}: damaged episode count ({exc.__class__.__name__}); remove it to go on (the "
                                "episode's prompt count then starts again from this wave)") from None
            self._episode_cache = (key, counts)
        return self._episode_cache[1]

    def _episode(self) -> int:
        """The count at the STATE's step, or at the latest step below it that a recorder closed (a step applied
        by someone else, e.g. ``graphdiff update``, carries the count on); 0 before any: a new episode."""
        step, counts = self.target.step, self._episodes()
        below = [t for t in counts if t <= step]
        return counts[max(below)] if below else 0

    def _write_episode(self, step: int, prompts: int) -> None:
        """The count after wave ``step``, with the count each step the STATE keeps would read after a rollback
        to it (its own, or the latest below it); the others are dropped, so the file stays as small as the
        retention, however long the run."""
        counts = {t: v for t, v in self._episodes().items() if t < step}  # those above were rolled back
        kept = {}
        for r in self.target.state.dir.retained_steps():
            if below := [t for t in counts if t <= r]:
                kept[max(below)] = counts[max(below)]
        kept[step] = int(prompts)
        atomic_write_text(self.folder / "episode.json",
                          json.dumps({"by_step": {str(t): v for t, v in sorted(kept.items())}}))

    def _maybe_close(self) -> int | None:
        groups = self._groups()
        over = [pid for pid, g in groups.items() if len(g) > self.n_samples]
        if over:
            hint = "" if self.run is not None else (
                " (or rollouts of a crashed run are in the wave's file: set GRAPHDIFF_RUN_ID per run)")
            raise DataError(f"prompt {over[0]!r} got {len(groups[over[0]])} rollouts in one wave, more than "
                            f"n_samples = {self.n_samples}: is GRAPHDIFF_N_SAMPLES the trainer's "
                            f"n_samples_per_prompt?{hint}")
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

    def _read_closing(self, path: Path) -> dict:
        """closing.json, its shape checked: a file that is not a close is named, with what to do."""
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, RecursionError) as exc:
            doc, why = None, f"not JSON: {' '.join(str(exc).split())[:120]}"
        else:
            why = "not a JSON object with an integer \"step\" >= 1, lists \"rows\" and \"rest\", an integer \"episode\""
        if (isinstance(doc, dict) and isinstance(doc.get("rows"), list) and isinstance(doc.get("rest"), list)
                and all(isinstance(doc.get(k), int) and not isinstance(doc.get(k), bool) for k in ("step", "episode"))
                and doc["step"] >= 1 and doc["episode"] >= 0):
            return doc
        raise DataError(f"{path} is not a close this recorder can carry out ({why}): remove it to go on (a wave it "
                        "had not applied is closed again from its pending-<T>.jsonl)")

    def _passes(self, group: list[dict]) -> bool:
        if self.filter_range is None:
            return True
        mean = float(np.mean([r["score"] for r in group]))
        return self.filter_range[0] < mean < self.filter_range[1]

    def _finish_closing(self) -> None:
        path = self.folder / "closing.json"
        if not path.exists():
            return
        closing = self._read_closing(path)
        step, cur = closing["step"], self.target.step
        owners = {r.get("run") for r in closing["rows"] + closing["rest"]
                  if isinstance(r, dict) and isinstance(r.get("run"), (str, type(None)))}
        if self.run is not None and owners and self.run not in owners:
            # a crashed run's close: that run never trained on the wave (the close happens inside the reward call
            # of its last rollout), so the run resumed from a checkpoint generates it afresh - applying the old
            # close too would count the wave twice. Set aside like its pending files; where the close had
            # already moved the STATE, that step stays (the chooser's resume check refuses it) with its count
            owner = sorted(str(o) for o in owners)[0] if len(owners) == 1 else "unknown"
            stale = path.with_name(f"stale-{owner}-closing-{step:08d}.json".replace(os.sep, "_"))
            applied = ""
            if cur == step:  # its wave is in the STATE as step T: keep that step's count; its wave file is done
                self._write_episode(step, closing["episode"])
                self._set_aside_stale(self._pending_path(step), force=True)
                applied = (f" (it had applied its wave as step {step}: a run resumed from an earlier checkpoint must "
                           f"roll the STATE back to it, as the prompt chooser's resume check says)")
            os.replace(path, stale)
            print(f"graphdiff (OpenRLHF recorder): the close of wave {step} was begun by another run ({owner}), a "
                  f"crashed one; set aside as {stale.name}, never applied by this run{applied}. (GRAPHDIFF_RUN_ID, "
                  "when set, must be new for each restart.)", file=sys.stderr, flush=True)
            return
        if cur not in (step - 1, step):
            raise StateError(f"{self.state} is at step {cur} but the wave being closed is step {step}: another "
                             "writer moved the STATE (one recorder folder per STATE and run)")
        for key in ("rows", "rest"):  # a row that is not a rollout (an older version copied them unchecked)
            kept = []
            for k, r in enumerate(closing[key]):
                good, why = self._row(r, self.run)
                if good is None:
                    self._reject(step, f"{path.name} {key}[{k}]", json.dumps(r), why)
                else:
                    kept.append(good)
            closing[key] = kept
        nxt = self._pending_path(step + 1)  # the rollouts of the next wave that were already in this one's file
        if not nxt.exists() or cur == step - 1:
            atomic_write_text(nxt, "".join(json.dumps(r) + "\n" for r in closing["rest"]))
        self._write_episode(step, closing["episode"])
        if cur == step - 1:  # the outcomes file step_<T>-<hash>.jsonl stays in the folder; the STATE's log has its hash
            ids, n, s = count_outcomes([(0, r["id"], r["reward"]) for r in closing["rows"]], self.success_threshold)
            self.target.apply(step, ids, n, s)
        self._pending_path(step).unlink(missing_ok=True)
        self._cache = None
        path.unlink()


# ----------------------------------------------------------------------------------------------------
# what OpenRLHF generates: graphdiff's choice in place of the prompt loader's shuffle

# the chooser's own settings (the recorder's too: RECORDER_OPTIONS); choose's default: prefilter when OpenRLHF's
# dynamic filtering is on, else target
CHOOSE_OPTIONS = {"choose": Option(env="GRAPHDIFF_CHOOSE"),
                  "pool_factor": Option(4.0, as_float, "GRAPHDIFF_POOL_FACTOR"),
                  "seed": Option(0, as_int, "GRAPHDIFF_SEED"), "target_p": Option(0.5, as_float, "GRAPHDIFF_TARGET"),
                  "min_keep": Option(DEFAULT_EXPLORE, as_float, "GRAPHDIFF_PREFILTER_MIN_KEEP")}
TRAINER_MODULE = "openrlhf.trainer.ppo_trainer"  # defines prepare_datasets; PPOTrainer.__init__ calls it


class PromptChooser:
    """OpenRLHF's prompt data loader, each prompt chosen by graphdiff when the trainer asks for it.

    OpenRLHF 0.11's ``SamplesGenerator`` draws a wave's ``rollout.batch_size`` prompts with ``next()`` on
    ``iter(prompts_dataloader)`` (batches of one row, ``PromptDataset.collate_fn``'s shape) and, with dynamic
    filtering, one more ``next()`` for each filtered group. This object is that loader: ``next()`` returns
    graphdiff's choice. A new wave is recognised by the STATE's step (the reward function's ``StepRecorder``
    applies wave t as step t before its last rollout returns, so wave t + 1 starts with the STATE at t):

    * with dynamic filtering (``choose`` = "prefilter" or "uniform"): the wave's prompts are drawn by
      ``dynamic_sampling.CandidateDraw`` - GRESO's pre-filter, each candidate skipped before generation with
      probability min(p_zero_variance, 1 - ``min_keep``), or plain uniform draws - and every replacement for
      a filtered group is one more such draw; no prompt is generated twice in a wave;
    * without (``choose`` = a ``select`` strategy): the wave is ``tracking.BatchChooser``'s choice, B of a
      random pool of ``pool_factor`` x B by the strategy.

    Draws are seeded by (seed, STATE step, draw number in the wave). An episode is ``len(dataset)`` prompts
    handed out, as with OpenRLHF's own loader (its step count, learning-rate schedule and progress bar
    assume it); prompts may come back within an episode. ``state_dict``/``load_state_dict`` carry the position
    in the episode through OpenRLHF's checkpoints. ``dispatches`` lists every draw (for tests and logs).
    """

    def __init__(self, dataset, state, *, batch_size: int, n_samples: int, choose: str, filtering: bool,
                 pool_factor: float = 4.0, seed: int = 0, target_p: float = 0.5, min_keep: float = DEFAULT_EXPLORE,
                 collate_fn=None, folder=None, device: str | None = "cpu"):
        self.dataset, self.collate_fn = dataset, collate_fn or dataset.collate_fn
        self.batch_size, self.n_samples = dec.check_int(batch_size, "batch size", 1), dec.check_int(n_samples, "n_samples", 1)
        self.filtering, self.seed = bool(filtering), int(seed)
        allowed = DS_MODES if self.filtering else dec.SELECT_STRATEGIES
        if choose not in allowed:
            raise InvalidArgumentError(
                f"GRAPHDIFF_CHOOSE={choose!r} is not one of {', '.join(allowed)} "
                f"({'with' if self.filtering else 'without'} dynamic filtering)")
        self.choose = choose
        ids = []
        for r, label in enumerate(dataset.labels):
            pid, meta = parse_label(label)
            if meta.get("eval"):
                raise DataError(f"training prompt row {r} ({pid!r}) is marked \"eval\": the recorder would not "
                                "record it, so graphdiff could not learn from what it chose")
            ids.append(pid)
        if len(set(ids)) != len(ids):
            dup = next(i for i in ids if ids.count(i) > 1)
            raise DataError(f"prompt id {dup!r} is on several rows of OpenRLHF's prompt data set: one id per row")
        self.row_ids = ids
        self.folder = recorder_folder(state, folder)
        self.target = StateTarget(state, device=device)
        nodes = self.target.nodes(ids, "OpenRLHF's prompt data set (the label's id)")
        self._nodes, self._min_keep = nodes, min_keep
        if self.filtering:
            CandidateDraw(self.target, nodes, self.batch_size, self.n_samples, choose, min_keep)  # checks settings
        else:
            self._chooser = BatchChooser(self.target, nodes, self.batch_size, choose, pool_factor, self.seed,
                                         target_p, self.n_samples)
        self.dispatches: list[dict] = []
        self._pos = 0  # prompts handed out in the current episode
        self._wave: int | None = None
        self._queue: deque[int] = deque()
        self._generated: set[int] = set()

    @classmethod
    def from_trainer(cls, dataset, args, **overrides) -> PromptChooser:
        """From the environment (GRAPHDIFF_*, as the recorder) checked against OpenRLHF's ``args``: refused in
        one line when they disagree or the run is one this chooser does not follow."""
        env = {k: v for k, v in read_options(RECORDER_OPTIONS).items() if v is not None}
        env.update(overrides)
        if "state" not in env:
            raise InvalidArgumentError("set GRAPHDIFF_STATE for graphdiff's OpenRLHF prompt chooser")
        if getattr(args.train, "async_enable", False):
            raise InvalidArgumentError("graphdiff's prompt chooser follows OpenRLHF's synchronous trainer only: "
                                       "drop --train.async_enable (its generator runs waves ahead of the STATE)")
        if getattr(args.train, "agent_func_path", None):
            raise InvalidArgumentError("graphdiff's prompt chooser needs the reward function file's recorder; "
                                       "--train.agent_func_path runs no reward function file")
        b, n = int(args.rollout.batch_size), int(args.rollout.n_samples_per_prompt)
        for key, want in (("batch_size", b), ("n_samples", n), ("episode_prompts", len(dataset))):
            if key in env and int(env[key]) != want:
                raise InvalidArgumentError(f"{ENV[key]}={env[key]} but the trainer's value is {want}: set it to {want}")
        filtering = bool(args.algo.dynamic_filtering_enable)
        if filtering:
            lo, hi = (float(x) for x in args.algo.dynamic_filtering_range)
            got = [float(x) for x in str(env.get("filter_range", "")).split(",") if x.strip()]
            if got != [lo, hi]:
                raise InvalidArgumentError(f"dynamic filtering is on with range ({lo:g}, {hi:g}): set "
                                           f"GRAPHDIFF_FILTER_RANGE={lo:g},{hi:g} (got {env.get('filter_range')!r})")
        elif env.get("filter_range"):
            raise InvalidArgumentError("GRAPHDIFF_FILTER_RANGE is set but --algo.dynamic_filtering_enable is not")
        if "episode_prompts" not in env:
            raise InvalidArgumentError(f"set GRAPHDIFF_EPISODE_PROMPTS={len(dataset)} (the trainer's prompt count)")
        kw = read_options(CHOOSE_OPTIONS, {k: overrides[k] for k in CHOOSE_OPTIONS if k in overrides})
        kw["choose"] = kw["choose"] or ("prefilter" if filtering else "target")
        return cls(dataset, env["state"], batch_size=b, n_samples=n, filtering=filtering, **kw)

    # -- OpenRLHF's view: a StatefulDataLoader of batches of one row ---------------------------------

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self):
        while self._pos < len(self.dataset):
            row = self._next_row()
            self._pos += 1
            yield self.collate_fn([self.dataset[row]])
        self._pos, self._wave, self._queue = 0, None, deque()  # the episode is over; the next iter() starts one

    def state_dict(self) -> dict:
        """The position in the episode and the STATE step a resumed run must find (OpenRLHF checkpoints
        after training on a wave, which the recorder applied before its last rollout returned)."""
        return {"graphdiff_prompt_chooser": {"position": self._pos, "prompts": len(self.dataset),
                                             "state_step": int(self.target.step)}}

    def load_state_dict(self, state: dict) -> None:
        mine = state.get("graphdiff_prompt_chooser") if isinstance(state, dict) else None
        if mine is None:
            raise StateError("the checkpoint's data loader state was not written by graphdiff's prompt chooser "
                             "(a run started without it): resume it without the chooser or start afresh")
        if int(mine["prompts"]) != len(self.dataset):
            raise StateError(f"the checkpoint's prompt data set had {mine['prompts']} prompts, this one "
                             f"{len(self.dataset)}")
        want = mine.get("state_step")  # absent in a checkpoint written before graphdiff recorded it
        if want is not None and int(want) != self.target.step:
            raise StateError(resume_mismatch(self.target.step, int(want), "OpenRLHF's checkpoint"))
        self._pos, self._wave, self._queue = int(mine["position"]), None, deque()

    # -- the choice ----------------------------------------------------------------------------------

    def _next_row(self) -> int:
        error = self.folder / "ERROR"
        if error.exists():  # the reward function's recorder stopped (OpenRLHF swallows its exceptions)
            raise StateError(f"graphdiff's OpenRLHF recorder stopped: {error.read_text().strip()} (remove {error} "
                             "once fixed)")
        step = self.target.step
        if step != self._wave:  # the recorder closed the previous wave: a new one starts
            self._wave, self._generated, self._queue = step, set(), deque()
            self._queue.extend(self._draw(step, min(self.batch_size, len(self.dataset) - self._pos)))
        if not self._queue:  # a replacement for a filtered group (OpenRLHF asks for one at a time)
            self._queue.extend(self._draw(step, 1))
        row = self._queue.popleft()
        self._generated.add(row)
        return row

    def _draw(self, step: int, k: int) -> list[int]:
        number = sum(1 for d in self.dispatches if d["step"] == step)
        skipped = []
        if not self.filtering:
            if number:
                raise StateError(f"OpenRLHF asked for more prompts in wave {step + 1} than its batch of "
                                 f"{self.batch_size} without dynamic filtering: is the reward function recording "
                                 "(GRAPHDIFF_* as in the trainer)?")
            rows = self._chooser.choose(step, 0)[:k]
        else:
            draw = CandidateDraw(self.target, self._nodes, k, self.n_samples, self.choose, self._min_keep).draw(
                [self.seed, step, number], exclude=self._generated | set(self._queue))
            rows, skipped = draw.chosen[:k], draw.skipped
            if len(rows) < k:
                raise StateError(f"every prompt was already generated in wave {step + 1} and OpenRLHF asks for "
                                 "more: is the reward function recording (the STATE stays at step "
                                 f"{step})?")
        rows = [int(r) for r in rows]
        self.dispatches.append({"step": step, "number": number, "rows": rows,
                                "ids": [self.row_ids[r] for r in rows],
                                "skipped": [self.row_ids[int(r)] for r in skipped]})
        return rows


def graphdiff_prepare_datasets(strategy, tokenizer):
    """OpenRLHF's ``prepare_datasets`` with the training loader replaced by a ``PromptChooser``."""
    loader, eval_loader, max_steps = _original_prepare_datasets()(strategy, tokenizer)
    return PromptChooser.from_trainer(loader.dataset, strategy.args), eval_loader, max_steps


_ORIGINAL: dict = {}


def _patch(module) -> None:
    current = getattr(module, "prepare_datasets", None)
    if current is None or not callable(current):
        raise InvalidArgumentError(f"{TRAINER_MODULE} has no prepare_datasets: this OpenRLHF version is not one "
                                   "graphdiff's prompt chooser knows (0.11.x)")
    if current is not graphdiff_prepare_datasets:
        _ORIGINAL["prepare_datasets"] = current
        module.prepare_datasets = graphdiff_prepare_datasets


def _original_prepare_datasets():
    if "prepare_datasets" not in _ORIGINAL:
        _patch(importlib.import_module(TRAINER_MODULE))
    return _ORIGINAL["prepare_datasets"]


class _PatchOnImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Patches ``openrlhf.trainer.ppo_trainer`` right after it is imported, in whichever process imports it."""

    def find_spec(self, name, path, target=None):
        if name != TRAINER_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                self._loader = spec.loader
                spec.loader = self
                return spec
        return None

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _patch(module)


def install() -> None:
    """Ray's ``worker_process_setup_hook``: in every process of the job, OpenRLHF's ``prepare_datasets`` is
    replaced by ``graphdiff_prepare_datasets`` when ``openrlhf.trainer.ppo_trainer`` is imported (at once if
    it already is). Imports nothing heavy: processes that never import the trainer pay nothing."""
    if TRAINER_MODULE in sys.modules:
        _patch(sys.modules[TRAINER_MODULE])
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
