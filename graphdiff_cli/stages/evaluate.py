"""Stages behind ``graphdiff evaluate``, ``graphdiff simulate`` and ``graphdiff diagnose-clusters``.

``evaluate``: read a training log (rows step, id, n, s; string ids matched to the graph's ``ids``), the
graph, clusters and (for VIP) embeddings artifacts; replay the log through graphdiff and the peers'
estimators with no look-ahead (``core.replay``); score them (``core.metrics``); write a report folder
(report.md, metrics.json, plots) atomically: everything goes into a staging folder next to the
destination, which is then renamed into place.

No typer or rich here: progress goes through the ``progress(done, total)`` callback.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import ArtifactError, DataError, InvalidArgumentError

Progress = Callable[..., None]

# method keys accepted by --methods, in report order; oracles last
METHOD_KEYS = ("graphdiff", "history", "discounted", "mopps", "greso", "vip", "labelprop", "sbr", "sbs")
ORACLE_KEYS = ("sbr", "sbs")

DEFAULT_CONFIG = {
    # graphdiff's settings: a preset ("default" unless the section names one) and keys that override it,
    # the same names and rules as `graphdiff init` (graphdiff_cli.estimator.PRESETS)
    "estimator": {"preset": "default"},
    "evaluate": {
        # discounted history: grid searched on the log itself (hindsight tuning: optimistic for it)
        "discounted": {"lambdas": [1.0, 0.95, 0.9, 0.8, 0.7, 0.5], "m": [0.0, 0.5, 1.0, 2.0, 4.0]},
        "mopps": {"lambdas": [1.0, 0.5]},
        "greso": {"tau": 0.25},
        "vip": {"length_scale": 0.4, "noise": 1e-4},
        "oracles": {"probe": "resample", "seed": 0},
    },
}


def _noop(done=None, total=None):
    return None


# ----------------------------------------------------------------------------------------------------
# inputs


def load_config(path) -> dict:
    """DEFAULT_CONFIG updated by a YAML or JSON file's ``estimator`` and ``evaluate`` sections.

    Other top-level sections are ignored (one config file may serve several commands); an unknown key
    inside these two sections is refused, so a typo cannot silently fall back to a default.
    """
    cfg = json.loads(json.dumps(DEFAULT_CONFIG))
    if path is None:
        return _resolve_estimator(cfg, "the default config")
    path = Path(path)
    if not path.is_file():
        raise InvalidArgumentError(f"{path}: no such config file")
    text = path.read_text(encoding="utf-8")
    try:
        import yaml

        user = yaml.safe_load(text) if path.suffix.lower() in (".yaml", ".yml") else json.loads(text)
    except Exception as exc:  # noqa: BLE001 - any parse error is the user's file
        raise InvalidArgumentError(f"{path}: cannot be parsed ({exc.__class__.__name__}: {exc})") from None
    user = user or {}
    if not isinstance(user, dict):
        raise InvalidArgumentError(f"{path}: the config must be a mapping of sections")
    for section in ("estimator", "evaluate"):
        if section not in user or user[section] is None:
            continue
        given = user[section]
        if not isinstance(given, dict):
            raise InvalidArgumentError(f"{path}: section {section!r} must be a mapping")
        for key, value in given.items():
            if section == "estimator":
                cfg[section][key] = value
                continue
            if key not in cfg[section]:
                raise InvalidArgumentError(f"{path}: unknown key {section}.{key}; known: "
                                           f"{', '.join(cfg[section])}")
            if section == "evaluate":
                if not isinstance(value, dict):
                    raise InvalidArgumentError(f"{path}: {section}.{key} must be a mapping")
                for sub in value:
                    if sub not in cfg[section][key]:
                        raise InvalidArgumentError(f"{path}: unknown key {section}.{key}.{sub}; known: "
                                                   f"{', '.join(cfg[section][key])}")
                cfg[section][key].update(value)
    return _resolve_estimator(cfg, str(path))


def _resolve_estimator(cfg: dict, where: str) -> dict:
    """cfg["estimator"] = every setting of the named preset, overridden by the section's own keys;
    cfg["estimator_preset"] = the preset's name."""
    from ..estimator import preset_settings
    from .handoff import SETTINGS, _check_value

    given = dict(cfg["estimator"])
    preset = given.pop("preset", None) or "default"
    if not isinstance(preset, str):
        raise InvalidArgumentError(f"{where}: estimator.preset must be a string, got {preset!r}")
    resolved = preset_settings(preset)
    for key, value in given.items():
        if key not in SETTINGS or key in ("keep", "preset"):
            raise InvalidArgumentError(f"{where}: unknown key estimator.{key}; known: preset, "
                                       f"{', '.join(resolved)}")
        resolved[key] = _check_value(key, value, f"{where}: estimator")
    cfg["estimator"], cfg["estimator_preset"] = resolved, preset
    return cfg


