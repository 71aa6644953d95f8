"""Stage behind ``graphdiff watch``: apply a trainer's per-step outcomes files from an inbox folder.

A trainer (or anything else) drops one outcomes file per training step into an inbox; the watcher
applies each new file to a STATE directory in step order, exactly once, with ``State.update`` (so every check and every crash-safety property of ``graphdiff update`` holds), and
writes predictions after each step if asked.

Inbox conventions (docs/reference/workflow.md, "graphdiff watch"):

* a step's file is named ``step-<T>.<ext>``: T the training step (digits; zero-pad to 6 so that ``ls``
  sorts them, e.g. ``step-000012.jsonl``), ext one of the outcomes formats (jsonl, csv, parquet, ...);
* a file is complete, and may be applied, only
  - ``complete="rename"`` (default): once it exists under that name. Writers write to any other name
    in the inbox (``step-000012.jsonl.tmp``, a dot-file, ...) and rename it into place, which is atomic
    on one file system;
  - ``complete="done"``: once a marker ``step-<T>.<ext>.done`` exists beside it (for writers that
    cannot rename: write the file, close it, then create the marker).
  Other names are never read.
* the prompt set changes between steps the same way: ``prompts-<T>.<ext>`` (a prompts file, rows ``id,
  prompt``) adds its prompts before step T's outcomes are applied, so they are candidates from step T on
  (``graphdiff extend``), and ``retire-<T>.<ext>`` (ids: one per line or a table with an ``id`` column)
  retires its prompts before step T (``graphdiff retire``). Both are complete by the same rule; when both
  are there, prompts go first. Each is applied once: the STATE's log records the file's hash with the
  change, and a file for a step already applied whose hash the log does not hold is reported as late.

Exactly once, across kills and restarts: the STATE's ``CURRENT`` is the truth about what was applied.
The watcher applies step ``current + 1`` and nothing else; a later step waits until every step before
it has been applied (out-of-order arrival is applied in step order); a file for a step that is already
applied is never applied again. ``State.update`` replaces ``CURRENT`` last, so a watcher killed at any
moment leaves either the old step (the restarted watcher applies that file again, once) or the new one
(the restarted watcher moves on). A file for an applied step whose bytes differ from those the STATE's
log recorded for that step is reported as a conflict and left alone. A file may be deleted at any moment
(a trainer cleaning up): one gone between a look at the inbox and its read is taken as not there (a step
not yet applied is reported as "vanished" and waited for again), never as an error.

Nothing here prints: events go to ``listener(event: dict)``; the result is a JSON-able dict.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..core.beta import DEFAULT_GROUP_SIZE
from ..errors import DataError, InvalidArgumentError, StateError, option
from ..io.artifacts import hash_file
from ..io.locks import DEFAULT_LOCK_TIMEOUT, file_lock

STEP_FILE = re.compile(r"^step-(\d{1,12})\.(jsonl|ndjson|json|csv|tsv|parquet|pq)$")
CHANGE_FILE = re.compile(r"^(prompts|retire)-(\d{1,12})\.(jsonl|ndjson|json|csv|tsv|parquet|pq|txt)$")
CHANGE_ORDER = {"prompts": 0, "retire": 1}
DONE_SUFFIX = ".done"
LOCK_NAME = ".graphdiff-watch.lock"
COMPLETE_MODES = ("rename", "done")
STEP_TOKEN = "{step}"
APPLIED_KEPT = 1000  # the result's "applied" lists the last this many steps; "n_applied" counts them all

Listener = Callable[[dict], None]


def _quiet(event: dict) -> None:
    return None


def step_file_name(step: int, ext: str = "jsonl") -> str:
    """The conventional name of step ``step``'s outcomes file: ``step-000012.jsonl``."""
    return f"step-{int(step):06d}.{ext}"


