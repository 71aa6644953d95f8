"""``State``: the public object for a STATE directory, the step handoff between a trainer and graphdiff.

    from graphdiff_cli import State

    st = State.init("graph.zarr", "clusters.zarr", "STATE")          # step 0 (or State.open("STATE"))
    for t in range(1, steps + 1):
        batch = st.select("pool.txt", batch_size=128)["ids"]           # or read st.estimates(ids)
        rows = train_one_step(batch)                                   # [{"id", "n", "s"}, ...]
        st.update(t, rows)                                             # or an outcomes file
    st.rollback(10)                                                    # the trainer resumed from step 10

Live features (``io.live``: numbers the trainer observes per prompt at a step, such as the policy's next-token
entropy at the prompt's end) go with a step's rows (``st.update(t, rows, live=F)``, or a ``live`` column of the
outcomes file) and with a read (``st.select(ids, 128, live=G)``, ``predict``, ``allocate``, ``estimates``).

Every command of the step handoff (``init``, ``update``, ``predict``, ``select``, ``allocate``, ``extend``,
``retire``, ``rollback``, ``status``, ``verify``, ``watch``) is a method here and the CLI command of the
same name is one call of it. The object is resident: it keeps the estimator of the version it last read
or wrote in memory and reads the STATE again only when another writer moved ``CURRENT`` under it (every
atomic replace of CURRENT is a new inode) or when a write failed midway. Each write goes through
``transaction()``: it holds the STATE's lock, and either commits the next version (and the object then
holds it) or, on any exception, leaves the STATE as it was and forgets what it held in memory.

Each method checks everything before writing, raises ``GraphdiffError``s with one-line messages, and
returns a JSON-able dict (what ``--json`` prints); ``estimates`` returns arrays.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from pathlib import Path
from typing import Iterable

import numpy as np

from .core.beta import DEFAULT_GROUP_SIZE, check_group_size
from .errors import DataError, InvalidArgumentError, StateError
from .io import layout
from .io.locks import DEFAULT_LOCK_TIMEOUT
from .io.state_dir import StateDir, check_lock_timeout
from .stages import decide, handoff, prompt_set
from .stages.progress import Progress, no_progress

__all__ = ["State", "Transaction"]


def _with_live(rows: list, live) -> list:
    """Outcome rows (dicts) with their ``live`` column set from ``live`` (one row of features per outcome row;
    a row of NaN: none)."""
    x = np.asarray(live)
    if x.ndim != 2 or x.shape[0] != len(rows) or x.dtype.kind not in "fiu":
        raise DataError(f"live features must be a numeric {len(rows)} x f array (one row per outcome row), got dtype "
                        f"{x.dtype}, shape {x.shape}")
    out = []
    for row, features in zip(rows, x.astype(np.float64)):
        if not isinstance(row, dict):
            raise InvalidArgumentError(f"outcomes must be a file or a list of row dicts ('id', 'n', 's'), got a list "
                                       f"holding a {type(row).__name__}")
        out.append(row if np.isnan(features).all() else {**row, "live": features.tolist()})
    return out


def _plain(x):
    """numpy scalars in rows (counts from np.sum, ...) as the JSON numbers they are."""
    if isinstance(x, np.generic):
        return x.item()
    raise DataError(f"outcome rows hold numbers and strings, got a {type(x).__name__} ({str(x)[:60]})")


class Transaction:
    """One write to a STATE under its lock (``State.transaction``): at most one commit of the next version."""

    def __init__(self, state: "State"):
        self.state = state
        self.committed = False
        self._ids: list[str] | None = None
        self._retired: np.ndarray | None = None
        self._reload = False

    def _check(self) -> None:
        if self.committed:
            raise StateError(f"{self.state.path}: one transaction commits one version")

    def commit_step(self, entry: dict) -> list[int]:
        """Write the resident estimator (just updated) as the next step, with the log ``entry``."""
        self._check()
        st = self.state
        est = st.estimator()
        # the estimator is the current version's (read from it, or resident since it wrote it), so the rows of q
        # it changed since are what the step's delta holds
        pruned = st.dir.commit_step({**est.state_dict(copy=False), layout.RETIRED: st.retired}, entry,
                                    q_rows=est.q_rows_changed(), since=st._est_source, durable=st.durable)
        self.committed = True
        est.mark_saved()
        st._est_source = st.dir.committed_hash
        return pruned

    def commit_revision(self, entry: dict, *, retired=None, ids=None, model_arrays=None,
                        model_attrs=None) -> list[int]:
        """Write the resident estimator as the next revision of the current step (a prompt-set change: new
        ``ids`` and model arrays for extend, a new ``retired`` set for retire)."""
        self._check()
        st = self.state
        retired = st.retired if retired is None else np.asarray(retired, dtype=np.int64)
        est = st.estimator()
        pruned = st.dir.commit_revision({**est.state_dict(copy=False), layout.RETIRED: retired}, entry,
                                        ids=ids, model_arrays=model_arrays, model_attrs=model_attrs,
                                        durable=st.durable)
        self.committed = True
        est.mark_saved()
        st._est_source = st.dir.committed_hash
        self._retired = retired
        self._ids = None if ids is None else list(ids)
        return pruned

    def rollback(self, step: int, revision: int | None = None) -> list[int]:
        """Make a retained version current again (what the object held is read again next time)."""
        self._check()
        removed = self.state.dir.rollback(step, revision)
        self.committed, self._reload = True, True
        return removed


class State:
    """An opened STATE directory; see the module docstring. ``device``: where the estimator runs (None:
    the STATE's setting); ``durable=False`` skips fsyncs (tests, benchmarks on throwaway STATEs);
    ``outcomes_dir``: where ``update`` writes the outcomes it is given as rows (default ``STATE.outcomes``
    beside the STATE)."""

    def __init__(self, path, *, device: str | None = None, durable: bool = True, outcomes_dir=None):
        self.dir = StateDir.open(path)
        self.device, self.durable = device, durable
        self.outcomes_dir = Path(outcomes_dir) if outcomes_dir else layout.outcomes_dir(self.dir.root)
        self._est = None
        self.retired = np.zeros(0, np.int64)  # node indices of the retired prompts at the resident version
        self._est_ids: list[str] = []         # the prompt ids of the resident estimator's nodes
        self._est_index = None                # (self._est_ids, its IdIndex)
        self._est_source = None               # content hash of the step artifact the resident estimator equals
        self._current_sig = None              # the CURRENT file the resident estimator is
        self._index, self._index_sig = None, None
        self.loads = 0                        # how many times the STATE was read (1 when nobody else writes)
        self.created: dict | None = None      # init's report, on a State made by State.init

    # -- opening and creating ------------------------------------------------------------------------

    _resident: dict | None = None  # keep_resident(): one object per directory for this process's life

    @classmethod
    def open(cls, path, *, device: str | None = None, durable: bool = True, outcomes_dir=None) -> "State":
        """The STATE directory at ``path`` (refused in one line unless it is one). In a process that called
        ``keep_resident`` (``graphdiff serve``), the same directory opened the same way gives the same
        object, so its estimator stays in memory from call to call."""
        if cls._resident is None:
            return cls(path, device=device, durable=durable, outcomes_dir=outcomes_dir)
        root = Path(path)
        try:  # the path as given from the working directory (the object keeps it, relative or not), and the
            # directory's inode: a STATE made anew at the same path is a new object
            key = (str(root), str(Path.cwd()), root.stat().st_ino, device, durable, str(outcomes_dir))
        except OSError:
            return cls(path, device=device, durable=durable, outcomes_dir=outcomes_dir)  # refused in one line
        if key not in cls._resident:
            cls._resident[key] = cls(path, device=device, durable=durable, outcomes_dir=outcomes_dir)
        return cls._resident[key]

    @classmethod
    def keep_resident(cls) -> None:
        """From now on ``open`` hands out one object per STATE directory (for a long-running server)."""
        if cls._resident is None:
            cls._resident = {}

    @classmethod
    def init(cls, graph, clusters, path, *, config=None, embeddings=None, keep: int | None = None,
             keep_every: int | None = None, snapshot_every: int | None = None, durable: bool = True,
             progress: Progress = no_progress, **settings) -> "State":
        """A new STATE directory at step 0 from a graph and its clusters artifacts. ``config``: a YAML file
        of estimator settings; ``settings``: any setting of ``graphdiff_cli.settings`` (``preset``, ``beta``,
        ``device``, ...; None = not given), overriding the file's; ``keep`` and ``keep_every``: which states
        are retained, ``snapshot_every``: how often q is written whole (``retention``). Its report is ``.created``."""
        report = handoff.init_state(graph, clusters, path, config=config, embeddings=embeddings, keep=keep,
                                    keep_every=keep_every, snapshot_every=snapshot_every, progress=progress,
                                    durable=durable, **settings)
        st = cls(path, durable=durable)
        st.created = report
        return st

    # -- what it holds -------------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The STATE directory."""
        return self.dir.root

    @property
    def step(self) -> int:
        """The current step (read from CURRENT: another writer may have moved it)."""
        return self.dir.current_step

    @property
    def version(self) -> tuple[int, int]:
        """The current (step, revision)."""
        return self.dir.current_version()

    @property
    def ids(self) -> list[str]:
        """The current version's prompt ids, in node order."""
        return list(self.index.ids)

    @property
    def index(self):
        """The ``IdIndex`` of the current version's prompts: the resident estimator's while CURRENT is the one
        it was read from, else read again (extend adds prompts, a rollback may remove them)."""
        sig = self._signature()
        if self._est is not None and sig == self._current_sig:
            return self.resident_index
        if self._index is None or sig != self._index_sig:
            self._index, self._index_sig = self.dir.id_index(), sig
        return self._index

    @property
    def resident_index(self):
        """The ``IdIndex`` of the resident estimator's nodes: the same version as ``estimator()`` returned
        last, even if another writer moved CURRENT since (what a reader pairs with that estimator)."""
        from .io.readers import IdIndex

        if self._est_index is None or self._est_index[0] is not self._est_ids:
            self._est_index = (self._est_ids, IdIndex(self._est_ids, f"the prompts of STATE {self.path}"))
        return self._est_index[1]

    def _signature(self):
        """Which CURRENT file is in place (``StateDir.signature``); an unreadable one raises, never compares equal."""
        return self.dir.signature(missing_ok=False)

    def estimator(self):
        """The ``Estimator`` at the current version: the resident one, unless CURRENT moved under it."""
        before = self._signature()
        if self._est is not None and before == self._current_sig:
            return self._est
        self._est, self.retired, self._est_ids, self._est_source = handoff.load_current_state(self.dir, self.device)
        self.loads += 1
        # a CURRENT replaced while we read: keep the estimator (it is a whole version's) but look again next time
        self._current_sig = before if self._signature() == before else None
        return self._est

    @contextlib.contextmanager
    def transaction(self, lock_timeout: float = DEFAULT_LOCK_TIMEOUT):
        """Hold the STATE's lock for one write: yields a ``Transaction`` whose ``commit_*`` writes the next
        version. On any exception the STATE is left as it was and the resident estimator (which the write
        may have moved ahead) is forgotten; after a commit the object holds the version it wrote."""
        with self.dir.locked(lock_timeout):
            txn = Transaction(self)
            try:
                yield txn
            except BaseException:
                self._est = None
                raise
            if txn._reload:
                self._est = None
            elif txn.committed:
                self._current_sig = self._signature()
                if txn._ids is not None:
                    self._est_ids = txn._ids
                if txn._retired is not None:
                    self.retired = txn._retired

    # -- the handoff ---------------------------------------------------------------------------------

    def update(self, step: int, outcomes, *, success_threshold: float | None = None,
               lock_timeout: float = DEFAULT_LOCK_TIMEOUT, id_field: str = "id",
               progress: Progress = no_progress, live=None) -> dict:
        """Apply training step ``step`` (= current + 1). ``outcomes``: a JSONL/CSV/Parquet file of rows
        ``id, n, s`` (or ``id, reward``), or those rows as dicts, written first to ``outcomes_dir`` so the
        log names a file as for every step. A step applied twice, a gap or a bad row changes nothing.
        ``success_threshold``: None (only 0/1 rewards accepted) or the reward from which a rollout succeeds;
        the result's ``warnings`` says when a chosen threshold put every reward of the step on one side.
        ``id_field``: the file's column holding the prompt id (a dotted path reads a nested field). Live features
        observed at the step (``io.live``) come in the rows' ``live`` column, or, with rows as dicts, as ``live``:
        one row of features per outcome row (a row of NaN: none), written into the rows' ``live`` column."""
        if live is not None:
            if isinstance(outcomes, (str, Path)):
                raise InvalidArgumentError("live features of an outcomes file go in its rows' 'live' column "
                                           "(io.live); live= is for rows given as dicts")
            outcomes = _with_live(list(outcomes), live)
        if isinstance(outcomes, (str, Path)):
            return self._update(step, outcomes, success_threshold=success_threshold, lock_timeout=lock_timeout,
                                id_field=id_field, progress=progress)
        with self._outcome_rows(step, outcomes) as path:
            res = self._update(step, path, success_threshold=success_threshold, lock_timeout=lock_timeout,
                               id_field=id_field, progress=progress)
            if res.get("outcomes") != str(path.resolve()):  # the no-op: applied before, from another file
                path.unlink(missing_ok=True)
        self._prune_outcomes(res["step"], res["retained"])
        return res

    def _update(self, step: int, outcomes, *, success_threshold, lock_timeout, id_field, progress) -> dict:
        """``update`` of an outcomes file: checked and parsed before the lock, checked again under it, then the
        estimator read (resident), the step applied (``handoff.apply_step``) and committed."""
        t0 = time.perf_counter()
        success_threshold, id_field = handoff.check_update(step, success_threshold, id_field, lock_timeout)
        sd = self.dir
        # fail fast, before parsing; checked again under the lock
        done = handoff.refuse_or_noop(sd, step, outcomes, success_threshold, t0, id_field)
        if done is not None:
            return done
        progress(0, 4)
        t_import = handoff.import_torch()
        t1 = time.perf_counter()
        index = self.index
        t_model = time.perf_counter() - t1
        parsed = handoff.read_step_outcomes(outcomes, index, success_threshold, id_field)
        t_parse = time.perf_counter()
        progress(1, 4)
        with self.transaction(lock_timeout) as txn:
            t_locked = time.perf_counter()
            done = handoff.refuse_or_noop(sd, step, outcomes, success_threshold, t0, id_field)
            if done is not None:  # another writer moved on while we waited
                return done
            est = self.estimator()
            nodes = parsed.node_indices(self.index)  # again: an extend or rollback may have moved the prompt set
            warnings = handoff.step_warnings(sd, step, outcomes, parsed, est.settings.live_readout is not None)
            t_load = time.perf_counter()
            progress(2, 4)
            est, entry = handoff.apply_step(est, nodes, parsed, root=sd.root, step=step, outcomes=outcomes,
                                            success_threshold=success_threshold, id_field=id_field)
            t_infer = time.perf_counter()
            progress(3, 4)
            pruned = txn.commit_step(entry)
        res = handoff.update_result(sd, step, entry, pruned, warnings, t0=t0, t_infer=t_infer, timings={
            "import_s": t_import, "parse_s": t_parse - t1 - t_model, "lock_wait_s": t_locked - t_parse,
            "load_s": t_model + t_load - t_locked, "inference_s": t_infer - t_load})
        progress(4, 4)
        return res

    _ROWS_NAME = re.compile(r"step_(\d{8})-[0-9a-f]{16}-([0-9a-f]{8})-[0-9a-f]{8}\.jsonl")

    @property
    def _rows_tag(self) -> str:
        """What names this STATE's rows files in ``outcomes_dir`` (several STATEs may share the folder)."""
        return hashlib.sha256(str(self.dir.root.resolve()).encode("utf-8")).hexdigest()[:8]

    @contextlib.contextmanager
    def _outcome_rows(self, step, rows):
        """``rows`` written to ``outcomes_dir/step_T-<content hash>-<STATE tag>-<nonce>.jsonl`` (atomically) and
        the path yielded: a file of this call's own, so that no file a log names is ever replaced or removed by
        another writer (two writers of one step, two STATEs sharing the folder). It is kept only when the step
        was applied from it: a refusal, the no-op (the log names the first file of those rows) or an error
        removes it (the caller removes it after a no-op). An error in the rows names the row (``outcome row 3``),
        not the file."""
        import json
        import secrets

        from .errors import GraphdiffError
        from .io.atomic import atomic_write_text

        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise InvalidArgumentError(f"step must be an integer >= 1 (step 0 is init), got {step!r}")
        rows = list(rows)
        if not rows:
            # a step without rollouts (reused generations) still advances the STATE: one row with n = 0
            rows = [{"id": self.index.ids[0], "n": 0, "s": 0}]
        if not all(isinstance(r, dict) for r in rows):
            bad = next(r for r in rows if not isinstance(r, dict))
            raise InvalidArgumentError(f"outcomes must be a file or a list of row dicts ('id', 'n', 's'), "
                                       f"got a list holding a {type(bad).__name__}")
        try:
            text = "".join(json.dumps(r, default=_plain, allow_nan=False) + "\n" for r in rows)
        except ValueError as exc:  # NaN or infinity: no JSON number
            raise DataError(f"outcome rows hold finite numbers: {exc}") from None
        content = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
        path = self.outcomes_dir / f"step_{step:08d}-{content}-{self._rows_tag}-{secrets.token_hex(4)}.jsonl"
        atomic_write_text(path, text)  # makes outcomes_dir (fsynced) when it is new
        try:
            yield path
        except BaseException as exc:
            if not self._logged(step, path):  # refused, or cut short before its commit
                path.unlink(missing_ok=True)
            if isinstance(exc, GraphdiffError):
                where = re.escape(str(path))
                message = re.sub(where + r":(\d+):", r"outcome row \1:", str(exc))
                message = re.sub(where, "the outcome rows", message)
                if message != str(exc):
                    raise type(exc)(message) from None
            raise

    def _logged(self, step: int, path: Path) -> bool:
        """Whether the log names ``path`` as step ``step``'s outcomes; True when that cannot be read (the file is
        then kept, never a file the log may name removed)."""
        try:
            if self.dir.current_step < step:  # not committed (CURRENT moves last)
                return False
            entry = self.dir.log_entry((step, 0))
            return entry.get("step") == step and entry.get("outcomes") == str(path.resolve())
        except Exception:  # noqa: BLE001 - also called while another exception is raised: keep the file, say nothing
            return True

    def _prune_outcomes(self, current: int, retained) -> None:
        """Remove this STATE's rows files (its tag in the name) of the steps up to ``current`` it no longer
        retains; a file of a later step is another writer's, on its way in."""
        try:
            files = list(self.outcomes_dir.iterdir())
        except OSError:  # no folder (every step came as a file), or unreadable: nothing to prune
            return
        keep, tag = set(retained), self._rows_tag
        for f in files:
            m = self._ROWS_NAME.fullmatch(f.name)
            if m and m.group(2) == tag and int(m.group(1)) <= current and int(m.group(1)) not in keep:
                f.unlink(missing_ok=True)

    def estimates(self, ids: Iterable[str] | None = None, *, group_size: int = DEFAULT_GROUP_SIZE,
                  live=None) -> dict:
        """Every estimate of the prompts ``ids`` (all candidates, retired ones left out, when None) at the
        current version: {"id": [...], "p", "difficulty", "p_model", "uncertainty", "mean", "variance",
        "n_seen", "p_zero_variance": arrays}. ``live``: the prompts' live features (``io.live``: a file, a mapping
        {id: features}, or with ``ids`` a list an array of one row per id)."""
        from .io.live import as_mapping

        group_size = check_group_size(group_size, "group_size")
        ids = None if ids is None else list(ids)
        live = as_mapping(live, ids)
        est = self.estimator()
        return handoff.estimates(est, self.resident_index, self.retired, ids, group_size=group_size, live=live)

    def predict(self, out, *, ids_file=None, fmt: str | None = None, group_size: int = DEFAULT_GROUP_SIZE,
                id_field: str = "id", progress: Progress = no_progress, live=None) -> dict:
        """Write every candidate's (or ``ids_file``'s, its ids read from ``id_field``) estimates at the current
        version to ``out``, atomically. ``live``: live features of candidates (``io.live``: a file or a mapping
        {id: features})."""
        from .io.live import as_mapping

        t0 = time.perf_counter()
        group_size, id_field, fmt = handoff.check_predict(out, fmt, group_size, id_field)
        live = as_mapping(live)
        progress(0, 3)
        t_import = handoff.import_torch()
        t1 = time.perf_counter()
        est = self.estimator()
        return handoff.predict(est, self.resident_index, self.retired, out, root=self.path, ids_file=ids_file,
                               fmt=fmt, group_size=group_size, id_field=id_field, progress=progress, t0=t0,
                               t_import=t_import, t1=t1, live=live)

    def select(self, candidates, batch_size: int, strategy: str = decide.DEFAULT_SELECT_STRATEGY, out=None, *,
               progress: Progress = no_progress, live=None, **kwargs) -> dict:
        """Choose ``batch_size`` prompts of ``candidates`` (an ids file or a list of ids) by ``strategy``;
        written to ``out`` when given. The chosen ids are ``["ids"]``, best first. ``kwargs``: ``seed``,
        ``target``, ``explore``, ``group_size``, ``fmt``, ``id_field`` (``stages.decide.check_select``).
        ``live``: the candidates' live features (``io.live``: a file, a mapping {id: features}, or with
        ``candidates`` a list an array of one row per candidate); a candidate without them gets no live estimate."""
        from .io.live import as_mapping

        t0 = time.perf_counter()
        options = decide.check_select(batch_size, strategy, out, **kwargs)  # before the estimator is read
        if not isinstance(candidates, (str, Path)):
            candidates = list(candidates)
        options["live"] = as_mapping(live, candidates)
        progress(0, 3)
        est = self.estimator()
        return decide.select(est, self.resident_index, self.retired, candidates, root=self.path, progress=progress,
                             t0=t0, **options)

    def allocate(self, ids, budget: int, strategy: str = "variance", out=None, *, progress: Progress = no_progress,
                 live=None, **kwargs) -> dict:
        """Split ``budget`` rollouts over the prompts ``ids`` (an ids file or a list); written to ``out`` when
        given. The counts are ``["counts_by_id"]``. ``kwargs``: ``min_count``, ``max_count``, ``vip_gamma``,
        ``fmt``, ``id_field`` (``stages.decide.check_allocate``). ``live``: the prompts' live features, as
        ``select`` takes them."""
        from .io.live import as_mapping

        t0 = time.perf_counter()
        options = decide.check_allocate(budget, strategy, out, **kwargs)  # before the estimator is read
        if not isinstance(ids, (str, Path)):
            ids = list(ids)
        options["live"] = as_mapping(live, ids)
        progress(0, 3)
        est = self.estimator()
        return decide.allocate(est, self.resident_index, self.retired, ids, root=self.path, progress=progress,
                               t0=t0, **options)

    def extend(self, prompts=None, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT, progress: Progress = no_progress,
               **kwargs) -> dict:
        """Add prompts (a prompts file, or ``embedded=`` their embeddings artifact) as the next revision: read
        and embedded before the lock, grown into the estimator and committed under it. ``kwargs``:
        ``embedded``, ``embeddings``, ``id_field``, ``text_field``, ``messages``, ``batch_size``, ``device``
        (``stages.prompt_set.read_new_prompts``)."""
        new = prompt_set.read_new_prompts(self.dir, prompts, lock_timeout=lock_timeout, progress=progress, **kwargs)
        with self.transaction(lock_timeout) as txn:
            t_locked = time.perf_counter()
            model = prompt_set.current_model(self.dir, new)
            est = self.estimator()
            version = self.version
            est, ext = prompt_set.add_prompts(est, model, new, root=self.path, step=version[0], progress=progress)
            pruned = txn.commit_revision(ext.entry, ids=ext.ids, model_arrays=ext.model_arrays,
                                         model_attrs=ext.model_attrs)
            t_write = time.perf_counter()
            progress(4, 4)
        return prompt_set.extend_result(self.dir, version, new, ext, pruned, t_locked=t_locked, t_write=t_write)

    def retire(self, ids, *, restore: bool = False, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
               progress: Progress = no_progress) -> dict:
        """Take prompts (an ids file or a list) out of the candidate set, or put them back (``restore``), as the
        next revision of the current step. Their evidence stays in the states they informed."""
        t0 = time.perf_counter()
        check_lock_timeout(lock_timeout)
        progress(0, 2)
        ids, data, source, ids_hash = prompt_set.read_ids(ids)  # before the lock: what the log's hash names
        with self.transaction(lock_timeout) as txn:
            est = self.estimator()
            retired, entry = prompt_set.retire_step(self.index, self.retired, est.n_nodes, ids, data, source=source,
                                                    ids_hash=ids_hash, restore=restore)
            version = self.version
            progress(1, 2)
            pruned = txn.commit_revision(entry, retired=retired)
        progress(2, 2)
        return prompt_set.retire_result(self.dir, version, entry, est.n_nodes - int(retired.size), pruned, t0)

    def rollback(self, to, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT, progress: Progress = no_progress) -> dict:
        """Make step ``to`` current again (T, or a revision "T.R"), for a trainer resuming from its checkpoint:
        its newest retained revision, or revision R (T.0: what update T wrote, before any extend or retire)."""
        step, revision = handoff.parse_version(to)
        check_lock_timeout(lock_timeout)
        progress(0, 1)
        with self.transaction(lock_timeout) as txn:
            before = self.version
            removed = txn.rollback(step, revision)
            now = self.version
        progress(1, 1)
        return handoff.rollback_result(self.dir, before, now, removed)

    def retention(self, *, keep: int | None = None, keep_every: int | None = None,
                  snapshot_every: int | None = None, lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> dict:
        """Which states are kept: the last ``keep`` steps and every multiple of ``keep_every`` (so a trainer
        checkpointing every C steps finds its step), with the disk they use; ``snapshot_every``: an update writes
        q whole at its multiples, else the rows that changed. Given any, set it and prune."""
        return handoff.retention(self.dir, keep=keep, keep_every=keep_every, snapshot_every=snapshot_every,
                                 lock_timeout=lock_timeout)

    def status(self, *, last: int = 10, estimator: bool = False) -> dict:
        """What the STATE holds: current step, prompts, states, config, the last applied steps, retention; with
        ``estimator``, also what its estimator believes (``["estimator"]``: ``stages.beliefs.estimator_summary``)."""
        res = handoff.status(self.dir, last=last)
        if estimator:
            from .stages.beliefs import estimator_summary

            res["estimator"] = estimator_summary(self.estimator(), self.retired)
        return res

    def verify(self) -> dict:
        """Read every array of every retained version against its checksums; ``["intact"]`` and the problems."""
        from .stages.verify import verify

        return verify(self.path)

    def watch(self, inbox, **kwargs) -> dict:
        """Apply an inbox of per-step outcomes files as they arrive (``graphdiff watch``), with this object's
        methods: the estimator stays in memory between steps."""
        from .stages.watch import watch

        return watch(self._watch_handoff(), inbox, **kwargs)

    def _watch_handoff(self):
        """What ``stages.watch`` does to this STATE: these methods (extend on this object's device)."""
        from .stages.watch import Handoff

        return Handoff(self.dir, self.update,
                       lambda prompts, **kw: self.extend(prompts, device=self.device or "auto", **kw),
                       self.retire, self.predict, lambda: self.loads)

    def __repr__(self) -> str:
        try:
            step, rev = self.version
            where = f"step {step}" + (f".{rev}" if rev else "")
        except Exception:  # noqa: BLE001 - a repr never raises
            where = "unreadable"
        return f"State({str(self.path)!r}, {where})"