def read_graph_artifact(path):
    """(artifact, ids, W) of a "graph" artifact (arrays ids, indptr, indices, data = W in CSR)."""
    import scipy.sparse as sp

    from ..core.graph import validate_graph
    from ..io.artifacts import read_artifact

    art = read_artifact(path, "graph")
    ids = [str(x) for x in art.array("ids")]
    n = len(ids)
    indptr, indices, data = art.array("indptr"), art.array("indices"), art.array("data")
    if indptr.shape != (n + 1,) or indices.shape != data.shape or (n and indptr[-1] != indices.size):
        raise ArtifactError(f"{path}: CSR arrays do not fit {n} ids; rebuild the graph")
    if indices.size and (indices.min() < 0 or indices.max() >= n):
        raise ArtifactError(f"{path}: CSR column indices out of range; rebuild the graph")
    try:
        w = validate_graph(sp.csr_matrix((data, indices, indptr), shape=(n, n)), n_nodes=n)
    except DataError as exc:
        raise ArtifactError(f"{path}: {exc}") from None
    if len(set(ids)) != n:
        raise ArtifactError(f"{path}: the graph's ids are not unique")
    return art, ids, w


def _aligned(path, art_ids: list[str], graph_ids: list[str], what: str) -> np.ndarray:
    """Row order that puts an artifact's rows in the graph's id order (refusing other id sets)."""
    if art_ids == graph_ids:
        return np.arange(len(graph_ids))
    pos = {pid: i for i, pid in enumerate(art_ids)}
    if len(pos) != len(art_ids) or set(pos) != set(graph_ids):
        missing = next((g for g in graph_ids if g not in pos), None)
        hint = f" (e.g. graph id {missing!r} is not in it)" if missing is not None else ""
        raise ArtifactError(f"{path}: its {what} ids are not the graph's ids{hint}; "
                            "build graph and clusters from the same embeddings")
    return np.array([pos[g] for g in graph_ids], dtype=np.int64)


def read_clusters_artifact(path, graph_ids: list[str]) -> tuple[object, np.ndarray, int]:
    """(artifact, labels in graph order, K) of a "clusters" artifact."""
    from ..io.artifacts import read_artifact

    art = read_artifact(path, "clusters")
    ids = [str(x) for x in art.array("ids")]
    labels = np.asarray(art.array("labels"))
    if labels.shape != (len(ids),) or labels.dtype.kind not in "iu":
        raise ArtifactError(f"{path}: labels must be one integer per id")
    k = art.params.get("states")
    if not isinstance(k, int) or k < 1:
        k = int(labels.max()) + 1 if labels.size else 1
    if labels.size and (labels.min() < 0 or labels.max() >= k):
        raise ArtifactError(f"{path}: labels fall outside [0, K = {k})")
    order = _aligned(path, ids, graph_ids, "clusters")
    return art, labels[order].astype(np.int64), int(k)


def read_embeddings_artifact(path, graph_ids: list[str]) -> np.ndarray:
    """Unit-norm embeddings (float64) in graph order from an "embeddings" artifact."""
    from ..io.artifacts import read_artifact

    art = read_artifact(path, "embeddings")
    ids = [str(x) for x in art.array("ids")]
    x = np.asarray(art.array("embeddings"), dtype=np.float64)
    if x.ndim != 2 or x.shape[0] != len(ids):
        raise ArtifactError(f"{path}: embeddings shape {x.shape} does not match {len(ids)} ids")
    order = _aligned(path, ids, graph_ids, "embeddings")
    x = x[order]
    norms = np.linalg.norm(x, axis=1)
    if not np.all(np.isfinite(x)) or (norms == 0).any():
        raise ArtifactError(f"{path}: embeddings contain zero, NaN or infinite rows")
    return x / norms[:, None]  # stored rows are unit-norm; this only removes float32 rounding