@dataclass
class InboxScan:
    """What one look at the inbox found."""

    ready: dict[int, Path] = field(default_factory=dict)      # step -> complete file
    incomplete: list[str] = field(default_factory=list)       # step files without their .done marker
    duplicates: dict[int, list[str]] = field(default_factory=dict)  # step -> two or more complete files
    invalid: list[str] = field(default_factory=list)          # step-0 files (step 0 is init's)
    changes: dict[int, list[tuple[str, Path]]] = field(default_factory=dict)  # step -> [(kind, file)] before it


def scan_inbox(inbox, complete: str = "rename") -> InboxScan:
    """Complete step files of ``inbox`` by step (see the module docstring for the conventions)."""
    if complete not in COMPLETE_MODES:
        raise InvalidArgumentError(f"{option('--complete')} must be one of {', '.join(COMPLETE_MODES)}, got {complete!r}")
    inbox = Path(inbox)
    try:
        names = set(os.listdir(inbox))
    except FileNotFoundError:
        raise DataError(f"{inbox}: no such inbox folder") from None
    except NotADirectoryError:
        raise DataError(f"{inbox}: not a folder") from None
    scan = InboxScan()
    found: dict[int, list[str]] = {}
    for name in sorted(names):
        m = STEP_FILE.match(name)
        c = None if m else CHANGE_FILE.match(name)
        if c:
            step = int(c.group(2))
            if step < 1 or (c.group(1) == "prompts" and c.group(3) == "txt"):
                scan.invalid.append(name)
            elif complete == "done" and name + DONE_SUFFIX not in names or not (inbox / name).is_file():
                scan.incomplete.append(name)
            else:
                scan.changes.setdefault(step, []).append((c.group(1), inbox / name))
            continue
        if not m:
            continue
        step = int(m.group(1))
        if step < 1:
            scan.invalid.append(name)
            continue
        if complete == "done" and name + DONE_SUFFIX not in names:
            scan.incomplete.append(name)
            continue
        if not (inbox / name).is_file():  # a folder or a dangling link under a step name: never complete
            scan.incomplete.append(name)
            continue
        found.setdefault(step, []).append(name)
    for step in scan.changes:
        scan.changes[step].sort(key=lambda kp: (CHANGE_ORDER[kp[0]], kp[1].name))
    for step, files in sorted(found.items()):
        if len(files) > 1:
            scan.duplicates[step] = files
        else:
            scan.ready[step] = inbox / files[0]
    return scan


@contextlib.contextmanager
def inbox_lock(inbox: Path):
    """One watcher per inbox: hold ``INBOX/.graphdiff-watch.lock`` (flock; the kernel drops it when the
    process dies, even by kill -9, so a restarted watcher never finds a stale lock)."""
    with file_lock(Path(inbox) / LOCK_NAME, 0.0, record_pid=True, mode=0o644,
                   busy=lambda holder: f"{inbox}: another graphdiff watch (pid {holder}) is watching this inbox",
                   cannot_open=lambda exc: f"{inbox}: cannot create the watcher's lock file {LOCK_NAME} "
                                           f"({exc.strerror}); the inbox must be writable by the watcher"):
        yield


def stamp_path(template) -> Path:
    """Where ``watch`` says which version its predictions file holds: one hidden ``.<file>.stamp`` beside the
    files of ``template`` (with ``{step}`` in the name, one for all of them: it names the last file written), so
    a glob for the predictions (``p-*.csv``) does not see it and a long run does not pile stamps up."""
    template = Path(str(template))
    return template.with_name(f".{template.name}.stamp")


def predictions_path(template, step: int) -> Path:
    """``template`` with ``{step}`` replaced by the zero-padded step (a file per step), else as is."""
    text = str(template)
    return Path(text.replace(STEP_TOKEN, f"{step:06d}")) if STEP_TOKEN in text else Path(text)


