"""The STATE directory of the step handoff: one estimator state per applied training step.

Layout (specified in docs/reference/handoff.md)::

    STATE/
      CURRENT             {"step": T, "path": "steps/0000000T.zarr"}   the current state (replaced atomically)
      model.zarr          estimator-model artifact written by init: W, labels, prompt ids, kNN lists, config
      models/T.R.zarr     the model after the prompt set changed (graphdiff extend), written with its version
      steps/00000000.zarr estimator-step artifacts: q, a, b, successes, rollouts, window evidence, ...
                          (q whole, or the rows changed since the step before: a delta, composed on reading)
      steps/0000000T.R.zarr  revision R of step T: the state after the R-th extend or retire since update T
      log.jsonl           one JSON line per applied version (step 0 = init), with each input file's hash
      .lock               flock'ed by every writer (update, extend, retire, rollback)

A version is (step, revision): update T writes (T, 0); extend and retire write (T, R + 1) onto (T, R), so
the trainer's step numbers stay the STATE's. Each step artifact names its model by relative path and
content hash; a model no retained version names is removed with the versions.

Invariants, which make every write crash-safe (kill -9 at any moment leaves the previous step):

1. CURRENT is the only truth about which step is current; it is replaced atomically, last.
2. The log and the step artifacts are the truth only up to CURRENT's step: a log line or a step
   artifact above it is debris of a crashed update or rollback and is ignored by readers and removed
   by the next writer (together with staging folders, trash folders and temporary files).
3. A writer holds ``STATE/.lock`` (fcntl.flock, exclusive) from its first check to its last write.
   Readers (predict, status, ``Estimator.load``) take no lock: they read CURRENT, then that step's
   artifact (and the steps a delta's q is composed from); pruning keeps the previous state and every step a
   kept delta is composed from (with keep >= 2), so a reader racing one update still finds the state its
   CURRENT named.

An update writes, in order: the step artifact (staging folder + rename), the log (one line appended and
fsynced; rewritten atomically only when debris above CURRENT must go), CURRENT (atomic replace), then
prunes states older than the last ``keep`` (step 0, and every step a kept delta is composed from, are kept). A reader that meets an append cut
short (a last line without its newline) skips it: it is above CURRENT.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ..errors import ArtifactError, InvalidArgumentError, StateError, either, option
from .artifacts import read_artifact
from .atomic import append_nofollow, atomic_write_text, fsync_dir, make_dirs, refuse_links
from .estimator_store import (STEP_KIND, Delta, base_path, check_step_artifact, pointer_text, q_dtype, read_current,
                              read_model, read_pointer, read_state, save_model, save_step, step_chain, step_inputs,
                              step_model_path)
from .layout import CURRENT, LAYOUT_VERSION, LOCK, LOG, MODEL, MODELS, RETENTION, STEPS, step_relpath, step_version
from .locks import DEFAULT_LOCK_TIMEOUT, file_lock
from .debris import owner
from .staging import staged_dir

READ_TRIES = 8  # reads of a STATE that moves under each one before the reader gives up

DEFAULT_KEEP = 5
# every step that is a multiple of this is kept too, so that a trainer resuming from a checkpoint (taken every
# 50, 100, 500 steps: TRL's save_steps default is 500) finds its step: ~550 KB a step at 3,000 prompts
DEFAULT_KEEP_EVERY = 50
# an update writes q whole at every multiple of this (and of keep_every), else the rows that changed (a delta)
DEFAULT_SNAPSHOT_EVERY = 50
_MODEL_NAME = re.compile(r"^(\d+)\.(\d+)\.zarr$")

# Test hook: with GRAPHDIFF_TEST_PAUSE_AFTER=<point> an update or rollback stops after that write
# (points: artifact, log, current, prune) so a test can kill -9 it there. With GRAPHDIFF_TEST_PAUSE_FILE
# set it touches "<file>.reached" and waits for <file> to exist, else it sleeps. Unset: no effect.
PAUSE_ENV, PAUSE_FILE_ENV = "GRAPHDIFF_TEST_PAUSE_AFTER", "GRAPHDIFF_TEST_PAUSE_FILE"


def _pause(point: str) -> None:
    if os.environ.get(PAUSE_ENV) != point:
        return
    release = os.environ.get(PAUSE_FILE_ENV)
    if not release:
        time.sleep(300)
        return
    Path(release + ".reached").touch()
    deadline = time.monotonic() + 300
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.02)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _remove_tree(path: Path) -> None:
    """Remove a folder so that a crash midway never leaves a half-deleted state under a valid name."""
    if not path.exists():
        return
    trash = path.parent / f".trash-{path.name}-{uuid.uuid4().hex[:8]}"
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _is_top_debris(name: str) -> bool:
    """Temporary files of io.atomic for CURRENT and the log (only writers holding the lock make them, so
    under the lock every one is dead; also the older ".CURRENT.<random>.tmp" form) and trash."""
    who = owner(name)
    return (name.startswith(".trash-") or (who is not None and who[0] in (CURRENT, LOG))
            or (name.startswith((f".{CURRENT}.", f".{LOG}.")) and name.endswith(".tmp")))


class StateDir:
    """An opened STATE directory (no lock held; writers use ``locked()``)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._models: dict[tuple, tuple] = {}  # read_model tuples by (path, zarr.json inode, mtime)
        self.removed_versions: list[str] = []  # what the last rollback removed, as "T" / "T.R"
        self.prune_skipped: str | None = None  # why the last commit's pruning did not run (a damaged file)
        self.committed_hash: str | None = None  # the content hash of the step artifact the last commit wrote
        self.sync_failed: str | None = None  # the last commit's: committed, but the folder's fsync failed

    # -- opening -----------------------------------------------------------------------------------

    @classmethod
    def open(cls, root) -> "StateDir":
        root = Path(root)
        if not root.is_dir():
            raise ArtifactError(f"{root}: no such STATE directory (create one with graphdiff init)")
        if not (root / CURRENT).is_file() or not (root / MODEL).is_dir():
            raise ArtifactError(f"{root}: not a graphdiff STATE directory (no {CURRENT} or {MODEL}); "
                                "create one with graphdiff init")
        return cls(root)

    @classmethod
    def create(cls, root, state: dict, ids, *, keep: int = DEFAULT_KEEP, keep_every: int = DEFAULT_KEEP_EVERY,
               snapshot_every: int = DEFAULT_SNAPSHOT_EVERY, inputs: dict | None = None,
               init_entry: dict | None = None, model_arrays: dict | None = None, model_attrs: dict | None = None,
               durable: bool = True) -> "StateDir":
        """Make a new STATE directory at step 0 for a fresh estimator's ``state`` dict, atomically.

        Everything is built in a staging folder beside ``root`` and renamed into place, so a crash
        leaves no STATE at all rather than half of one. An existing non-empty ``root`` is refused.
        """
        root = Path(root)
        retention = Retention(keep, keep_every, snapshot_every)
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise StateError(f"{root}: already exists and is not empty; choose another --out or remove it")
        if state["step"] != 0:
            raise StateError(f"init needs a fresh estimator at step 0, got step {state['step']}")
        with staged_dir(root, replace=False, durable=durable) as staging:  # an empty root is replaced
            (staging / LOCK).touch(mode=0o644)
            (staging / STEPS).mkdir()
            content = save_model(state, staging / MODEL, ids, inputs=inputs, extra_arrays=model_arrays,
                                 extra_attrs={"handoff": {"layout_version": LAYOUT_VERSION},
                                              **(model_attrs or {})}, durable=durable)
            save_step(state, staging / step_relpath(0), staging / MODEL, content, durable=durable)
            entry = {"step": 0, "event": "init", "applied_at": _now(), "state": step_relpath(0),
                     **(init_entry or {})}
            atomic_write_text(staging / LOG, json.dumps(entry, sort_keys=True) + "\n")
            atomic_write_text(staging / RETENTION, retention.text())
            atomic_write_text(staging / CURRENT, pointer_text(0))
        return cls(root)

    # -- reading -----------------------------------------------------------------------------------

    def current(self) -> tuple[int, str]:
        """(current step, relative path of its artifact) from CURRENT."""
        return read_current(self.root)

    def current_version(self) -> tuple[int, int]:
        """(current step, its revision) from CURRENT."""
        step, rev, _rel = read_pointer(self.root)
        return step, rev

    @property
    def current_step(self) -> int:
        return self.current()[0]

    def model_at(self, path) -> tuple:
        """(artifact, ids, W, labels, config) of the model artifact at ``path``, read once per StateDir and
        version of the folder (a rollback and a new extend may write another model under the same name: every
        write is a new folder renamed into place, so its zarr.json has a new inode)."""
        path = Path(os.path.normpath(Path(path).absolute()))
        try:
            st = (path / "zarr.json").stat()
            key = (path, st.st_ino, st.st_mtime_ns)
        except OSError:
            key = (path, None, None)  # read_model says what is wrong
        if key not in self._models:
            self._models = {k: v for k, v in self._models.items() if k[0] != path}
            self._models[key] = read_model(path)
        return self._models[key]

    def model(self):
        """(artifact, ids, W, labels, config) of the model the current version belongs to."""
        def read(step, rev, rel):
            if rev == 0 and step == 0:
                return self.model_at(self.root / MODEL)
            art = read_artifact(self.root / rel, STEP_KIND)
            check_step_artifact(art, (step, rev))
            return self.model_at(step_model_path(art))

        return self.consistent(read)

    @property
    def ids(self) -> list[str]:
        return self.model()[1]

    def id_index(self):
        """``readers.IdIndex`` of the STATE's prompts (node i = row i of the embedded prompts file)."""
        from .readers import IdIndex

        return IdIndex(self.ids, f"the prompts of STATE {self.root}")

    @property
    def retention(self) -> "Retention":
        """Which states pruning keeps: ``retention.json`` (written by init and ``graphdiff retention``); a STATE
        made before it existed keeps what its model's ``handoff.keep`` says, and every DEFAULT_KEEP_EVERY-th."""
        path = self.root / RETENTION
        if not path.exists():
            handoff = self.model()[0].attr("handoff") or {}
            # a STATE made when --keep 1 was allowed keeps 2: fewer removes what a concurrent reader opens
            return Retention(max(int(handoff.get("keep", DEFAULT_KEEP)), MIN_KEEP), DEFAULT_KEEP_EVERY)
        return Retention.read(path)

    @property
    def keep(self) -> int:
        return self.retention.keep

    def set_retention(self, retention: "Retention") -> list[int]:
        """Write a new retention (callers hold the lock) and prune by it at once; returns the pruned steps (none,
        with ``prune_skipped`` saying why, when a retained step cannot be read: as after a commit)."""
        atomic_write_text(self.root / RETENTION, retention.text())
        self.prune_skipped = None
        try:
            return self.prune(retention)
        except (ArtifactError, OSError) as exc:
            self.prune_skipped = str(exc)
            return []

    def disk_bytes(self) -> dict[str, int]:
        """Bytes on disk of the retained states (steps/), the models (model.zarr, models/) and all of it."""
        def size(p: Path) -> int:  # without the lock: a file another writer prunes meanwhile counts 0
            total = 0
            for dirpath, _dirs, files in os.walk(p):
                for name in files:
                    with contextlib.suppress(FileNotFoundError):
                        total += os.stat(os.path.join(dirpath, name)).st_size
            if not total and p.is_file():
                with contextlib.suppress(FileNotFoundError):
                    total = p.stat().st_size
            return total

        steps = size(self.root / STEPS)
        models = size(self.root / MODEL) + size(self.root / MODELS)
        return {"steps": steps, "models": models, "total": size(self.root)}

    def signature(self, missing_ok: bool = True):
        """Which CURRENT file is in place (every atomic replace makes a new inode); None when unreadable, or the
        OSError raised when not ``missing_ok``."""
        path = self.root / CURRENT
        try:
            st = path.stat()
            return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size, path.read_bytes())
        except OSError:
            if not missing_ok:
                raise
            return None

    def consistent(self, read):
        """``read(step, revision, rel)`` of the version CURRENT names, read again from a new read of CURRENT
        when it fails and CURRENT has meanwhile moved: a rollback (or a prune) removes the version a reader
        found a moment before and cuts the log under it, which is no damage. A failure with CURRENT unmoved is
        raised as it is; a STATE that moves under every one of ``READ_TRIES`` reads is refused in one line."""
        last = None
        for _ in range(READ_TRIES):
            before = self.signature()
            pointer = read_pointer(self.root)
            try:
                return read(*pointer)
            except Exception as exc:
                if self.signature() == before:
                    raise
                last = exc
        raise StateError(f"{self.root}: the current step changed under each of {READ_TRIES} reads (a writer "
                         f"committing without pause); the last read said: {last}") from last

    def current_view(self) -> tuple[tuple[int, int], str, object, tuple]:
        """((step, revision), relative path, step artifact, ``read_model`` tuple) of the current version, from
        one read of CURRENT, the artifact checked to hold that version, to belong to this STATE's model and to be
        made from what the log says (without reading its arrays): a report made of several
        reads of CURRENT mixes two versions when a writer commits between them (an extend's step and revision
        with the new model's prompts)."""
        return self.consistent(self.view)

    def view(self, step: int, rev: int, rel: str) -> tuple[tuple[int, int], str, object, tuple]:
        """``current_view`` of the version CURRENT named when read as (step, rev, rel)."""
        art = read_artifact(self.root / rel, STEP_KIND)
        model = self.model_at(self.root / MODEL if (step, rev) == (0, 0) else step_model_path(art))
        check_step_artifact(art, (step, rev), model[0], entry=self.log_entry((step, rev)))
        return (step, rev), rel, art, model

    def read_state(self) -> dict:
        """The estimator state dict at the current step (``Estimator.from_state_dict`` makes it one), once the
        log is seen to list every step up to it (CURRENT and the step's own record are checked by
        ``estimator_store.read_state``): every reader of a STATE goes through here."""
        return self.read_state_and_model()[0]

    def read_state_and_model(self) -> tuple[dict, tuple]:
        """(the current state dict, the ``read_model`` tuple of the model it belongs to): one read of CURRENT
        for both, so a reader never pairs a state with another version's prompt ids; the step artifact must
        be made from the files the log's line of that version records."""
        def read(step, rev, rel):
            entry = self.log_entry((step, rev))
            used = []

            def model_for(path):
                used.append(self.model_at(path))
                return used[-1]

            state = read_state(self.root / rel, model=model_for, version=(step, rev), entry=entry)
            return state, used[-1]

        return self.consistent(read)

    def version_dirs(self) -> dict[tuple[int, int], Path]:
        """Every step artifact folder on disk by version (step, revision), including debris above CURRENT."""
        out = {}
        steps = self.root / STEPS
        if steps.is_dir():
            for p in steps.iterdir():
                v = step_version(p.name)
                if v is not None and p.is_dir():
                    out[v] = p
        return dict(sorted(out.items()))

    def retained_versions(self, upto: tuple[int, int] | None = None) -> list[tuple[int, int]]:
        """Versions whose state is kept and valid: at or below ``upto`` (a version read earlier, e.g. by
        ``current_view``; default: the current one)."""
        cur = self.current_version() if upto is None else upto
        return [v for v in self.version_dirs() if v <= cur]

    def retained_steps(self) -> list[int]:
        """Steps with at least one retained version."""
        return sorted({t for t, _r in self.retained_versions()})

    def log_entries(self, upto=None) -> list[dict]:
        """The log's lines up to version ``upto`` (a step: its last revision; a (step, revision); default:
        the current version), in order."""
        return self._read_log(upto)[0]

    def log_entry(self, version: tuple[int, int]) -> dict:
        """The log's line of ``version`` (the whole log checked as ``log_entries`` checks it, without holding
        the other lines)."""
        return self._read_log(version, keep_entries=False)[2]

    def _read_log(self, upto=None, keep_entries: bool = True) -> tuple[list[dict], bool, dict]:
        """(the log's entries up to version ``upto``, whether the file holds exactly those lines, the last of them).

        Lines above ``upto`` are debris of a crashed update (invariant 2), and so is a last line without its
        newline that does not parse (an append cut short): both are skipped, and the file is then not exact.
        The file is read one line at a time and, with ``keep_entries=False`` (the entries come back empty),
        no line outlives its check: a long-lived writer checks a log that grows every step, and holding all
        of it at once each time raised its resident memory by the log's parsed size at every step (the
        allocator keeps the highest peak).
        """
        if upto is None:
            upto = self.current_version()
        if not isinstance(upto, tuple):
            upto = (upto, float("inf"))
        path = self.root / LOG
        if not path.is_file():
            raise ArtifactError(f"{path}: the STATE directory has no log")
        entries, exact = [], True
        first = last_v = last_e = None
        count, ok = 0, True
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    e = json.loads(line)
                    version = _version(e)
                except (ValueError, KeyError, TypeError, AttributeError):
                    if not line.endswith("\n"):  # an append cut short: debris above CURRENT
                        exact = False
                        continue
                    raise ArtifactError(f"{path}:{line_no}: damaged log line") from None
                if not line.endswith("\n"):  # a whole entry that only lacks its newline (a hand edit)
                    exact = False
                if version > upto:
                    exact = False
                    continue
                # one line per applied version, in order (rollback truncates it): (0, 0), then each step's
                # update and its revisions 1, 2, ... before the next step
                ok = ok and (version == (0, 0) if last_v is None
                             else version in ((last_v[0], last_v[1] + 1), (last_v[0] + 1, 0)))
                first = version if first is None else first
                last_v, last_e, count = version, e, count + 1
                if keep_entries:
                    entries.append(e)
        last = upto[0] if upto[1] == float("inf") else upto
        if not count or not ok or (last_v[0] if upto[1] == float("inf") else last_v) != last:
            have = f"steps {first[0]}..{last_v[0]} ({count} lines)" if count else "no steps"
            raise ArtifactError(f"{path}: the log lists {have} but the STATE is at step {_name(upto)}; it was "
                                "damaged or edited (restore it from a backup, or rollback to a step it covers)")
        return entries, exact, last_e

    def _append_log(self, entry: dict, durable: bool) -> None:
        """Append one line to the log (O_APPEND, then fsync; never through a link): a step's cost does not grow
        with the run."""
        append_nofollow(self.root / LOG, (json.dumps(entry, sort_keys=True) + "\n").encode("utf-8"), durable=durable)

    # -- writing (callers hold the lock) -----------------------------------------------------------

    @contextlib.contextmanager
    def locked(self, timeout: float = DEFAULT_LOCK_TIMEOUT):
        """Hold STATE/.lock exclusively; wait up to ``timeout`` seconds for another writer to finish."""
        check_lock_timeout(timeout)
        busy = (lambda _holder: f"{self.root}: another update or rollback has held {LOCK} for more than "
                f"{timeout:g} s; try again when it has finished (or raise {option('--lock-timeout')})")
        cannot = (lambda exc: f"{self.root / LOCK}: cannot open the STATE's lock ({exc.strerror}); a STATE is "
                  "written by a user who may write its folder")
        with file_lock(self.root / LOCK, timeout, busy=busy, cannot_open=cannot, mode=0o644):
            # what writers write in or into: a link planted there would take the write elsewhere (the lock itself
            # and each file opened are guarded by O_NOFOLLOW; an atomic replace replaces a link, but a STATE with
            # one is not as graphdiff left it)
            refuse_links(*(self.root / name for name in (CURRENT, LOG, RETENTION, STEPS, MODELS)))
            yield self

    def clean_debris(self) -> list[str]:
        """Remove what crashed writers left behind: anything above CURRENT, staging/trash, temp files, and
        models no retained version names."""
        cur = self.current_version()
        removed = []
        for v, p in self.version_dirs().items():
            if v > cur:
                _remove_tree(p)
                removed.append(p.name)
        for p in self.debris_paths():
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p.name)
        return removed + self._prune_models()

    def debris_paths(self) -> list[Path]:
        """The staging and trash folders and temporary files crashed writers left in the STATE (what
        ``clean_debris`` removes besides the versions above CURRENT), sorted: every dot entry of steps/ and
        models/, and at the top level only graphdiff's own temporary names (a user's dotfile there is none of
        our business)."""
        found = []
        for sub in (STEPS, MODELS):
            if (self.root / sub).is_dir():
                found += [p for p in (self.root / sub).iterdir() if p.name.startswith(".")]
        found += [p for p in self.root.iterdir() if _is_top_debris(p.name)]
        return sorted(found)

    def _prune_models(self) -> list[str]:
        """Remove models/ entries that no retained version's step artifact names. When a retained artifact
        cannot be read (a damaged STATE), nothing is removed: which models it needs is not known."""
        folder = self.root / MODELS
        if not folder.is_dir():
            return []
        named = set()
        try:
            for v in self.retained_versions():
                art = read_artifact(self.root / step_relpath(*v), STEP_KIND)
                named.add(os.path.normpath(step_model_path(art).absolute()))
        except (ArtifactError, OSError):
            return []
        removed = []
        for p in folder.iterdir():
            if _MODEL_NAME.match(p.name) and p.is_dir() and os.path.normpath(p.absolute()) not in named:
                _remove_tree(p)
                removed.append(f"{MODELS}/{p.name}")
        return removed

    def commit_step(self, state: dict, entry: dict, *, q_rows=None, since: str | None = None,
                    durable: bool = True) -> list[int]:
        """Make an estimator ``state`` dict (one step past the current one) the current state; returns the
        pruned steps.

        ``q_rows``: the rows of q that changed since the step artifact whose content hash is ``since``
        (``Estimator.q_rows_changed`` of an estimator read from it or that wrote it). Given, and that artifact
        still the current version's, the step is written as a delta of it unless the retention's ``snapshot_at``
        says a snapshot, the chain would reach ``snapshot_every`` deltas, the deltas since the chain's snapshot
        already take as many bytes on disk as it does, more than half of q changed or q's dtype is not the
        chain's; otherwise q is written whole (a snapshot). ``committed_hash`` is then the
        content hash of the artifact written.

        Order: step artifact, log, CURRENT, prune. A crash between any two leaves CURRENT at the
        previous step, and re-running the step completes (invariant 2 of the module docstring).
        """
        cur = self.current_version()
        t = int(state["step"])
        if t != cur[0] + 1:
            raise StateError(f"internal: committing step {t} onto step {cur[0]}")
        self.clean_debris()
        return self._commit(state, entry, (t, 0), durable=durable,
                            delta=self._delta(cur, t, state, q_rows, since))

    def _delta(self, cur: tuple[int, int], t: int, state: dict, q_rows, since) -> Delta | None:
        """The ``Delta`` update ``t`` is written as, onto the current version ``cur``, or None for a snapshot (also
        when the retention file or the current step cannot be read: a snapshot needs neither)."""
        if q_rows is None or since is None:
            return None
        try:
            retention = self.retention
            rows = np.asarray(q_rows, dtype=np.int64)
            if retention.snapshot_at(t) or rows.size * 2 > len(state["q"]):
                return None
            base = read_artifact(self.root / step_relpath(*cur), STEP_KIND)
            if base.content_hash != since or q_dtype(base) != str(np.asarray(state["q"]).dtype):
                return None  # not the state the rows are counted from (a folder put back by hand), or another dtype
            delta = Delta(base, rows)
            if delta.depth >= retention.snapshot_every:
                return None
            snapshot_bytes, chain_bytes = delta.chain_bytes
            # the deltas since the snapshot already take its room on disk: a snapshot now keeps what a kept step
            # needs to about twice a snapshot (and reading it to the snapshot and as much again)
            return delta if chain_bytes < snapshot_bytes else None
        except (ArtifactError, OSError):
            return None

    def commit_revision(self, state: dict, entry: dict, *, ids=None, model_arrays: dict | None = None,
                        model_attrs: dict | None = None, durable: bool = True) -> list[int]:
        """Make ``state`` (the current step's, with a changed prompt set) the next revision of the current
        step; with ``ids`` it belongs to a new model (W, labels, ``ids`` and ``model_arrays`` from it), written
        first under models/. Returns the pruned steps. Same order and crash safety as ``commit_step``."""
        t, r = self.current_version()
        if int(state["step"]) != t:
            raise StateError(f"internal: committing a revision of step {state['step']} onto step {t}")
        self.clean_debris()
        model = None
        if ids is not None:
            model = self.root / MODELS / f"{t}.{r + 1}.zarr"
            make_dirs(self.root / MODELS, durable)
            base = self.model()[0]
            inputs = {**{k: v for k, v in base.inputs.items() if k in ("graph", "clusters")},
                      "extended_from": base.content_hash}  # W and labels are no longer the graph's alone
            save_model(state, model, ids, inputs=inputs, extra_arrays=model_arrays,
                       extra_attrs={"handoff": base.attr("handoff"), **(model_attrs or {})}, durable=durable)
            _pause("model")
        return self._commit(state, entry, (t, r + 1), model=model, durable=durable)

    def _commit(self, state: dict, entry: dict, version: tuple[int, int], *, durable: bool,
                model: Path | None = None, delta: Delta | None = None) -> list[int]:
        """Write ``state`` as ``version`` (of ``model``, default the current version's; a ``delta`` of the current
        version when given), then the log line, then CURRENT, then prune (callers cleaned the debris first)."""
        rel = step_relpath(*version)
        m_art = self.model()[0] if model is None else self.model_at(model)[0]  # default: the current version's
        if delta is not None and delta.base.inputs.get("model") != m_art.content_hash:
            delta = None  # the version it would be a delta of belongs to another model: never for an update
        save_step(state, self.root / rel, m_art.path, m_art.content_hash, inputs=step_inputs(entry),
                  extra_attrs={"revision": version[1]} if version[1] else None, delta=delta, durable=durable)
        self.committed_hash = read_artifact(self.root / rel, STEP_KIND).content_hash
        _pause("artifact")
        exact = self._read_log(upto=self.current_version(), keep_entries=False)[1]
        new = {**entry, "step": version[0], "state": rel, "applied_at": _now()}
        if version[1]:
            new["revision"] = version[1]
        if exact:  # the usual case: one line appended
            self._append_log(new, durable)
        else:  # debris of a crashed update above CURRENT (or a torn last line): rewrite without it, atomically
            entries = self._read_log(upto=self.current_version())[0]
            atomic_write_text(self.root / LOG, "".join(json.dumps(e, sort_keys=True) + "\n" for e in entries + [new]))
        _pause("log")
        atomic_write_text(self.root / CURRENT, pointer_text(*version), sync_dir=False)
        self._sync_committed()
        _pause("current")
        self.prune_skipped = None
        try:  # committed: pruning is housekeeping, and what it leaves the next writer removes
            pruned = self.prune(self.retention)
        except (ArtifactError, OSError) as exc:
            pruned, self.prune_skipped = [], str(exc)  # the caller may say why
        _pause("prune")
        return pruned

    def _sync_committed(self) -> None:
        """fsync the STATE folder right after CURRENT's rename. The new version is committed from that rename on
        (every reader sees it, and sending the step again is a no-op), so a failed fsync is reported in
        ``sync_failed``, never raised: raising would call an applied version a failure."""
        self.sync_failed = None
        try:
            fsync_dir(self.root)
        except OSError as exc:
            self.sync_failed = (f"{self.root}: committed, durability unknown: the new version is applied, but the "
                                f"fsync of the STATE folder after replacing {CURRENT} failed ({exc.strerror or exc}), "
                                "so it may not survive a power loss")

    def durability(self) -> dict:
        """What a writer's result says about its commit's fsync of the STATE folder: ``durability_unknown``, and
        ``warnings`` holding the line that says so when it failed."""
        return {"durability_unknown": self.sync_failed is not None,
                "warnings": [self.sync_failed] if self.sync_failed else []}

    def prune(self, retention: "Retention") -> list[int]:
        """Remove the versions of every step ``retention`` does not keep (the last ``keep`` steps and every
        multiple of ``keep_every``; every revision of a kept step stays, and step 0 as init wrote it is always
        kept) and the models none of the rest names; returns the steps none of whose versions is left."""
        retained = self.retained_versions()
        kept_steps = retention.kept({t for t, _r in retained})
        kept = self.chains({v for v in retained if v[0] in kept_steps or v == (0, 0)})
        drop = [v for v in retained if v not in kept]
        for v in drop:
            _remove_tree(self.root / step_relpath(*v))
        self._prune_models()
        left = {t for t, _r in self.retained_versions()}
        return sorted({t for t, _r in drop} - left)

    def chains(self, versions) -> set[tuple[int, int]]:
        """``versions`` and every version their q is composed from (the bases of delta steps, to the snapshots),
        from each step folder's ``zarr.json`` (its attribute ``base``; no array is read). One that cannot be read
        or names no earlier step folder raises ``ArtifactError``: which steps it needs is then unknown, so pruning
        removes nothing (the commit's result warns, and ``verify`` names the folder)."""
        out, todo = set(), sorted(versions)
        while todo:
            v = todo.pop()
            if v in out:
                continue
            out.add(v)
            folder = self.root / step_relpath(*v)
            try:
                rel = json.loads((folder / "zarr.json").read_text())["attributes"].get("base")
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ArtifactError(f"{folder}: unreadable zarr.json ({exc.__class__.__name__}), so the steps its q is "
                                    "composed from are unknown") from None
            base = base_path(folder, rel)
            if base is not None:
                todo.append(step_version(base.name))
        return out

    def rollback(self, to, revision: int | None = None) -> list[int]:
        """Make step ``to`` current again (its newest retained revision, or ``revision``); later versions and
        log lines go. Returns the steps none of whose versions is left."""
        self.removed_versions, self.sync_failed = [], None
        cur = self.current_version()
        if isinstance(to, bool) or not isinstance(to, int) or to < 0:
            raise InvalidArgumentError(f"{option('--to')} must be a step >= 0, got {to!r}")
        if revision is not None and (isinstance(revision, bool) or not isinstance(revision, int) or revision < 0):
            raise InvalidArgumentError(f"the revision must be an integer >= 0, got {revision!r}")
        if (to, revision or 0) > cur:
            raise StateError(f"{self.root}: step {_name((to, revision or 0))} has not been applied (the current step "
                             f"is {_name(cur)}); rollback only goes back")
        dirs = {v: p for v, p in self.version_dirs().items() if v <= cur}
        if revision is None:
            revs = [r for t, r in dirs if t == to]
            target = (to, max(revs)) if revs else (to, 0)
        else:
            target = (to, revision)
        if target not in dirs:
            kept = ", ".join(_name(v) for v in self.retained_versions())
            raise StateError(f"{self.root}: the state of step {_name(target)} was pruned; retained steps: {kept} "
                             f"({either('graphdiff retention --keep N --keep-every C', 'State.retention(keep=N, keep_every=C)')} "
                             "sets which are kept)")
        entries = self.log_entries(upto=target)
        art = read_artifact(dirs[target], STEP_KIND)  # refuse to point CURRENT at a damaged state
        check_step_artifact(art, target, said_by="its name says", entry=entries[-1])
        step_chain(art)  # and at a delta whose bases are not all there
        if target == cur:
            return []
        self.clean_debris()
        atomic_write_text(self.root / CURRENT, pointer_text(*target), sync_dir=False)
        self._sync_committed()
        _pause("current")
        if self.sync_failed:
            # CURRENT's rename may not be on disk: cutting the log or removing the later states now could leave,
            # after a power loss, a CURRENT they no longer cover. Above CURRENT they are debris (invariant 2),
            # which readers ignore and the next writer removes.
            return []
        atomic_write_text(self.root / LOG, "".join(json.dumps(e, sort_keys=True) + "\n" for e in entries))
        _pause("log")
        removed = [v for v in self.version_dirs() if v > target]
        for v in removed:
            _remove_tree(self.root / step_relpath(*v))
        self._prune_models()
        self.removed_versions = [_name(v) for v in removed]
        return sorted({t for t, _r in removed} - {t for t, _r in self.retained_versions()})