def read_log(path, graph_ids: list[str]) -> dict:
    """Rows step, id, n, s of a JSONL/CSV/Parquet log, ids mapped to graph node indices.

    Rows are stably sorted by step (rows of one step keep their file order). An optional ``p_true``
    column (written by ``graphdiff simulate``) is kept when every row has it.
    """
    from ..io.tables import as_float, as_id, as_int, read_rows

    index = {pid: i for i, pid in enumerate(graph_ids)}
    step, node, n, s, p_true = [], [], [], [], []
    has_truth = True
    for line, row in read_rows(path):
        for field in ("step", "id", "n", "s"):
            if field not in row:
                raise DataError(f"{path}:{line}: no {field!r} field (a log row needs step, id, n, s)")
        pid = as_id(row["id"], path, line, "id")
        if pid not in index:
            raise DataError(f"{path}:{line}: id {pid!r} is not in the graph (the log must use the ids the "
                            "graph was built from)")
        t = as_int(row["step"], path, line, "step")
        nn = as_int(row["n"], path, line, "n")
        ss = as_int(row["s"], path, line, "s")
        if nn < 1:
            raise DataError(f"{path}:{line}: n = {nn}; a row needs at least one rollout")
        if not 0 <= ss <= nn:
            raise DataError(f"{path}:{line}: s = {ss} is outside [0, n = {nn}]")
        step.append(t)
        node.append(index[pid])
        n.append(nn)
        s.append(ss)
        if has_truth and row.get("p_true") not in (None, ""):
            p_true.append(as_float(row["p_true"], path, line, "p_true"))
        else:
            has_truth = False
    if not step:
        raise DataError(f"{path}: the log has no rows")
    order = np.argsort(np.asarray(step), kind="stable")
    out = {k: np.asarray(v, dtype=np.int64)[order] for k, v in (("step", step), ("id", node), ("n", n), ("s", s))}
    out["p_true"] = np.asarray(p_true, dtype=np.float64)[order] if has_truth else None
    return out


# ----------------------------------------------------------------------------------------------------
# methods


def parse_methods(methods) -> list[str]:
    """Method keys from --methods (repeatable, comma-separated); None or "all" -> every method."""
    if not methods:
        return list(METHOD_KEYS)
    keys = []
    for item in methods:
        for key in str(item).split(","):
            key = key.strip().lower()
            if not key:
                continue
            if key == "all":
                return list(METHOD_KEYS)
            if key not in METHOD_KEYS:
                raise InvalidArgumentError(f"unknown method {key!r}; choose from {', '.join(METHOD_KEYS)}")
            if key not in keys:
                keys.append(key)
    if not keys:
        raise InvalidArgumentError("--methods names no method")
    return [k for k in METHOD_KEYS if k in keys]


def tune_discounted(log: dict, n_nodes: int, lambdas, ms) -> tuple[dict, list[dict]]:
    """Replay the (lambda, m) grid of discounted history; best = lowest full-log MAE.

    Returns (best {"lam", "m", "mae"}, grid rows {"lam", "m", "mae", "within_r"}).
    """
    from ..core.baselines import DiscountedHistory
    from ..core.metrics import mae, within_batch
    from ..core.replay import replay

    lambdas = [float(x) for x in lambdas]
    ms = [float(x) for x in ms]
    if not lambdas or not ms:
        raise InvalidArgumentError("the discounted-history grid needs at least one lambda and one m")
    grid = [DiscountedHistory(n_nodes, lam, m, name=f"lam={lam:g},m={m:g}") for lam in lambdas for m in ms]
    res = replay(log["step"], log["id"], log["n"], log["s"], grid, n_nodes=n_nodes)
    rows = []
    for est in grid:
        p = res.predictions[est.name]
        rows.append({"lam": est.lam, "m": est.m, "mae": mae(p, res.rate),
                     "within_r": within_batch(res.step, p, res.rate)["pearson"]})
    best = min(rows, key=lambda r: (r["mae"], -r["lam"], r["m"]))
    return {"lam": best["lam"], "m": best["m"], "mae": best["mae"]}, rows


