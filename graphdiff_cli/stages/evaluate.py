"""Stage behind ``graphdiff evaluate``: is graphdiff better than what I use now, on my own log?

Read a training log (rows step, id, n, s; string ids matched to the graph's ``ids``), the graph,
clusters and (for VIP, DOTS and the ridge read-out) embeddings artifacts, and the prompts' covariates an
embeddings artifact holds (for graphdiff and the covariate peers: the covariates' read-out alone, the
reference pass rate's prior) (``io.readers``); replay the log through graphdiff and the
peers' estimators (``methods``) with no look-ahead (``evaluation.replay``); score them (``evaluation.metrics``);
optionally replay decisions (``stages.counterfactual``); write a report folder (report.md,
metrics.json, plots) atomically (``io.staging``).

No typer or rich here: progress goes through the ``progress(done, total)`` callback.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from ..errors import DataError, InvalidArgumentError
from .progress import Progress, no_progress, phase




def _verdict(metrics: dict) -> list[dict]:
    """graphdiff against each real (non-oracle) baseline on the full log, all rows."""
    from ..evaluation.metrics import HIGHER_IS_BETTER

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


def _headline(res, metrics: dict, decisions: dict | None, counterfactual: bool | None = None) -> dict | None:
    """The questions a user asks, graphdiff against the strongest real baseline for each, with a 95% circular
    block bootstrap interval: is the estimate closer (MAE, over steps), does it rank a batch's prompts better
    (within-batch r, over steps), does it choose batches with more signal (the target rule's effective-group
    rate in the counterfactual, over pools), does it split a batch's rollouts better (the variance rule's
    expected non-degenerate groups in the counterfactual, over steps; against uniform counts too).

    Each answered question carries its ``verdict`` (None where the log cannot give one); ``not_given`` lists
    every figure of the headline this log cannot give, each with the reason (``report.headline_gaps``)."""
    from ..evaluation.metrics import mae_difference, ratio_bootstrap, within_r_difference
    from .report import headline_gaps, judge

    methods = metrics["methods"]
    others = [n for n in res.methods if n != "graphdiff" and not res.oracle[n]]
    if "graphdiff" not in res.methods or not others:
        return None
    full = {n: methods[n]["phases"]["full"]["all"] for n in res.methods}

    def finite(v):
        return v is not None and math.isfinite(v)

    def best(key, higher):
        scored = [n for n in others if finite(full[n][key])]
        if not scored:
            return None
        return max(scored, key=lambda n: full[n][key]) if higher else min(scored, key=lambda n: full[n][key])

    out: dict = {"level": 0.95, "method": "circular block bootstrap, 2,000 resamples"}
    missing: dict[str, str] = {}  # question -> why it is not answered
    for question, key, difference, higher in (("estimate", "mae", mae_difference, False),
                                              ("ranking", "within_r", within_r_difference, True)):
        b = best(key, higher)
        if b is None or not finite(full["graphdiff"][key]):
            missing[question] = ("no batch with unequal observed rates, so no within-batch r" if key == "within_r"
                                 else f"no {key} for graphdiff and a real baseline on this log")
            continue
        ci = difference(res.step, res.predictions["graphdiff"], res.predictions[b], res.rate)
        out[question] = {"metric": key, "baseline": b, "graphdiff": full["graphdiff"][key],
                         "baseline_value": full[b][key], "difference": ci, "units": "steps",
                         "verdict": judge(ci, not higher, b, "step")[0]}

    if decisions is None:
        why = ("the decision replay was turned off (--no-counterfactual)" if counterfactual is False else
               "the decision replay was not run: none of the methods drives decisions")
        missing["selection"] = missing["allocation"] = why
    elif "skipped" in decisions:
        missing["selection"] = missing["allocation"] = f"not replayed on this log: {decisions['skipped']}"
    sel = (decisions or {}).get("selection")
    if sel:
        target = {r["estimator"]: r for r in sel["results"] if r["strategy"] == "target"}
        rivals = [n for n in target if n != "graphdiff" and finite(target[n]["effective_rate"])]
        if "graphdiff" in target and rivals:
            b = max(rivals, key=lambda n: target[n]["effective_rate"])
            ours, theirs = np.asarray(target["graphdiff"]["effective_per_pool"], float), \
                np.asarray(target[b]["effective_per_pool"], float)
            chosen = np.full(ours.size, float(sel["batch_size"]))
            uniform = next(r for r in sel["results"] if r["strategy"] == "uniform")
            ci = ratio_bootstrap(ours - theirs, chosen)
            out["selection"] = {"metric": "effective_rate", "strategy": "target", "baseline": b,
                                "graphdiff": target["graphdiff"]["effective_rate"],
                                "baseline_value": target[b]["effective_rate"],
                                "uniform": uniform["effective_rate"],
                                "difference": ci, "units": "pools", "verdict": judge(ci, False, b, "pool")[0]}
        else:
            missing["selection"] = "graphdiff and a rival estimator are not both in the decision replay"
    elif decisions and "selection_skipped" in decisions:
        missing["selection"] = f"not replayed on this log: {decisions['selection_skipped']}"
    alloc = (decisions or {}).get("allocation")
    if alloc:
        table = {(r["estimator"], r["strategy"]): r for r in alloc["results"]}
        rules = [st for _, st in table if st != "uniform"]
        rule = "variance" if "variance" in rules else (rules[0] if rules else None)
        rivals = [n for n, st in table if st == rule and n not in ("graphdiff", "oracle(recorded rate)")
                  and finite(table[(n, st)]["expected_nondegenerate_per_step"])]
        if rule is not None and ("graphdiff", rule) in table and ("graphdiff", "uniform") in table and rivals:
            b = max(rivals, key=lambda n: table[(n, rule)]["expected_nondegenerate_per_step"])
            ours = np.asarray(table[("graphdiff", rule)]["per_step"], float)
            theirs = np.asarray(table[(b, rule)]["per_step"], float)
            uni = np.asarray(table[("graphdiff", "uniform")]["per_step"], float)
            steps = np.ones(ours.size)
            ci, ci_u = ratio_bootstrap(ours - theirs, steps), ratio_bootstrap(ours - uni, steps)
            out["allocation"] = {
                "metric": "expected_nondegenerate_per_step", "strategy": rule, "baseline": b,
                "budget_per_prompt": alloc["budget_per_prompt"],
                "graphdiff": table[("graphdiff", rule)]["expected_nondegenerate_per_step"],
                "baseline_value": table[(b, rule)]["expected_nondegenerate_per_step"],
                "uniform": table[("graphdiff", "uniform")]["expected_nondegenerate_per_step"],
                "vs_uniform": table[("graphdiff", rule)]["vs_uniform"],
                "difference": ci, "units": "steps", "verdict": judge(ci, False, b, "step")[0],
                "vs_uniform_difference": ci_u, "vs_uniform_verdict": judge(ci_u, False, "uniform", "step")[0]}
        else:
            missing["allocation"] = ("graphdiff, a rival estimator and uniform counts are not all in the decision "
                                     "replay")
    elif decisions and "allocation_skipped" in decisions:
        missing["allocation"] = f"not replayed on this log: {decisions['allocation_skipped']}"
    out["not_given"] = headline_gaps(out, missing)
    return out


def evaluate(log, graph, clusters, out, *, embeddings=None, config=None, methods=None, device: str | None = None,
             counterfactual: bool | None = None, pool_factor: float = 2.0, seed: int = 0, explore: float | None = None,
             covariates=None, progress: Progress = no_progress) -> dict:
    """Replay ``log`` through the chosen methods and write the report folder ``out`` atomically.

    ``covariates``: an embeddings artifact holding the prompts' covariates (``graphdiff embed`` with
    covariates); None: ``embeddings``'s, when it holds them. graphdiff and the covariate methods are given
    them; without any, the covariate methods are refused when named in ``methods`` and otherwise left out, the
    report saying why.

    ``counterfactual``: also replay selection and allocation driven by each (non-oracle) method
    (``stages.counterfactual``), with the log's median batch size as B and a pool of ``pool_factor`` x B;
    the target rule at ``explore`` (None: select's default) and at 0. None (the default): where the log
    allows it (a round of the log holds a pool); a log that does not gets a report that says so. True:
    a log that does not is refused.

    Returns the result summary (also stored in metrics.json under "run").
    """
    from ..evaluation.metrics import evaluate_replay
    from ..evaluation.replay import replay
    from ..io.readers import covariate_inputs, embedding_matrix, read_clusters, read_graph, read_log
    from ..evaluation.methods import (COUNTERFACTUAL_METHODS, COVARIATE_METHODS, EMBEDDING_METHODS, build_methods,
                                      load_config, parse_methods, tune_discounted, with_device)
    from .report import to_jsonable, write_report

    t0 = time.perf_counter()
    out = Path(out)
    cfg = with_device(load_config(config), device)
    keys = parse_methods(methods)
    if counterfactual is not False and not pool_factor >= 1:  # before the replays, not after them
        raise InvalidArgumentError(f"pool factor must be >= 1, got {pool_factor!r}")
    if counterfactual is not False:
        from ..core.decisions import check_explore, check_int

        check_int(seed, "--seed", 0)  # numpy seeds are >= 0
        if explore is not None:
            check_explore(explore)  # before the replays, not after them
    named = {k.strip().lower() for m in (methods or []) for k in str(m).split(",")}
    if embeddings is None:
        for key in EMBEDDING_METHODS:
            if key in keys:
                if key in named:  # asked for by name, not through "all"
                    raise InvalidArgumentError(f"method {key} needs prompt embeddings: pass --embeddings EMBED.zarr")
                keys.remove(key)
    if out.exists() and not out.is_dir():
        raise InvalidArgumentError(f"--out {out} exists and is not a folder")

    g = read_graph(graph)
    cl = read_clusters(clusters, g)
    w, labels, k = g.w, cl.labels, cl.k
    emb = embedding_matrix(embeddings, g) if embeddings is not None else None
    cov = None
    if covariates is not None or embeddings is not None:
        cov = covariate_inputs(covariates if covariates is not None else embeddings, g)
        if cov is None and covariates is not None:
            raise InvalidArgumentError(f"--covariates {covariates} holds no covariates (graphdiff embed computes "
                                       "them from the prompts file)")
    skipped = {}
    if cov is None:
        why = ("no covariates: " + ("--embeddings holds none" if embeddings is not None else "no --covariates") +
               " (graphdiff embed computes them from the prompts file)")
        for key in COVARIATE_METHODS:
            if key in keys:
                if key in named:  # asked for by name, not through "all"
                    raise InvalidArgumentError(f"method {key} needs the prompts' covariates: {why}")
                keys.remove(key)
                skipped[key] = why
    elif cov.reference is None and "reference" in keys:
        why = "the covariates have no reference pass rate column"
        if "reference" in named:
            raise InvalidArgumentError(f"method reference needs a reference pass rate: {why}")
        keys.remove("reference")
        skipped["reference"] = why
    features = None if cov is None else cov.features
    reference = None if cov is None else cov.reference
    lg = read_log(log, g.index)
    n_nodes = len(g.ids)

    tuned, grid = None, []
    if "discounted" in keys:
        ev = cfg["evaluate"]["discounted"]
        tuned, grid = tune_discounted(lg, n_nodes, ev["lambdas"], ev["m"])
    ests, described = build_methods(keys, cfg, w, labels, k, emb, n_nodes, tuned, covariates=features,
                                    reference=reference)
    phase(progress, f"replaying the log ({len(ests)} methods, steps)")
    progress(0, None)
    res = replay(lg["step"], lg["id"], lg["n"], lg["s"], ests, n_nodes=n_nodes, progress=progress)
    metrics = evaluate_replay(res)

    truth = None
    if lg["p_true"] is not None:
        from ..evaluation.metrics import mae

        truth = {"observed_vs_true_mae": mae(lg["p_true"], res.rate),
                 "methods": {name: mae(res.predictions[name], lg["p_true"]) for name in res.methods}}

    n_steps = int(res.steps.size)
    sizes = np.diff(np.r_[np.flatnonzero(np.r_[True, res.step[1:] != res.step[:-1]]), res.step.size])
    decisions = None
    cf_methods = [m for m in keys if m in COUNTERFACTUAL_METHODS]
    if counterfactual or (counterfactual is None and cf_methods):
        from .counterfactual import run_counterfactual

        # the allocation replay's pass (predict each step's batch, then learn its outcomes) is the estimation
        # replay's, and its estimators are built alike: their predictions are reused, not replayed again
        # (but discounted history's, tuned on the log here and not there)
        reused = {name: res.predictions[name] for name in res.methods
                  if not res.oracle[name] and name != "discounted"}
        try:
            decisions = run_counterfactual(lg, cfg, w, labels, k, emb, n_nodes, methods=cf_methods,
                                           batch_size=int(np.median(sizes)), pool_factor=pool_factor, seed=seed,
                                           explore=explore, skip_unavailable=counterfactual is None,
                                           predictions=reused, covariates=features, reference=reference,
                                           progress=progress)
        except DataError as exc:
            if counterfactual:  # asked for by name: the log cannot give it
                raise
            decisions = {"skipped": str(exc)}
    run = {
        "command": "evaluate", "log": str(log), "graph": str(graph), "clusters": str(clusters),
        "embeddings": None if embeddings is None else str(embeddings), "config": None if config is None else str(config),
        "covariates": None if cov is None else {"path": str(covariates if covariates is not None else embeddings),
                                                "features": int(cov.features.shape[1]),
                                                "reference_rate": cov.reference is not None},
        "skipped": skipped,
        "out": str(out), "n_prompts": n_nodes, "n_states": k, "rows": int(res.step.size), "steps": n_steps,
        "prompts_in_log": int(np.unique(res.ids).size), "batch_size": {"min": int(sizes.min()), "max": int(sizes.max())},
        "seen_rows": int(res.seen.sum()), "methods": res.methods, "oracles": [m for m in res.methods if res.oracle[m]],
        "inputs": {"graph": g.art.content_hash, "clusters": cl.art.content_hash},
    }
    summary_rows = {name: {key: m["phases"]["full"]["all"][key]
                           for key in ("mae", "batch_r", "within_r", "within_spearman", "brier", "ece", "auroc",
                                       "zero_variance_ece", "seconds_per_step")}
                    for name, m in metrics["methods"].items()}
    document = {"run": run, "settings": described, "metrics": metrics, "verdict": _verdict(metrics),
                "headline": _headline(res, metrics, decisions, counterfactual),
                "discounted_grid": grid, "discounted_best": tuned, "ground_truth": truth,
                "counterfactual": decisions}

    from ..io.staging import staged_dir

    with staged_dir(out, durable=False) as staging:
        files = write_report(staging, document)
    run["files"] = files
    run["timings"] = {"total_s": time.perf_counter() - t0}
    return to_jsonable({**run, "summary": summary_rows, "headline": document["headline"],
                        "verdict": document["verdict"],
                        "discounted_best": tuned})
