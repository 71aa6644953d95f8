"""The step handoff between a trainer and graphdiff: init, update, predict, status, rollback.

A trainer loop calls, once::

    graphdiff init --graph G.zarr --clusters C.zarr --out STATE

and then at every training step T = 1, 2, ...::

    graphdiff update --state STATE --step T --outcomes outcomes_T.jsonl
    graphdiff predict --state STATE --out predictions.jsonl

Each function here reads, checks everything, and only then writes (through ``io.state_dir``), so a
refused request changes nothing. They return a JSON-able result dict and report progress through
``progress(done, total)``; nothing here prints. The STATE format is specified in docs/handoff.md.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import ArtifactError, DataError, InvalidArgumentError, StateError
from ..io.artifacts import hash_file, read_artifact
from ..io.state_dir import DEFAULT_KEEP, StateDir, check_keep

Progress = Callable[[int, int], None]

PREDICT_COLUMNS = ["id", "p", "difficulty", "p_model", "uncertainty", "mean", "variance", "n_seen", "p_zero_variance"]

# init's settings: the estimator's hyper-parameters plus the STATE's retention. Types say how a value
# from the YAML config file is checked ("int?" = an integer or null).
SETTINGS = {"beta": "float", "epsilon": "float", "gamma": "float", "window": "int?", "schedule": "str",
            "device": "str", "max_iters": "int", "tol": "float", "residual_tol": "float", "dtype": "str",
            "mixing": "str", "prior_strength": "float|auto", "belief_strength": "float|auto",
            "prompt_forgetting": "float",
            "state_forgetting": "float", "state_prior": "str", "neighbor_smoothing": "float?", "keep": "int",
            "preset": "str"}


def _noop(done, total=None):
    return None


def _import_torch() -> float:
    """Import torch up front (seconds taken), so that load_s times reading the state, not the import."""
    t = time.perf_counter()
    import torch  # noqa: F401

    return time.perf_counter() - t


# ------------------------------------------------------------------------------------------- config

def _check_value(key: str, value, where: str):
    kind = SETTINGS[key]
    if kind in ("int?", "float?") and value is None:
        return None
    if kind == "float|auto":
        if value == "auto":
            return value
        if isinstance(value, str):  # from the command line
            try:
                value = float(value)
            except ValueError:
                raise InvalidArgumentError(f"{where}: {key} must be a number or 'auto', got {value!r}") from None
        kind = "float"
    if kind in ("int", "int?"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgumentError(f"{where}: {key} must be an integer{' or null' if kind == 'int?' else ''}, "
                                       f"got {value!r}")
        return int(value)
    if kind in ("float", "float?"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InvalidArgumentError(f"{where}: {key} must be a finite number{' or null' if kind == 'float?' else ''}"
                                       f", got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{where}: {key} must be a string, got {value!r}")
    return value


def read_config(path) -> dict:
    """Settings from a YAML mapping of init's option names (``max-iters`` or ``max_iters``).

    Unknown keys and values of the wrong type are refused with the file and line.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise InvalidArgumentError(f"{path}: no such config file")
    try:
        text = path.read_text(encoding="utf-8")
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise DataError(f"{path}{line}: malformed YAML ({getattr(exc, 'problem', None) or exc})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"{path}:1: expected a mapping of settings, got {type(data).__name__}")
    lines = {}
    if isinstance(node, yaml.MappingNode):
        for k_node, _ in node.value:
            lines[str(k_node.value)] = k_node.start_mark.line + 1
    out = {}
    for raw_key, value in data.items():
        key = str(raw_key).replace("-", "_")
        where = f"{path}:{lines.get(str(raw_key), 1)}"
        if key not in SETTINGS:
            raise InvalidArgumentError(f"{where}: unknown setting {raw_key!r}; known: "
                                       f"{', '.join(k.replace('_', '-') for k in SETTINGS)}")
        out[key] = _check_value(key, value, where)
    return out


def resolve_settings(config_file=None, **flags) -> dict:
    """The preset's values < the config file < flags given on the command line (None = not given).

    The preset is the flag ``preset``, else the file's ``preset`` key, else "default" (see
    ``graphdiff_cli.estimator.PRESETS``); the result holds every setting but the preset's name.
    """
    from ..estimator import preset_settings

    from_file = read_config(config_file) if config_file is not None else {}
    preset = flags.pop("preset", None) or from_file.pop("preset", None) or "default"
    settings = {**preset_settings(preset), "keep": DEFAULT_KEEP}
    settings.update(from_file)
    for key, value in flags.items():
        if key not in SETTINGS:
            raise InvalidArgumentError(f"unknown setting {key!r}")
        if value is not None:
            settings[key] = _check_value(key, value, f"--{key.replace('_', '-')}")
    return settings


# --------------------------------------------------------------------------------------------- init

def _read_inputs(graph_path, clusters_path):
    from .prepare import read_graph

    g_art, ids, w, _knn = read_graph(graph_path)
    c_art = read_artifact(clusters_path, "clusters")
    made_from = c_art.inputs.get("graph")
    if made_from != g_art.content_hash:
        raise DataError(f"{clusters_path}: these clusters were made from graph {made_from}, not from {graph_path} "
                        f"(content hash {g_art.content_hash}); run graphdiff cluster on this graph")
    c_ids = [str(x) for x in c_art.array("ids")]
    if c_ids != ids:
        if len(c_ids) != len(ids):
            raise DataError(f"{clusters_path}: {len(c_ids)} prompt ids, but {graph_path} has {len(ids)}")
        i = next(j for j, (a, b) in enumerate(zip(c_ids, ids)) if a != b)
        raise DataError(f"{clusters_path}: prompt ids differ from {graph_path}'s at row {i} "
                        f"({c_ids[i]!r} vs {ids[i]!r})")
    labels = c_art.array("labels")
    k = c_art.params.get("states")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ArtifactError(f"{clusters_path}: params.states is {k!r}, expected the number of states K >= 1")
    if labels.shape != (len(ids),) or labels.dtype.kind not in "iu":
        raise ArtifactError(f"{clusters_path}: labels must be {len(ids)} integers, got {labels.dtype} {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= k):
        raise ArtifactError(f"{clusters_path}: labels outside [0, {k}); re-run graphdiff cluster")
    return g_art, c_art, ids, w, labels.astype(np.int64), int(k)


def init_state(graph, clusters, out, *, config=None, progress: Progress = _noop, durable: bool = True,
               **flags) -> dict:
    """A new STATE directory at step 0 from a graph and its clusters (``flags``: see ``SETTINGS``)."""
    from ..estimator import Estimator

    t0 = time.perf_counter()
    out = Path(out)
    settings = resolve_settings(config, **flags)
    keep = check_keep(settings.pop("keep"))
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise StateError(f"{out}: already exists and is not empty; choose another --out or remove it")
    progress(0, 3)
    g_art, c_art, ids, w, labels, k = _read_inputs(graph, clusters)
    progress(1, 3)
    est = Estimator(w, labels, n_states=k, **settings)
    progress(2, 3)
    sd = StateDir.create(out, est, ids, keep=keep, durable=durable,
                         inputs={"graph": g_art.content_hash, "clusters": c_art.content_hash},
                         init_entry={"graph": str(graph), "graph_hash": g_art.content_hash,
                                     "clusters": str(clusters), "clusters_hash": c_art.content_hash})
    progress(3, 3)
    return {"command": "init", "state": str(out), "step": 0, "n_prompts": len(ids), "states": k,
            "edges": int(w.nnz // 2), "keep": keep, "config": asdict(est.config),
            "model_hash": sd.model()[0].content_hash, "device": str(est.device_),
            "timings": {"total_s": time.perf_counter() - t0}}


# ------------------------------------------------------------------------------------------- update

def _step_refusal(root, step: int, cur: int) -> StateError:
    if step <= cur:
        return StateError(f"{root}: step {step} is already applied (the current step is {cur}; the next update "
                          f"is step {cur + 1}); to redo it run graphdiff rollback --to {step - 1} first")
    return StateError(f"{root}: step {step} would skip step{'s' if step - cur > 2 else ''} "
                      f"{cur + 1}{'..' + str(step - 1) if step - cur > 2 else ''}: the current step is {cur}, "
                      f"the next update must be step {cur + 1}")


def update_state(state, step: int, outcomes, *, success_threshold: float = 1.0, lock_timeout: float = 600.0,
                 device: str | None = None, progress: Progress = _noop, durable: bool = True) -> dict:
    """Apply training step ``step`` (= current + 1) with the outcomes file; see docs/handoff.md."""
    from ..io.outcomes import check_threshold, read_outcomes

    t0 = time.perf_counter()
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise InvalidArgumentError(f"--step must be an integer >= 1 (step 0 is init), got {step!r}")
    check_threshold(success_threshold)
    if not lock_timeout >= 0:
        raise InvalidArgumentError(f"--lock-timeout must be >= 0 seconds, got {lock_timeout!r}")
    sd = StateDir.open(state)
    cur = sd.current_step
    if step != cur + 1:  # fail fast, before parsing; checked again under the lock
        raise _step_refusal(sd.root, step, cur)
    progress(0, 4)
    t_import = _import_torch()
    t1 = time.perf_counter()
    index = sd.id_index()  # model.zarr never changes after init: safe to read before the lock
    t_model = time.perf_counter() - t1
    parsed = read_outcomes(outcomes, success_threshold=success_threshold)
    nodes = parsed.node_indices(index)
    outcomes_hash = hash_file(outcomes)
    t_parse = time.perf_counter()
    progress(1, 4)
    with sd.locked(lock_timeout):
        t_locked = time.perf_counter()
        cur = sd.current_step
        if step != cur + 1:  # another writer moved on while we waited
            raise _step_refusal(sd.root, step, cur)
        est = sd.load_estimator(device=device)
        if est.step_ != cur:
            raise ArtifactError(f"{sd.root}: CURRENT says step {cur} but its state holds step {est.step_}")
        t_load = time.perf_counter()
        progress(2, 4)
        stats = est.update(nodes, parsed.n, parsed.s)
        t_infer = time.perf_counter()
        progress(3, 4)
        elbo = stats["elbo"]
        entry = {"outcomes": str(Path(outcomes).resolve()), "outcomes_hash": outcomes_hash,
                 "schema": parsed.schema, "rows": parsed.n_rows, "prompts": len(parsed.ids),
                 "rollouts": int(parsed.n.sum()), "successes": int(parsed.s.sum()),
                 "success_threshold": float(success_threshold), "iterations": stats["iterations"],
                 "converged": bool(stats["converged"]), "elbo": float(elbo[-1]) if len(elbo) else None,
                 "inference_s": round(t_infer - t_load, 4)}
        pruned = sd.commit_step(est, entry, durable=durable)
        t_write = time.perf_counter()
        progress(4, 4)
    return {"command": "update", "state": str(sd.root), "step": step, **entry, "pruned": pruned,
            "retained": sd.retained_steps(),
            "timings": {"import_s": t_import, "parse_s": t_parse - t1 - t_model, "lock_wait_s": t_locked - t_parse,
                        "load_s": t_model + t_load - t_locked, "inference_s": t_infer - t_load,
                        "write_s": t_write - t_infer, "total_s": time.perf_counter() - t0}}


# ------------------------------------------------------------------------------------------ predict

def read_id_list(path, index: dict[str, int]) -> tuple[list[str], np.ndarray]:
    """(ids, node indices) of an ids file: a table with an ``id`` column (.jsonl/.csv/.tsv/.parquet)
    or plain text with one id per line (blank lines skipped). Unknown ids are refused with the line."""
    from ..io.tables import as_id, read_rows

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such ids file")
    pairs: list[tuple[int, str]] = []
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet", ".pq"):
        for line_no, row in read_rows(path):
            if "id" not in row:
                raise DataError(f"{path}:{line_no}: no 'id' column")
            pairs.append((line_no, as_id(row["id"], path, line_no, "id")))
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise DataError(f"{path}: not UTF-8 text") from None
        pairs = [(i, line.strip()) for i, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not pairs:
        raise DataError(f"{path}: no ids")
    rows = np.empty(len(pairs), dtype=np.int64)
    for j, (line_no, pid) in enumerate(pairs):
        i = index.get(pid)
        if i is None:
            raise DataError(f"{path}:{line_no}: unknown prompt id {pid!r} (not in the state's prompts)")
        rows[j] = i
    return [pid for _, pid in pairs], rows


def predict(state, out, *, ids_file=None, fmt: str | None = None, group_size: int = 8, device: str | None = None,
            progress: Progress = _noop) -> dict:
    """Write every prompt's (or ``ids_file``'s) estimates at the current step to ``out``, atomically."""
    from ..io.tables import detect_format, write_rows

    t0 = time.perf_counter()
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise InvalidArgumentError(f"--group-size must be an integer >= 1, got {group_size!r}")
    fmt = detect_format(out, fmt)
    sd = StateDir.open(state)
    progress(0, 3)
    t_import = _import_torch()
    t1 = time.perf_counter()
    all_ids = sd.ids
    if ids_file is not None:
        ids, rows = read_id_list(ids_file, sd.id_index())
    else:
        ids, rows = all_ids, np.arange(len(all_ids), dtype=np.int64)
    est = sd.load_estimator(device=device)
    t_load = time.perf_counter()
    progress(1, 3)
    res = est.estimates(rows, group_size=group_size)
    t_infer = time.perf_counter()
    progress(2, 3)
    cols = {"id": list(ids), **{c: np.asarray(res[c]).tolist() for c in PREDICT_COLUMNS[1:]}}
    records = (dict(zip(PREDICT_COLUMNS, vals)) for vals in zip(*(cols[c] for c in PREDICT_COLUMNS)))
    write_rows(out, records, fmt, PREDICT_COLUMNS)  # streamed: one row dict at a time
    t_write = time.perf_counter()
    progress(3, 3)
    p = np.asarray(res["p"])
    return {"command": "predict", "state": str(sd.root), "step": est.step_, "out": str(out), "format": fmt,
            "rows": len(ids), "group_size": group_size, "columns": PREDICT_COLUMNS,
            "p_mean": float(p.mean()) if p.size else None,
            "timings": {"import_s": t_import, "load_s": t_load - t1, "inference_s": t_infer - t_load,
                        "write_s": t_write - t_infer, "total_s": time.perf_counter() - t0}}


# ------------------------------------------------------------------------------------ status, rollback

def status(state, *, last: int = 10) -> dict:
    """What a STATE holds: current step, N, K, config, the last applied steps, the retained states."""
    sd = StateDir.open(state)
    step, rel = sd.current()
    m_art, ids, w, labels, config = sd.model()
    entries = sd.log_entries(upto=step)
    return {"command": "status", "state": str(sd.root), "step": step, "current": rel, "n_prompts": len(ids),
            "states": int(config["n_states"]), "edges": int(w.nnz // 2), "config": config, "keep": sd.keep,
            "model_hash": m_art.content_hash, "inputs": m_art.inputs, "retained": sd.retained_steps(),
            "applied": entries[-last:] if last > 0 else [], "n_applied": max(0, len(entries) - 1)}


def rollback(state, to: int, *, lock_timeout: float = 600.0, progress: Progress = _noop) -> dict:
    """Make step ``to`` current again (a trainer resuming from its checkpoint at step ``to``)."""
    sd = StateDir.open(state)
    progress(0, 1)
    with sd.locked(lock_timeout):
        before = sd.current_step
        removed = sd.rollback(to)
    progress(1, 1)
    return {"command": "rollback", "state": str(sd.root), "step": to, "previous_step": before,
            "removed": removed, "retained": sd.retained_steps(), "next_step": to + 1}