def build_methods(keys, cfg, w, labels, k, embeddings, n_nodes, tuned=None) -> tuple[list, dict]:
    """Instantiate the requested methods; returns (estimators, {name: description of its settings})."""
    from ..core import baselines as B

    ev, est_cfg = cfg["evaluate"], cfg["estimator"]
    methods, described = [], {}

    def add(m, desc):
        methods.append(m)
        described[m.name] = desc

    for key in keys:
        if key == "graphdiff":
            add(B.GraphdiffAdapter.from_graph(w, labels, k, **est_cfg),
                {"method": "graphdiff", "preset": cfg.get("estimator_preset", "default"), "n_states": k, **est_cfg})
        elif key == "history":
            add(B.HistoryMean(n_nodes), {"method": "per-prompt history mean"})
        elif key == "discounted":
            lam, m = tuned["lam"], tuned["m"]
            add(B.DiscountedHistory(n_nodes, lam, m, name="discounted"),
                {"method": "discounted history", "lam": lam, "m": m, "tuned_on_this_log": True})
        elif key == "mopps":
            for lam in ev["mopps"]["lambdas"]:
                add(B.MoPPS(n_nodes, float(lam)), {"method": "MoPPS", "lam": float(lam)})
        elif key == "greso":
            add(B.GRESO(n_nodes, tau=float(ev["greso"]["tau"])), {"method": "GRESO", "tau": ev["greso"]["tau"]})
        elif key == "vip":
            add(B.VIP(embeddings, length_scale=float(ev["vip"]["length_scale"]), noise=float(ev["vip"]["noise"])),
                {"method": "VIP Gaussian process", **ev["vip"]})
        elif key == "labelprop":
            add(B.LabelPropagation(w), {"method": "label propagation (harmonic function)"})
        elif key == "sbr":
            add(B.SampleBeforeRL(n_nodes, probe=ev["oracles"]["probe"], seed=int(ev["oracles"]["seed"])),
                {"method": "ORACLE sample-before-RL", **ev["oracles"]})
        elif key == "sbs":
            add(B.SampleBeforeStep(n_nodes, probe=ev["oracles"]["probe"], seed=int(ev["oracles"]["seed"]) + 1),
                {"method": "ORACLE sample-before-step", **ev["oracles"]})
    return methods, described


# ----------------------------------------------------------------------------------------------------
# the evaluate stage


def _verdict(metrics: dict) -> list[dict]:
    """graphdiff against each real (non-oracle) baseline on the full log, all rows."""
    from ..core.metrics import HIGHER_IS_BETTER

    methods = metrics["methods"]
    if "graphdiff" not in methods:
        return []
    ours = methods["graphdiff"]["phases"]["full"]["all"]
    rows = []
    for name, m in methods.items():
        if name == "graphdiff" or m["oracle"]:
            continue
        theirs = m["phases"]["full"]["all"]
        row = {"baseline": name}
        for key in ("mae", "batch_r", "within_r", "within_spearman", "brier", "ece", "auroc"):
            a, b = ours[key], theirs[key]
            if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
                row[key] = None
                continue
            better = a > b if HIGHER_IS_BETTER[key] else a < b
            row[key] = {"graphdiff": a, "baseline": b, "graphdiff_better": bool(better and a != b)}
        rows.append(row)
    return rows