@dataclass(frozen=True)
class Handoff:
    """What the watcher does to a STATE (``State.watch`` passes its own methods): ``sd``, the ``StateDir`` it
    reads CURRENT and the log of; ``update(step, path, success_threshold=, lock_timeout=)``, ``extend(path,
    lock_timeout=)``, ``retire(path, lock_timeout=)`` and ``predict(out, ids_file=, group_size=)``, each the
    handoff's command of that name returning its result dict; ``loads()``: how many times the STATE was read."""

    sd: object
    update: Callable[..., dict]
    extend: Callable[..., dict]
    retire: Callable[..., dict]
    predict: Callable[..., dict]
    loads: Callable[[], int]


class _Watcher:
    """One run of the watcher (the state of its loop); ``watch`` is the public entry point."""

    def __init__(self, handoff: Handoff, inbox, *, complete, predictions, group_size, success_threshold,
                 lock_timeout, listener, predict_ids=None):
        self.handoff = handoff  # the estimator stays in memory between steps (State.watch's State is resident)
        self.sd = handoff.sd
        self.inbox = Path(inbox)
        self.complete, self.predictions, self.group_size = complete, predictions, group_size
        self.success_threshold, self.lock_timeout = success_threshold, lock_timeout
        self.listener = listener
        self.predict_ids = predict_ids
        # the last APPLIED_KEPT steps applied (a watcher can live for 10^5 steps: memory stays flat), and the count
        self.applied: deque[dict] = deque(maxlen=APPLIED_KEPT)
        self.n_applied = 0
        self.changed: list[dict] = []  # prompt set changes applied (prompts-T, retire-T files)
        self.conflicts: dict[str, dict] = {}
        self._checked: dict[str, tuple] = {}   # name -> (size, mtime_ns) of applied-step files already checked
        self._last_wait = None

    # -- one pass -----------------------------------------------------------------------------------

    def pass_once(self, stop: Callable[[], bool] = lambda: False, until_step: int | None = None) -> InboxScan:
        """Apply every step that is ready in order, up to ``until_step`` (checking ``stop()`` between
        steps); returns the scan of the inbox after the last one."""
        while True:
            scan = scan_inbox(self.inbox, self.complete)
            cur = self.sd.current_step
            self._check_applied(scan, cur)
            nxt = cur + 1
            if nxt in scan.duplicates:
                raise DataError(f"{self.inbox}: two outcomes files for step {nxt}: "
                                f"{', '.join(scan.duplicates[nxt])}; remove all but one")
            if stop() or (until_step is not None and nxt > until_step):
                return scan
            if self._apply_changes(scan.changes.get(nxt, []), cur):
                continue  # the STATE moved to a new revision: look again
            path = scan.ready.get(nxt)
            if path is None:
                self._report_wait(scan, cur)
                return scan
            self._apply(nxt, path)

    def _apply(self, step: int, path: Path) -> None:
        try:
            res = self.handoff.update(step, path, success_threshold=self.success_threshold,
                                      lock_timeout=self.lock_timeout)
        except StateError:
            # Another writer (a second watcher on another inbox, a manual update or rollback) moved the
            # STATE while we read the inbox: CURRENT is the truth, so look again rather than guess.
            if self.sd.current_step != step - 1:
                self.listener({"event": "moved", "step": step, "current": self.sd.current_step})
                return
            raise
        except DataError as exc:
            if not path.exists():  # deleted after the look at the inbox: not there (yet), not a bad file
                self.listener({"event": "vanished", "step": step, "file": path.name})
                return
            raise DataError(f"{exc} (step {step} of inbox {self.inbox}; the watcher stops here: fix or "
                            f"replace the file, then start it again)") from None
        entry = {"step": step, "file": path.name, "prompts": res["prompts"], "rollouts": res["rollouts"],
                 "successes": res["successes"], "iterations": res["iterations"], "converged": res["converged"],
                 "seconds": round(res["timings"]["total_s"], 4), "outcomes_hash": res["outcomes_hash"],
                 "warnings": res["warnings"]}
        self.applied.append(entry)
        self.n_applied += 1
        self._checked[path.name] = _signature(path)
        self.listener({"event": "applied", **entry})
        if self.predictions is not None:
            self.write_predictions(step)

    def _apply_changes(self, changes: list[tuple[str, Path]], cur: int) -> bool:
        """Apply the prompt set changes due before step cur + 1 that the log does not hold yet (the first one
        only; the caller looks again). Returns whether the inbox must be looked at again (one was applied, or
        one vanished)."""
        if not changes:
            return False
        done = {e.get("prompts_hash") or e.get("ids_hash") for e in self.sd.log_entries()
                if e.get("step") == cur and e.get("event") in ("extend", "retire")}
        for kind, path in changes:
            digest = _hash(path)
            if digest is None:  # deleted since the look at the inbox
                self.listener({"event": "vanished", "step": cur + 1, "file": path.name})
                return True
            if digest in done:
                continue
            try:
                if kind == "prompts":
                    res = self.handoff.extend(path, lock_timeout=self.lock_timeout)
                else:
                    res = self.handoff.retire(path, lock_timeout=self.lock_timeout)
            except DataError as exc:
                if not path.exists():  # deleted after the look at the inbox
                    self.listener({"event": "vanished", "step": cur + 1, "file": path.name})
                    return True
                raise DataError(f"{exc} ({path.name} of inbox {self.inbox}; the watcher stops here: fix or "
                                f"replace the file, then start it again)") from None
            entry = {"kind": kind, "file": path.name, "version": res["version"],
                     "prompts": res.get("added", res.get("prompts")), "seconds": round(res["timings"]["total_s"], 4),
                     "warnings": res["warnings"]}
            self.changed.append(entry)
            self.listener({"event": "extended" if kind == "prompts" else "retired", **entry})
            if self.predictions is not None:  # the next step's candidates changed
                self.write_predictions(cur)
            return True
        return False

    def write_predictions(self, step: int) -> None:
        out = predictions_path(self.predictions, step)  # a new folder is made (and fsynced) by the write
        before = self._version_stamp()
        res = self.handoff.predict(out, ids_file=self.predict_ids, group_size=self.group_size)
        if res["step"] != step:  # another writer moved CURRENT between the update and the predict
            self.listener({"event": "moved", "step": step, "current": res["step"]})
        if before is not None and before == self._version_stamp():  # what the file holds, said beside it
            from ..io.atomic import atomic_write_text

            atomic_write_text(stamp_path(self.predictions), json.dumps(
                {**before, "file": str(out), "predictions_hash": hash_file(out)}) + "\n")
        self.listener({"event": "predicted", "step": res["step"], "out": str(out), "rows": res["rows"]})

    def _version_stamp(self) -> dict | None:
        """The version CURRENT names and its step artifact's content hash (a step applied again after a
        rollback has the same number, not the same hash); None when it cannot be read."""
        from ..errors import GraphdiffError
        from ..io.artifacts import read_artifact
        from ..io.estimator_store import STEP_KIND, read_pointer

        try:
            step, rev, rel = read_pointer(self.sd.root)
            return {"version": [step, rev], "state_hash": read_artifact(self.sd.root / rel, STEP_KIND).content_hash}
        except (GraphdiffError, OSError):
            return None

    def ensure_predictions(self) -> None:
        """At start: a restarted watcher may have been killed between an update and its predictions. The file is
        fresh when the stamp written beside it names the current version (its content hash) and the file's own
        hash: what the files say, never their times (a clock that jumped, a file copied in)."""
        if self.predictions is None:
            return
        cur = self.sd.current_step
        out = predictions_path(self.predictions, cur)
        if out.is_file():
            try:
                stamp = json.loads(stamp_path(self.predictions).read_text(encoding="utf-8"))
                fresh = (isinstance(stamp, dict) and stamp.get("file") == str(out)
                         and stamp.get("predictions_hash") == hash_file(out)
                         and {k: stamp.get(k) for k in ("version", "state_hash")} == self._version_stamp())
            except (OSError, ValueError):
                fresh = False
            if fresh:
                return
        self.write_predictions(cur)

    # -- bookkeeping -------------------------------------------------------------------------------

    def _check_late(self, scan: InboxScan, cur: int) -> None:
        """A prompts-T or retire-T file for a step already applied must be one the log holds; else it came late."""
        todo = [(step, kind, p) for step, changes in scan.changes.items() if step <= cur for kind, p in changes
                if self._checked.get(p.name) != _signature(p)]
        if not todo:
            return
        held = {(e["step"], e.get("prompts_hash") or e.get("ids_hash")) for e in self.sd.log_entries(upto=cur)
                if e.get("event") in ("extend", "retire")}
        for step, kind, p in todo:
            digest = _hash(p)
            if digest is None:  # deleted since the look at the inbox
                continue
            self._checked[p.name] = _signature(p)
            if (step - 1, digest) in held:
                continue
            conflict = {"step": step, "file": p.name, "late": True, "applied_hash": None, "applied_from": None}
            self.conflicts[p.name] = conflict
            self.listener({"event": "conflict", **conflict})

    def _check_applied(self, scan: InboxScan, cur: int) -> None:
        """Files for steps <= current must hold the outcomes the STATE's log recorded (the same bytes, or the same
        (id, n, s) rows under the same threshold: a re-serialised re-delivery); else a conflict."""
        present = {p.name for p in scan.ready.values()} | {p.name for ch in scan.changes.values() for _, p in ch}
        if len(self._checked) > len(present):  # files the trainer deleted: forget them (a long run stays flat)
            self._checked = {name: sig for name, sig in self._checked.items() if name in present}
        self._check_late(scan, cur)
        todo = {step: p for step, p in scan.ready.items() if step <= cur
                and self._checked.get(p.name) != _signature(p)}
        if not todo:
            return
        logged = {int(e["step"]): e for e in self.sd.log_entries(upto=cur) if not e.get("revision")}
        for step, p in sorted(todo.items()):
            sig = _signature(p)
            actual = _hash(p)
            if actual is None:  # deleted since the look at the inbox (a trainer cleaning up applied steps)
                self._checked.pop(p.name, None)
                continue
            self._checked[p.name] = sig
            entry = logged.get(step)
            recorded = None if entry is None else entry.get("outcomes_hash")
            if recorded == actual or _same_content(p, entry):
                self.conflicts.pop(p.name, None)
                continue
            conflict = {"step": step, "file": p.name, "hash": actual, "applied_hash": recorded,
                        "applied_from": None if entry is None else entry.get("outcomes")}
            self.conflicts[p.name] = conflict
            self.listener({"event": "conflict", **conflict})

    def _report_wait(self, scan: InboxScan, cur: int) -> None:
        later = sorted(s for s in scan.ready if s > cur + 1)
        key = (cur, tuple(later), tuple(scan.incomplete), tuple(sorted(scan.duplicates)))
        if key != self._last_wait:
            self._last_wait = key
            self.listener({"event": "waiting", "next_step": cur + 1, "later_steps": later,
                           "incomplete": list(scan.incomplete), "duplicates": scan.duplicates,
                           "invalid": list(scan.invalid)})


