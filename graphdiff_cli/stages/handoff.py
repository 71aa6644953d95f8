"""The step handoff between a trainer and graphdiff: init, update, estimates/predict, status, rollback.

The public object is ``graphdiff_cli.State``; these are the steps behind its methods, and they never see
it: the handoff flows one way. ``State`` holds the lock, reads the estimator and commits; a step gets the
parts it needs (the estimator, the ``IdIndex`` of its prompts, the retired prompts, the parsed input, the
``StateDir`` to read its log) and returns the updated estimator and the log entry (``apply_step``), or a
result dict. ``init_state`` makes a new STATE directory. Everything is read and checked before anything is
written, so a refused request changes nothing. Progress goes through ``progress(done, total)``; nothing
here prints. The STATE format is specified in docs/reference/handoff.md.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from ..core.beta import DEFAULT_GROUP_SIZE
from ..errors import (AlreadyAppliedError, ArtifactError, GraphdiffError, InvalidArgumentError, StateError, StepGapError,
                      either, option)
from ..io.artifacts import has_array, hash_file, read_artifact
from ..io.layout import JOINED, RETIRED
from ..io.locks import DEFAULT_LOCK_TIMEOUT
from ..io.state_dir import DEFAULT_KEEP, DEFAULT_KEEP_EVERY, DEFAULT_SNAPSHOT_EVERY, Retention, StateDir, check_lock_timeout
from .progress import Progress, no_progress

PREDICT_COLUMNS = ["id", "p", "difficulty", "p_model", "uncertainty", "mean", "variance", "n_seen", "p_zero_variance"]


def load_current_state(sd: StateDir, device: str | None = None):
    """(the ``Estimator`` at a STATE's current version, the node indices of its retired prompts, the prompt
    ids of its nodes, the content hash of the step artifact read), all from one read of CURRENT."""
    from ..estimator import Estimator
    from ..io.estimator_store import SOURCE_HASH

    arrays, model = sd.read_state_and_model()
    retired = np.asarray(arrays.pop(RETIRED, np.zeros(0, np.int64)), dtype=np.int64)
    source = arrays.pop(SOURCE_HASH)
    return Estimator.from_state_dict(arrays, device=device, copy=False, verified=True), retired, model[1], source


def active_rows(rows: np.ndarray, retired: np.ndarray) -> np.ndarray:
    """Which of ``rows`` are candidates (not retired), as a boolean mask."""
    return ~np.isin(rows, retired) if retired.size else np.ones(rows.size, bool)


def import_torch() -> float:
    """Import torch up front (seconds taken), so that load_s times reading the state, not the import."""
    t = time.perf_counter()
    import torch  # noqa: F401

    return time.perf_counter() - t


# --------------------------------------------------------------------------------------------- init

def init_settings(config=None, **flags):
    """(EstimatorSettings, keep) for init: the preset's values < the config file's estimator section
    (``settings.config_layer``: a whole config's ``estimator:`` or a file of only its keys) < flags given
    on the command line (None = not given). The preset is the flag ``preset``, else the file's, else
    "default". ``keep``, ``keep_every`` and ``snapshot_every`` (STATE retention) are flags only; None = the
    defaults of ``Retention``."""
    from ..io.readers import read_mapping
    from ..settings import config_layer, parse_flag, resolve_layers

    keep, keep_every, every = flags.pop("keep", None), flags.pop("keep_every", None), flags.pop("snapshot_every", None)
    layers = [config_layer(*read_mapping(config), config)] if config is not None else []
    given = {k: parse_flag(k, v) if k != "preset" else v for k, v in flags.items() if v is not None}
    settings = resolve_layers(layers + [(given, lambda key: f"--{key.replace('_', '-')}")])
    return settings, Retention(DEFAULT_KEEP if keep is None else keep,
                               DEFAULT_KEEP_EVERY if keep_every is None else keep_every,
                               DEFAULT_SNAPSHOT_EVERY if every is None else every)


def readout_embeddings(graph, embeddings, settings) -> tuple:
    """(the embeddings the STATE keeps for the read-out, in the graph's node order, or None; what init says
    about it). The read-out (setting ``readout``) needs every prompt's embedding in the STATE: read from
    ``embeddings``, else from where build-graph read them, when the read-out is on and they are there (a
    number for ``readout`` without them is refused by the estimator). They cost N x d x 4 bytes in the model
    artifact, written at init and at each extend (150,000 prompts x 384: 230 MB)."""
    from ..io.readers import embedding_matrix

    if settings.readout is None:
        return None, {"on": False, "why": "the setting readout is null"}
    path = embeddings if embeddings is not None else graph.art.attr("embeddings_path")
    if path is None or not Path(path).exists():
        why = (f"the embeddings the graph was built from are not at {path}" if path else
               "the graph does not say where its embeddings are")
        return None, {"on": False, "why": f"{why}; pass {option('--embeddings')} to use the read-out"}
    emb = embedding_matrix(path, graph).astype(np.float32)
    return emb, {"on": True, "embeddings": str(Path(path).resolve()), "dim": int(emb.shape[1]),
                 "bytes": int(emb.nbytes)}


def init_state(graph, clusters, out, *, config=None, embeddings=None, progress: Progress = no_progress,
               durable: bool = True, covariates: bool = True, **flags) -> dict:
    """A new STATE directory at step 0 from a graph and its clusters (``flags``: ``preset``, ``keep``,
    ``keep_every``, ``snapshot_every`` and
    any setting of ``graphdiff_cli.settings``; None = not given). The STATE keeps the graph's directed kNN
    lists and names the embeddings it was built from (``embeddings``, else where build-graph read them),
    which ``graphdiff extend`` needs, and the covariates embed wrote there unless ``covariates`` is False
    (``stages.covariates.state_covariates``)."""
    from .covariates import state_covariates
    from .prompt_set import init_model_extras

    from ..estimator import Estimator
    from ..io.readers import read_inputs

    t0 = time.perf_counter()
    out = Path(out)
    settings, retention = init_settings(config, **flags)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise StateError(f"{out}: already exists and is not empty; choose another {option('--out', 'path')} or remove it")
    progress(0, 3)
    inp = read_inputs(graph, clusters)
    g_hash, c_hash = inp.graph.art.content_hash, inp.clusters.art.content_hash
    progress(1, 3)
    cov, cov_info, cov_entry = state_covariates(inp.graph, embeddings, settings, covariates)
    model_arrays, model_attrs = init_model_extras(inp.graph, embeddings, covariates=cov_entry)
    emb, readout = readout_embeddings(inp.graph, embeddings, settings)
    est = Estimator(inp.w, inp.labels, n_states=inp.k, embeddings=emb, settings=settings,
                    covariates=None if cov is None else cov.features,
                    reference_rate=None if cov is None else cov.reference)
    progress(2, 3)
    sd = StateDir.create(out, est.state_dict(copy=False), inp.ids, keep=retention.keep,
                         keep_every=retention.keep_every, snapshot_every=retention.snapshot_every, durable=durable,
                         inputs={"graph": g_hash, "clusters": c_hash},
                         model_arrays=model_arrays, model_attrs=model_attrs,
                         init_entry={"graph": str(graph), "graph_hash": g_hash,
                                     "clusters": str(clusters), "clusters_hash": c_hash})
    progress(3, 3)
    return {"command": "init", "state": str(out), "step": 0, "n_prompts": len(inp.ids), "states": inp.k,
            "edges": int(inp.w.nnz // 2), "keep": retention.keep, "keep_every": retention.keep_every,
            "snapshot_every": retention.snapshot_every, "config": {"n_states": inp.k, **settings.as_dict()},
            "model_hash": sd.model()[0].content_hash, "device": str(est.device_), "readout": readout,
            "covariates": cov_info, "timings": {"total_s": time.perf_counter() - t0}}


# ------------------------------------------------------------------------------------------- update

def _same_outcomes(outcomes, success_threshold: float | None, id_field: str):
    """A test ``same(log line) -> bool``: whether the step of that line was applied from these outcomes (the same
    (id, n, s) rows under the same threshold, whatever their order, key order, format or id column; a line
    written before the content hash was kept: the same bytes and id column, as it was matched then). None when
    the file cannot be read (then it is no step's outcomes)."""
    from ..io.outcomes import read_outcomes

    try:
        parsed = read_outcomes(outcomes, success_threshold=success_threshold, id_field=id_field)
        content, digest = parsed.content_hash, parsed.hash
    except (GraphdiffError, OSError):  # not readable as outcomes: only its bytes can match a step
        try:
            content, digest = None, hash_file(outcomes)
        except OSError:  # gone or unreadable
            return None

    def same(e: dict) -> bool:
        if not e.get("step") or e.get("revision") or e.get("event") is not None:
            return False
        if e.get("success_threshold") != success_threshold:
            return False
        if e.get("outcomes_content") is not None and content is not None:
            return e["outcomes_content"] == content
        return e.get("outcomes_hash") == digest and e.get("id_field", "id") == id_field

    return same


def _noop(sd, entry: dict, t0: float) -> dict:
    return {"command": "update", "state": str(sd.root), "step": entry["step"], "noop": True,
            **{k: entry.get(k) for k in ("outcomes", "outcomes_hash", "outcomes_content", "schema", "rows",
                                         "prompts", "rollouts", "successes", "success_threshold", "iterations",
                                         "converged", "elbo", "applied_at")},
            "pruned": [], "retained": sd.retained_steps(), "durability_unknown": False,
            "timings": {"total_s": time.perf_counter() - t0}}


def _refuse_or_noop(sd, step: int, cur: int, outcomes, success_threshold: float | None, t0: float,
                    id_field: str) -> dict:
    """For an update of ``step`` != ``cur`` + 1: the no-op result when ``step`` is the last applied step and
    was applied from these very outcomes (a trainer's retry after a crash, or a signal that came after the
    commit: one streamed read of the log), else the refusal, naming the step these outcomes were applied as
    when they were."""
    same = _same_outcomes(outcomes, success_threshold, id_field) if step >= 1 else None
    if same is None:
        raise step_refusal(sd.root, step, cur)
    if step == cur:
        entry = sd.log_entry((cur, 0))
        if same(entry):
            return _noop(sd, entry, t0)
    matches = [e for e in reversed(sd.log_entries(upto=sd.current_version())) if same(e)]  # a refusal: rare
    same_step = [e for e in matches if e["step"] == step]
    raise step_refusal(sd.root, step, cur, applied_as=same_step[0]["step"] if same_step else
                       matches[0]["step"] if matches else None)


def _step_outcomes_hash(sd, step: int) -> str | None:
    """The hash of the outcomes update ``step`` was applied from (its revision-0 artifact's, kept with every
    revision of a retained step), or None."""
    from ..io.estimator_store import STEP_KIND
    from ..io.layout import step_relpath

    try:
        return read_artifact(sd.root / step_relpath(step, 0), STEP_KIND).inputs.get("outcomes")
    except ArtifactError:
        return None


def already_applied_refusal(root, step: int, cur: int, applied_as: int | None = None) -> AlreadyAppliedError:
    """The refusal of an update of ``step`` <= ``cur``; ``applied_as``: the step these outcomes were applied as,
    when they were."""
    if applied_as == step:
        what = f"step {step} is already applied, from these very outcomes"
    elif applied_as is not None:
        what = f"step {step} is already applied from other outcomes; these are the outcomes of step {applied_as}"
    else:
        what = f"step {step} is already applied from other outcomes"
    return AlreadyAppliedError(f"{root}: {what} (the current step is {cur}; the next update is step {cur + 1}); "
                               f"to redo step {step} run "
                               f"{either(f'graphdiff rollback --to {step - 1}', f'State.rollback({step - 1})')} first")


def step_refusal(root, step: int, cur: int, applied_as: int | None = None) -> StateError:
    """The refusal of an update of ``step`` onto a STATE at step ``cur`` (step != cur + 1); ``applied_as``: the
    step these outcomes were applied as, when they were."""
    if step <= cur:
        return already_applied_refusal(root, step, cur, applied_as)
    also = f"; these are the outcomes of step {applied_as}, already applied" if applied_as is not None else ""
    return StepGapError(f"{root}: step {step} would skip step{'s' if step - cur > 2 else ''} "
                      f"{cur + 1}{'..' + str(step - 1) if step - cur > 2 else ''}: the current step is {cur}, "
                      f"the next update must be step {cur + 1}{also}")


def check_update(step: int, success_threshold: float | None, id_field: str, lock_timeout: float):
    """(the threshold, the id field) of an update of ``step``, checked before anything is read."""
    from ..io.outcomes import check_threshold
    from ..io.tables import check_id_field

    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise InvalidArgumentError(f"{option('--step')} must be an integer >= 1 (step 0 is init), got {step!r}")
    success_threshold = check_threshold(success_threshold)
    id_field = check_id_field(id_field)
    check_lock_timeout(lock_timeout)
    return success_threshold, id_field


def refuse_or_noop(sd, step: int, outcomes, success_threshold: float | None, t0: float, id_field: str) -> dict | None:
    """None when ``step`` is the STATE's next step; else the no-op result or the refusal (``_refuse_or_noop``)."""
    cur = sd.current_step
    return None if step == cur + 1 else _refuse_or_noop(sd, step, cur, outcomes, success_threshold, t0, id_field)


def read_step_outcomes(outcomes, index, success_threshold: float | None, id_field: str):
    """The outcomes file parsed against the prompts of ``index`` (an unknown id is refused with its line)."""
    from ..io.outcomes import read_outcomes

    return read_outcomes(outcomes, success_threshold=success_threshold, id_field=id_field, index=index)


def step_warnings(sd, step: int, outcomes, parsed, live_on: bool = True) -> list[str]:
    """The warnings of applying ``parsed`` as ``step``: the file's own, live features the estimator does not read
    (``live_on``: its read-out of live features is on), and outcomes delivered twice (the same as the last applied
    step's: one streamed read of the log's line)."""
    cur = step - 1
    warnings = [f"step {step}: {w}" for w in parsed.warnings]
    if parsed.live is not None and not live_on:
        warnings.append(f"step {step}: the outcomes' live features are not used: this STATE's live_readout is off "
                        "(its settings; the paper preset leaves it off)")
    last = sd.log_entry((cur, 0)) if cur > 0 else None  # the line of update cur (streamed, not held)
    if last is not None and last.get("step") == cur and not last.get("revision") and (
            last.get("outcomes_content") == parsed.content_hash if last.get("outcomes_content") is not None
            else _step_outcomes_hash(sd, cur) == parsed.hash):
        warnings.append(f"step {step}: {outcomes} holds the same outcomes as step {cur} was applied from (a "
                        f"file delivered twice?); applied as step {step} all the same ("
                        f"{either(f'graphdiff rollback --to {cur}', f'State.rollback({cur})')} undoes it)")
    return warnings


def apply_step(est, nodes: np.ndarray, parsed, *, root, step: int, outcomes, success_threshold: float | None,
               id_field: str) -> tuple[object, dict]:
    """One training step: (the estimator at step - 1, the step's parsed outcomes and their node indices) ->
    (the estimator at ``step``, updated in place, and the step's log entry). Reads and writes no file."""
    if est.step_ != step - 1:
        raise ArtifactError(f"{root}: CURRENT says step {step - 1} but its state holds step {est.step_}")
    t = time.perf_counter()
    stats = est.update(nodes, parsed.n, parsed.s, live=parsed.live)  # live: the outcomes' live column, if any
    elbo = stats["elbo"]
    entry = {"outcomes": str(Path(outcomes).resolve()), "outcomes_hash": parsed.hash,
             "outcomes_content": parsed.content_hash, "schema": parsed.schema, "rows": parsed.n_rows, "prompts": len(parsed.ids),
             "rollouts": int(parsed.n.sum()), "successes": int(parsed.s.sum()),
             "success_threshold": success_threshold, **({"id_field": id_field} if id_field != "id" else {}),
             "iterations": stats["iterations"],
             "converged": bool(stats["converged"]), "elbo": float(elbo[-1]) if len(elbo) else None,
             "inference_s": round(time.perf_counter() - t, 4)}
    return est, entry


def update_result(sd, step: int, entry: dict, pruned: list[int], warnings: list[str], *, t0: float, t_infer: float,
                  timings: dict) -> dict:
    """The result of update ``step``, committed with the log ``entry`` (what pruning and the disk say added to
    ``warnings``); ``timings``: the phases measured before the estimator's update ended at ``t_infer``."""
    if sd.prune_skipped:  # pruning never stops a committed step: say why it did not run
        warnings.append(f"{sd.prune_skipped}; nothing is pruned until then")
    durability = sd.durability()  # applied (a retry is the no-op), but the disk may not hold it
    warnings += durability.pop("warnings")
    t_write = time.perf_counter()
    return {"command": "update", "state": str(sd.root), "step": step, **entry, "pruned": pruned,
            "warnings": warnings, **durability,
            "retained": sd.retained_steps(),
            "timings": {**timings, "write_s": t_write - t_infer, "total_s": time.perf_counter() - t0}}


# ------------------------------------------------------------------------------------------ predict

def candidate_rows(index, retired: np.ndarray, ids=None, *, ids_file=None,
                   id_field: str = "id") -> tuple[list[str], np.ndarray]:
    """(ids, node indices) by ``index`` (an ``IdIndex`` of one version's prompts, ``retired`` its retired node
    indices): the prompts ``ids`` (a list) or of ``ids_file`` (a table's ids read from ``id_field``), retired or
    not, else every candidate (retired prompts left out)."""
    from ..io.readers import id_nodes

    if ids_file is not None or ids is not None:
        return id_nodes(ids_file if ids_file is not None else ids, index, unique=False, id_field=id_field)[:2]
    rows = np.arange(len(index), dtype=np.int64)[active_rows(np.arange(len(index)), retired)]
    return ([index.ids[r] for r in rows] if retired.size else list(index.ids)), rows


def estimates(est, index, retired: np.ndarray, ids=None, *, group_size: int = DEFAULT_GROUP_SIZE,
              live: dict | None = None) -> dict:
    """Every estimate (``PREDICT_COLUMNS``) of the prompts ``ids`` (every candidate when None) by the estimator
    ``est`` of the version whose prompts ``index`` holds, as arrays; ``live``: {id: live features} (``io.live``)."""
    from ..io.live import live_matrix

    ids, rows = candidate_rows(index, retired, ids)
    res = est.estimates(rows, group_size=group_size, live=live_matrix(live, ids))
    return {"id": ids, **{c: np.asarray(res[c]) for c in PREDICT_COLUMNS[1:]}}


def check_predict(out, fmt: str | None, group_size: int, id_field: str) -> tuple[int, str, str]:
    """(group size, id field, format) of a predict, checked before the estimator is read."""
    from ..core.beta import check_group_size
    from ..io.tables import check_id_field, detect_format

    group_size = check_group_size(group_size, option("--group-size"))
    id_field = check_id_field(id_field)
    return group_size, id_field, detect_format(out, fmt)


def predict(est, index, retired: np.ndarray, out, *, root, ids_file=None, fmt: str, group_size: int,
            id_field: str = "id", progress: Progress = no_progress, t0: float, t_import: float, t1: float,
            live: dict | None = None) -> dict:
    """Write every candidate's (or ``ids_file``'s) estimates by the estimator ``est`` (of the version whose
    prompts ``index`` holds, read since ``t1``; ``check_predict`` checked the rest) to ``out``, atomically;
    ``live``: {id: live features} (``io.live``)."""
    from ..io.live import live_matrix
    from ..io.tables import write_rows

    ids, rows = candidate_rows(index, retired, ids_file=ids_file, id_field=id_field)
    t_load = time.perf_counter()
    progress(1, 3)
    res = est.estimates(rows, group_size=group_size, live=live_matrix(live, ids))
    t_infer = time.perf_counter()
    progress(2, 3)
    cols = {"id": list(ids), **{c: np.asarray(res[c]).tolist() for c in PREDICT_COLUMNS[1:]}}
    records = (dict(zip(PREDICT_COLUMNS, vals)) for vals in zip(*(cols[c] for c in PREDICT_COLUMNS)))
    write_rows(out, records, fmt, PREDICT_COLUMNS)  # streamed: one row dict at a time
    t_write = time.perf_counter()
    progress(3, 3)
    p = np.asarray(res["p"])
    return {"command": "predict", "state": str(root), "step": est.step_, "out": str(out), "format": fmt,
            "rows": len(ids), "retired": int(retired.size), "group_size": group_size,
            "columns": PREDICT_COLUMNS, "p_mean": float(p.mean()) if p.size else None,
            "timings": {"import_s": t_import, "load_s": t_load - t1, "inference_s": t_infer - t_load,
                        "write_s": t_write - t_infer, "total_s": time.perf_counter() - t0}}


# ------------------------------------------------------------------------------------ status, rollback

def status(sd, *, last: int = 10) -> dict:
    """What a STATE directory (a ``StateDir``) holds: current step, N, K, config, the last applied steps, the retained
    states, and how its prompt set changed (prompts added per step, retired prompts)."""
    # one read of CURRENT for the whole report (a writer may commit meanwhile): the version it names, its
    # artifact checked as predict would check it, its model, and the log and retained versions up to it; read
    # again whole if a rollback moved CURRENT back and cut the log under it
    return sd.consistent(lambda *pointer: _status(sd, sd.view(*pointer), last))


def _status(sd, view, last: int) -> dict:
    (step, rev), rel, art, (m_art, ids, w, labels, config) = view
    entries = sd.log_entries(upto=(step, rev))
    retained = sd.retained_versions((step, rev))

    retired = int(art.array(RETIRED).size) if has_array(art, RETIRED) else 0
    joined = m_art.array(JOINED) if has_array(m_art, JOINED) else np.zeros(len(ids), np.int64)
    steps, counts = np.unique(joined, return_counts=True)
    from ..settings import from_dict, inert_settings, preset_of

    settings = from_dict({k: v for k, v in config.items() if k != "n_states"})
    # every setting as it acts (a STATE written before a setting existed has it at the field's value, e.g. no
    # read-out), so that preset_of names what differs from the preset
    preset, overrides = preset_of({"n_states": config["n_states"], **settings.as_dict()})
    inert = sorted(inert_settings(settings))
    readout_on = settings.readout is not None and "embeddings" in m_art.names
    return {"command": "status", "preset": preset, "overrides": overrides, "inert": inert, "state": str(sd.root),
            "readout_on": readout_on,
            "step": step, "revision": rev, "current": rel,
            "n_prompts": len(ids), "active": len(ids) - retired, "retired": retired,
            "joined": {str(int(t)): int(c) for t, c in zip(steps, counts)},
            "states": int(config["n_states"]), "edges": int(w.nnz // 2), "config": config,
            "keep": (ret := sd.retention).keep, "keep_every": ret.keep_every, "snapshot_every": ret.snapshot_every,
            "disk_bytes": sd.disk_bytes(),
            "model_hash": m_art.content_hash, "inputs": m_art.inputs, "retained": sorted({t for t, _r in retained}),
            "retained_versions": [f"{t}.{r}" if r else str(t) for t, r in retained],
            "applied": entries[-last:] if last > 0 else [],
            "n_applied": sum(1 for e in entries if e.get("step", 0) > 0 and not e.get("revision"))}


def retention(sd, *, keep: int | None = None, keep_every: int | None = None, snapshot_every: int | None = None,
              lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> dict:
    """Which states a STATE directory (a ``StateDir``) keeps (the last ``keep`` steps and every multiple of
    ``keep_every``), how often an update writes q whole (``snapshot_every``), and its disk use; given any, set
    it (under its lock) and prune by it at once."""
    given = {k: v for k, v in (("keep", keep), ("keep_every", keep_every), ("snapshot_every", snapshot_every))
             if v is not None}
    try:
        before = sd.retention
    except ArtifactError:  # a damaged retention.json: giving keep and keep_every rewrites it
        if keep is None or keep_every is None:
            raise
        before = None
    pruned: list[int] = []
    if given:
        check_lock_timeout(lock_timeout)
        with sd.locked(lock_timeout):
            if before is not None:  # again under the lock: another writer's change of the other numbers stays
                before = sd.retention
            new = dataclasses.replace(before or Retention(), **given)
            pruned = sd.set_retention(new)
    # set_retention's own pruning (prune_skipped may otherwise hold an earlier commit's)
    warnings = [f"{sd.prune_skipped}; nothing is pruned until then"] if given and sd.prune_skipped else []
    now = sd.retention

    def numbers(r):
        return {"keep": r.keep, "keep_every": r.keep_every, "snapshot_every": r.snapshot_every}

    return {"command": "retention", "state": str(sd.root), **numbers(now),
            "previous": None if before is None else numbers(before), "pruned": pruned, "warnings": warnings,
            "retained": sd.retained_steps(), "disk_bytes": sd.disk_bytes()}


def parse_version(to) -> tuple[int, int | None]:
    """``--to`` of rollback: T (step T's newest retained revision) or T.R (revision R of step T)."""
    if isinstance(to, int) and not isinstance(to, bool):
        return to, None
    text = str(to).strip()
    head, dot, tail = text.partition(".")
    if not head.isdigit() or (dot and not tail.isdigit()):
        raise InvalidArgumentError(f"{option('--to')} must be a step T or a revision T.R (integers >= 0), got {to!r}")
    return int(head), (int(tail) if dot else None)


def rollback_result(sd, before: tuple[int, int], now: tuple[int, int], removed: list[int]) -> dict:
    """The result of a rollback from version ``before`` to ``now`` that removed the steps ``removed``."""
    return {"command": "rollback", "state": str(sd.root), "step": now[0], "revision": now[1],
            "previous_step": before[0], "previous_revision": before[1], "removed": removed,
            "removed_versions": sd.removed_versions,
            "retained": sd.retained_steps(), "next_step": now[0] + 1, **sd.durability()}