def evaluate(log, graph, clusters, out, *, embeddings=None, config=None, methods=None, device: str | None = None,
             counterfactual: bool = False, pool_factor: float = 2.0, seed: int = 0, explore: float | None = None,
             progress: Progress = _noop) -> dict:
    """Replay ``log`` through the chosen methods and write the report folder ``out`` atomically.

    ``counterfactual``: also replay selection and allocation driven by each (non-oracle) method
    (``stages.counterfactual``), with the log's median batch size as B and a pool of ``pool_factor`` x B;
    the target rule at ``explore`` (None: select's default) and at 0.

    Returns the result summary (also stored in metrics.json under "run").
    """
    from ..core.metrics import evaluate_replay
    from ..core.replay import replay
    from .report import to_jsonable, write_report

    t0 = time.perf_counter()
    out = Path(out)
    cfg = load_config(config)
    if device is not None:
        cfg["estimator"]["device"] = device
    keys = parse_methods(methods)
    if counterfactual and explore is not None:
        from ..core.decisions import check_explore

        check_explore(explore)  # before the replays, not after them
    if "vip" in keys and embeddings is None:
        if any("vip" in str(m).lower() for m in (methods or [])):  # asked for by name
            raise InvalidArgumentError("method vip needs prompt embeddings: pass --embeddings EMBED.zarr")
        keys.remove("vip")
    if out.exists() and not out.is_dir():
        raise InvalidArgumentError(f"--out {out} exists and is not a folder")

    gart, ids, w = read_graph_artifact(graph)
    cart, labels, k = read_clusters_artifact(clusters, ids)
    emb = read_embeddings_artifact(embeddings, ids) if embeddings is not None else None
    lg = read_log(log, ids)
    n_nodes = len(ids)

    tuned, grid = None, []
    if "discounted" in keys:
        ev = cfg["evaluate"]["discounted"]
        tuned, grid = tune_discounted(lg, n_nodes, ev["lambdas"], ev["m"])
    ests, described = build_methods(keys, cfg, w, labels, k, emb, n_nodes, tuned)
    progress(0, None)
    res = replay(lg["step"], lg["id"], lg["n"], lg["s"], ests, n_nodes=n_nodes, progress=progress)
    metrics = evaluate_replay(res)

    truth = None
    if lg["p_true"] is not None:
        from ..core.metrics import mae

        truth = {"observed_vs_true_mae": mae(lg["p_true"], res.rate),
                 "methods": {name: mae(res.predictions[name], lg["p_true"]) for name in res.methods}}

    n_steps = int(res.steps.size)
    sizes = np.diff(np.r_[np.flatnonzero(np.r_[True, res.step[1:] != res.step[:-1]]), res.step.size])
    decisions = None
    if counterfactual:
        from .counterfactual import COUNTERFACTUAL_METHODS, run_counterfactual

        progress(0, None)
        decisions = run_counterfactual(lg, cfg, w, labels, k, emb, n_nodes,
                                       methods=[m for m in keys if m in COUNTERFACTUAL_METHODS],
                                       batch_size=int(np.median(sizes)), pool_factor=pool_factor, seed=seed,
                                       explore=explore, progress=progress)
    run = {
        "command": "evaluate", "log": str(log), "graph": str(graph), "clusters": str(clusters),
        "embeddings": None if embeddings is None else str(embeddings), "config": None if config is None else str(config),
        "out": str(out), "n_prompts": n_nodes, "n_states": k, "rows": int(res.step.size), "steps": n_steps,
        "prompts_in_log": int(np.unique(res.ids).size), "batch_size": {"min": int(sizes.min()), "max": int(sizes.max())},
        "seen_rows": int(res.seen.sum()), "methods": res.methods, "oracles": [m for m in res.methods if res.oracle[m]],
        "inputs": {"graph": gart.content_hash, "clusters": cart.content_hash},
    }
    summary_rows = {name: {key: m["phases"]["full"]["all"][key]
                           for key in ("mae", "batch_r", "within_r", "within_spearman", "brier", "ece", "auroc",
                                       "seconds_per_step")}
                    for name, m in metrics["methods"].items()}
    document = {"run": run, "settings": described, "metrics": metrics, "verdict": _verdict(metrics),
                "discounted_grid": grid, "discounted_best": tuned, "ground_truth": truth,
                "counterfactual": decisions}

    staging = out.parent / f".{out.name}.staging-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        staging.mkdir(parents=True)
        files = write_report(staging, document)
        from ..io.artifacts import replace_dir

        replace_dir(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    run["files"] = files
    run["timings"] = {"total_s": time.perf_counter() - t0}
    return to_jsonable({**run, "summary": summary_rows, "verdict": document["verdict"],
                        "discounted_best": tuned})


# ----------------------------------------------------------------------------------------------------
# simulate


def simulate(out_prompts, out_log, *, prompts: int | None = None, steps: int | None = None,
             batch_size: int | None = None, rollouts: int = 8, seed: int = 0, math=None, epochs: int = 3) -> dict:
    """Write a simulated trajectory: prompts (id, prompt, topic, level) and a log (step, id, n, s, p_true).

    Templates (default 2,000 prompts, 100 steps of 128); with ``math`` a MATH JSONL/CSV/Parquet file
    (unique_id, problem, subject, level) whose rows become the prompts (all of them, or a seeded subset
    of ``prompts`` rows in file order), ``epochs`` passes of 256-prompt batches unless ``steps`` is given.
    """
    from ..core import simulate as S
    from ..io.tables import write_rows

    if math is None:
        sim = S.simulate(n_prompts=2000 if prompts is None else prompts, steps=100 if steps is None else steps,
                         batch_size=128 if batch_size is None else batch_size, rollouts=rollouts, seed=seed)
    else:
        from ..io.tables import read_rows

        rows = [row for _, row in read_rows(math)]
        if not rows:
            raise DataError(f"{math}: no rows")
        if prompts is not None:
            if prompts < 1 or prompts > len(rows):
                raise InvalidArgumentError(f"--prompts must lie in [1, {len(rows)}] for {math}, got {prompts}")
            keep = np.sort(np.random.default_rng(seed).choice(len(rows), size=prompts, replace=False))
            rows = [rows[i] for i in keep]
        sim = S.simulate_math(rows, epochs=epochs, batch_size=256 if batch_size is None else batch_size,
                              rollouts=rollouts, seed=seed, steps=steps)
    write_rows(out_prompts, [{k: p[k] for k in ("id", "prompt", "topic", "level")} for p in sim.prompts],
               columns=["id", "prompt", "topic", "level"])
    log_rows = sim.log_rows()
    for row, p in zip(log_rows, sim.p_true):
        row["p_true"] = round(float(p), 6)
    write_rows(out_log, log_rows, columns=["step", "id", "n", "s", "p_true"])
    rate = sim.s / sim.n
    first = sim.step <= sim.step.max() / 3
    return {"command": "simulate", "out_prompts": str(out_prompts), "out_log": str(out_log),
            "prompts": len(sim.prompts), "steps": int(sim.step.max()), "rows": int(sim.step.size),
            "topics": sim.topics, "params": sim.params,
            "mean_rate": {"first_third": float(rate[first].mean()), "last_third": float(rate[~first].mean())
                          if (~first).any() else None}}


# ----------------------------------------------------------------------------------------------------
# diagnose-clusters


def diagnose_clusters(clusters, labels_file, *, category: str = "subject", ordinal: str | None = "level",
                      id_field: str = "unique_id") -> dict:
    """Appendix F: clusters vs a categorical label (chi^2, Cramer's V) and, within each category, an
    ordinal label across clusters (Kruskal-Wallis with ties correction, Benjamini-Hochberg).

    Items are matched by id; labels rows whose id is not clustered are counted and left out, and so
    are rows with a missing category. A missing or non-numeric ordinal value leaves the row out of
    the Kruskal-Wallis tests only.
    """
    from ..core.diagnostics import cluster_association, within_category_kruskal
    from ..io.artifacts import read_artifact
    from ..io.tables import as_id, read_rows
    from .report import to_jsonable

    art = read_artifact(clusters, "clusters")
    ids = [str(x) for x in art.array("ids")]
    lab = np.asarray(art.array("labels"))
    index = {pid: i for i, pid in enumerate(ids)}
    cl, cat, ordv = [], [], []
    unmatched = missing_category = 0
    seen = set()
    for line, row in read_rows(labels_file):
        if id_field not in row:
            raise DataError(f"{labels_file}:{line}: no {id_field!r} field (use --id-field to name the id column)")
        pid = as_id(row[id_field], labels_file, line, id_field)
        if pid in seen:
            raise DataError(f"{labels_file}:{line}: duplicate id {pid!r}")
        seen.add(pid)
        if pid not in index:
            unmatched += 1
            continue
        c = row.get(category)
        if c is None or (isinstance(c, str) and not c.strip()):
            missing_category += 1
            continue
        cl.append(int(lab[index[pid]]))
        cat.append(str(c))
        v = row.get(ordinal) if ordinal else None
        try:
            fv = float(v) if v not in (None, "") and not isinstance(v, bool) else float("nan")
        except (TypeError, ValueError):
            fv = float("nan")
        ordv.append(fv if math.isfinite(fv) else float("nan"))
    if not cl:
        raise DataError(f"{labels_file}: no row matches an id of {clusters} (match on {id_field!r}; "
                        "use --id-field to name the id column)")
    cl_a, cat_a = np.asarray(cl), np.asarray(cat)
    assoc = cluster_association(cl_a, cat_a)
    result = {"command": "diagnose-clusters", "clusters": str(clusters), "labels": str(labels_file),
              "category": category, "ordinal": ordinal, "matched": len(cl), "unmatched_label_rows": unmatched,
              "missing_category": missing_category, "clustered_without_labels": len(ids) - len(cl),
              "association": {k: assoc[k] for k in ("chi2", "dof", "p", "cramers_v", "n", "clusters", "categories")}}
    if ordinal:
        rows = within_category_kruskal(cl_a, cat_a, np.asarray(ordv))
        result["within_category"] = rows
        ps = [r["p_bh"] for r in rows if r["p_bh"] == r["p_bh"]]
        result["max_p_bh"] = max(ps) if ps else None
    return to_jsonable(result)