def _same_content(p: Path, entry: dict | None) -> bool:
    """Whether inbox file ``p`` holds the (id, n, s) rows the log line ``entry`` was applied from (under its
    threshold and id column); False when the line predates the content hash or the file cannot be parsed."""
    from ..errors import GraphdiffError
    from ..io.outcomes import read_outcomes

    if entry is None or entry.get("outcomes_content") is None:
        return False
    try:
        parsed = read_outcomes(p, success_threshold=entry.get("success_threshold"),
                               id_field=entry.get("id_field", "id"))
    except (GraphdiffError, OSError):
        return False
    return parsed.content_hash == entry["outcomes_content"]


def _hash(p: Path) -> str | None:
    """The content hash of inbox file ``p``, or None when it is gone (deleted since the inbox was listed)."""
    from ..io.artifacts import hash_file

    try:
        return hash_file(p)
    except FileNotFoundError:
        return None


def _signature(p: Path) -> tuple:
    try:
        info = p.stat()
    except FileNotFoundError:
        return (None, None)
    return (info.st_size, info.st_mtime_ns)


def watch(handoff: Handoff, inbox, *, once: bool = False, poll: float = 2.0, predictions=None,
          group_size: int = DEFAULT_GROUP_SIZE,
          success_threshold: float | None = None, lock_timeout: float = DEFAULT_LOCK_TIMEOUT, complete: str = "rename",
          until_step: int | None = None, predict_ids=None, stop: Callable[[], bool] = lambda: False,
          listener: Listener = _quiet) -> dict:
    """Apply the inbox's step files to a STATE through ``handoff`` (``State.watch`` calls this with its own
    methods) in step order, exactly once; see the module docstring.

    ``once``: one pass (apply every step that is ready, then return). Otherwise look again every
    ``poll`` seconds until ``stop()`` is true or the STATE reaches ``until_step``. ``predictions``: a
    table written after each applied step (and at start), ``{step}`` in it naming one file per step;
    ``predict_ids``: a file of the ids to write there (the trainer's next candidate pool; default: every
    prompt). The estimator stays in memory between steps (``State`` is resident): the STATE is read once,
    and again only when another writer moved it.
    """
    import math

    from ..io.outcomes import check_threshold

    if complete not in COMPLETE_MODES:
        raise InvalidArgumentError(f"{option('--complete')} must be one of {', '.join(COMPLETE_MODES)}, got {complete!r}")
    if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not math.isfinite(poll) or poll <= 0:
        raise InvalidArgumentError(f"{option('--poll')} must be a positive number of seconds, got {poll!r}")
    from ..core.beta import check_group_size

    check_group_size(group_size, "--group-size")
    if until_step is not None and (isinstance(until_step, bool) or not isinstance(until_step, int)
                                   or until_step < 0):
        raise InvalidArgumentError(f"{option('--until-step')} must be an integer >= 0, got {until_step!r}")
    check_threshold(success_threshold)
    if predictions is not None:
        from ..io.tables import detect_format

        detect_format(predictions)  # refuse an unknown extension before anything is applied
    inbox = Path(inbox)
    if not inbox.is_dir():
        raise DataError(f"{inbox}: no such inbox folder (create it; the trainer writes step files into it)")

    t0 = time.perf_counter()
    w = _Watcher(handoff, inbox, complete=complete, predictions=predictions, group_size=group_size,
                 success_threshold=success_threshold, lock_timeout=lock_timeout, listener=listener,
                 predict_ids=predict_ids)
    start_step = w.sd.current_step
    with inbox_lock(inbox):
        w.ensure_predictions()
        reason = None
        while True:
            scan = w.pass_once(stop, until_step)
            if until_step is not None and w.sd.current_step >= until_step:
                reason = "until_step"
                break
            if once:
                reason = "once"
                break
            if stop():
                reason = "stopped"
                break
            deadline = time.monotonic() + poll
            while not stop() and time.monotonic() < deadline:
                time.sleep(min(0.05, poll))
            if stop():
                reason = "stopped"
                break
    cur = w.sd.current_step
    return {"command": "watch", "state": str(handoff.sd.root), "inbox": str(inbox), "complete": complete,
            "start_step": start_step, "step": cur, "applied": list(w.applied), "n_applied": w.n_applied,
            "prompt_set_changes": w.changed,
            "pending": sorted(s for s in scan.ready if s > cur + 1), "next_step": cur + 1,
            "incomplete": scan.incomplete, "duplicates": scan.duplicates, "invalid": scan.invalid,
            "conflicts": list(w.conflicts.values()),
            "predictions": None if predictions is None else str(predictions_path(predictions, cur)),
            "stopped": reason, "state_loads": handoff.loads(), "timings": {"total_s": time.perf_counter() - t0}}