def _version(entry: dict) -> tuple[int, int]:
    """(step, revision) of a log line."""
    step, rev = entry["step"], entry.get("revision", 0)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (step, rev)):
        raise ValueError("step and revision must be integers >= 0")
    return step, rev


def _name(version) -> str:
    """A version as a user writes it: "T" for revision 0 (or a whole step), "T.R" for revision R."""
    step, rev = version if isinstance(version, tuple) else (version, 0)
    return str(step) if rev in (0, float("inf")) else f"{step}.{rev}"


def check_lock_timeout(timeout) -> float:
    """Seconds to wait for another writer of a STATE: a number >= 0."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise InvalidArgumentError(f"{option('--lock-timeout')} must be >= 0 seconds, got {timeout!r}")
    return float(timeout)


MIN_KEEP = 2  # with 1, an update prunes the step a reader may have just found in CURRENT, mid-read


def check_keep(keep) -> int:
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < MIN_KEEP:
        raise InvalidArgumentError(f"{option('--keep')} must be an integer >= {MIN_KEEP} (with fewer, an update removes the "
                                   f"state a concurrent predict is reading), got {keep!r}")
    return keep


@dataclass(frozen=True)
class Retention:
    """Which steps' states a STATE keeps: the last ``keep`` and every multiple of ``keep_every`` (0: none),
    besides step 0. Checkpoint-aligned: a trainer that saves every C steps and sets keep_every to C (or a
    divisor of it) always finds the step it resumes from.

    ``snapshot_every`` S: an update writes q whole (a snapshot) at every multiple of S or of ``keep_every``,
    else only the rows that changed since the step before (a delta); pruning keeps every step a kept step's q
    is composed from (1: every step a snapshot, as before version 9 of the step artifact)."""

    keep: int = DEFAULT_KEEP
    keep_every: int = DEFAULT_KEEP_EVERY
    snapshot_every: int = DEFAULT_SNAPSHOT_EVERY

    def __post_init__(self):
        check_keep(self.keep)
        if isinstance(self.keep_every, bool) or not isinstance(self.keep_every, int) or self.keep_every < 0:
            raise InvalidArgumentError(f"{option('--keep-every')} must be an integer >= 0 (0: keep only the last "
                                       f"{option('--keep')}), got "
                                       f"{self.keep_every!r}")
        if isinstance(self.snapshot_every, bool) or not isinstance(self.snapshot_every, int) or self.snapshot_every < 1:
            raise InvalidArgumentError(f"{option('--snapshot-every')} must be an integer >= 1 (1: every step writes q whole), got "
                                       f"{self.snapshot_every!r}")

    def kept(self, steps) -> set[int]:
        """The steps of ``steps`` this retention keeps (without the steps their q is composed from)."""
        steps = sorted(steps)
        return set(steps[-self.keep:]) | {0} | ({t for t in steps if t % self.keep_every == 0} if self.keep_every else set())

    def snapshot_at(self, step: int) -> bool:
        """Whether update ``step`` writes q whole whatever changed (its chain of deltas starts again)."""
        return step % self.snapshot_every == 0 or bool(self.keep_every and step % self.keep_every == 0)

    def text(self) -> str:
        return json.dumps({"keep": self.keep, "keep_every": self.keep_every,
                           "snapshot_every": self.snapshot_every}) + "\n"

    @classmethod
    def read(cls, path) -> "Retention":
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
            # a retention written before deltas existed has no snapshot_every: the default
            return cls(int(doc["keep"]), int(doc["keep_every"]), int(doc.get("snapshot_every", DEFAULT_SNAPSHOT_EVERY)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, InvalidArgumentError) as exc:
            raise ArtifactError(f"{path}: damaged retention file ({exc.__class__.__name__}); rewrite it with "
                                f"{either('graphdiff retention --keep N --keep-every C', 'State.retention(keep=N, keep_every=C)')}") from None
