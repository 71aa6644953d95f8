#!/usr/bin/env python3
"""The cold start. First-visit within-batch r of the default preset against label
propagation (with the 95% block-bootstrap interval of the difference), and of the cold-start sources that
were tried and not kept: kernel regression on the embedding similarities, over the most similar seen
prompts of the whole set ("global") or of the prompt's directed kNN list ("knn").

Kernel regression: an unseen prompt's estimate is sum_j e^{(sim_ij - 1)/T} r_j + a g over
sum_j e^{(sim_ij - 1)/T} + a, j over the M most similar prompts seen so far (r_j their observed rate, g
the global rate); every batch is predicted before its outcomes. Input: a workflow run folder.

    .venv/bin/python bench/cold_start.py artifacts/oneshot   # artifacts/math, artifacts/demo
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import emit, round0_steps, run_inputs, run_log  # noqa: E402

GRID = [(m, t, a) for m in (10, 30, 100) for t in (0.02, 0.05, 0.1) for a in (0.0, 1.0)]


def kernel(sims, rates, g, t, a):
    """Per row: sum_j e^{(sim_j - 1)/T} r_j + a g over sum_j e^{(sim_j - 1)/T} + a (a sim of -inf weighs 0;
    g where nothing weighs)."""
    wgt = np.exp((sims - 1.0) / t)
    den = wgt.sum(1) + a
    return np.where(den > 0, ((wgt * rates).sum(1) + a * g) / np.where(den > 0, den, 1.0), g)


def top(sims, m):
    """Column indices of each row's m largest sims."""
    m = min(m, sims.shape[1])
    return np.argpartition(-sims, m - 1, axis=1)[:, :m]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from graphdiff_cli.evaluation import baselines as B
    from graphdiff_cli.core.graph import normalize_rows
    from graphdiff_cli.evaluation.metrics import within_batch, within_r_difference
    from graphdiff_cli.evaluation.replay import replay
    from graphdiff_cli.estimator import Estimator
    from graphdiff_cli.io.artifacts import read_artifact
    from graphdiff_cli.evaluation.methods import GraphdiffMethod

    inp = run_inputs(args.run)
    log = run_log(args.run, inp)
    emb = read_artifact(args.run / "embeddings.zarr", "embeddings")
    pos = {str(i): j for j, i in enumerate(emb.array("ids"))}
    x = normalize_rows(np.asarray(emb.array("embeddings"))[[pos[str(i)] for i in inp.ids]])
    knn = np.asarray(inp.graph.knn_indices())
    n_nodes = len(inp.ids)

    # the estimators, one step ahead
    res = replay(log["step"], log["id"], log["n"], log["s"],
                 [B.LabelPropagation(inp.w),
                  GraphdiffMethod(Estimator(inp.w, inp.labels, inp.k, preset="default", device="cpu"), name="default")],
                 n_nodes=n_nodes)
    first, rate = ~res.seen, res.rate
    out = {"run": str(args.run), "first_visits": int(first.sum())}
    r0 = np.isin(res.step, round0_steps(log["step"], log["id"]))
    for name, sel in (("first visits", first), ("round 0", r0)):
        st, pd, pl, r = res.step[sel], res.predictions["default"][sel], res.predictions["labelprop"][sel], rate[sel]
        out[name] = {"default": within_batch(st, pd, r)["pearson"], "labelprop": within_batch(st, pl, r)["pearson"],
                     "default - labelprop": within_r_difference(st, pd, pl, r)}

    # the kernel sources, on the same first visits
    seen = np.zeros(n_nodes, bool)
    succ, roll = np.zeros(n_nodes), np.zeros(n_nodes)
    preds = {f"{src} M{m} T{t} a{a}": [] for src in ("global", "knn") for m, t, a in GRID}
    steps, rates = [], []
    for t_ in np.unique(log["step"]):
        sel = log["step"] == t_
        ids, n, s = log["id"][sel], log["n"][sel], log["s"][sel]
        new = ids[~seen[ids]]
        if new.size:
            g = (succ.sum() + 1.0) / (roll.sum() + 2.0)
            obs_rate = succ / np.maximum(roll, 1.0)
            seen_idx = np.flatnonzero(seen)
            sims = x[new] @ x[seen_idx].T
            nb = knn[new]
            nb_sims = np.where(seen[nb], np.einsum("nd,nkd->nk", x[new], x[nb]), -np.inf)
            for m, t, a in GRID:
                idx = top(sims, m) if seen_idx.size else np.zeros((new.size, 0), np.int64)
                preds[f"global M{m} T{t} a{a}"].append(
                    kernel(np.take_along_axis(sims, idx, 1), obs_rate[seen_idx][idx], g, t, a))
                preds[f"knn M{m} T{t} a{a}"].append(kernel(nb_sims[:, :m], obs_rate[nb[:, :m]], g, t, a))
            steps.append(np.full(new.size, t_))
            rates.append(s[~seen[ids]] / n[~seen[ids]])
        np.add.at(succ, ids, s)
        np.add.at(roll, ids, n)
        seen[ids] = True
    steps, rates = np.concatenate(steps), np.concatenate(rates)
    kern = {k: within_batch(steps, np.concatenate(v), rates)["pearson"] for k, v in preds.items()}
    out["kernel first-visit r"] = dict(sorted(kern.items(), key=lambda kv: -kv[1]))
    emit(out, args.out)


if __name__ == "__main__":
    main()
