#!/usr/bin/env python3
"""Issue 15, target 2: can the graph tell a prompt how the policy moved since the prompt's last visit?

Discounted history (lambda, m = 0) predicts each batch before its outcomes; the probe adds eta times a
drift estimate: "neighbours", the W-weighted mean of the latest residuals (observed rate minus the history's
prediction) of the prompt's mutual neighbours visited after the prompt's last visit; "global", the mean
residual of every step since that visit. eta = 0 is the history itself. Input: a workflow run folder.

    .venv/bin/python bench/drift_probe.py artifacts/oneshot [--lam 0.8]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from _emit import emit  # bench/ is on sys.path when a script runs
from _run import run_inputs, run_log

ETAS = (0.0, 0.25, 0.5, 0.75, 1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--lam", type=float, default=0.8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from graphdiff_cli.evaluation.metrics import mae, within_batch

    inp = run_inputs(args.run)
    log = run_log(args.run, inp)
    w = inp.w.tocsr()
    n_nodes = w.shape[0]
    succ, roll = np.zeros(n_nodes), np.zeros(n_nodes)
    last_visit = np.full(n_nodes, -1)  # step of the prompt's last visit
    residual, residual_step = np.zeros(n_nodes), np.full(n_nodes, -1)
    step_residual: dict[int, float] = {}
    gs = gn = 0.0
    preds = {(src, e): [] for src in ("neighbours", "global") for e in ETAS}
    steps, rates = [], []
    for t in np.unique(log["step"]):
        sel = log["step"] == t
        ids, n, s = log["id"][sel], log["n"][sel], log["s"][sel]
        rate = s / n
        g = (gs + 1.0) / (gn + 2.0)
        base = np.where(roll[ids] > 0, succ[ids] / np.maximum(roll[ids], 1e-12), g)
        sub = w[ids]
        nb_drift, gl_drift = np.zeros(ids.size), np.zeros(ids.size)
        for k, i in enumerate(ids):
            if last_visit[i] < 0:
                continue
            js, ws = sub.indices[sub.indptr[k]:sub.indptr[k + 1]], sub.data[sub.indptr[k]:sub.indptr[k + 1]]
            fresh = residual_step[js] > last_visit[i]
            if fresh.any():
                nb_drift[k] = (ws[fresh] * residual[js[fresh]]).sum() / ws[fresh].sum()
            since = [v for u, v in step_residual.items() if u > last_visit[i]]
            gl_drift[k] = np.mean(since) if since else 0.0
        for e in ETAS:
            preds["neighbours", e].append(np.clip(base + e * nb_drift, 0.0, 1.0))
            preds["global", e].append(np.clip(base + e * gl_drift, 0.0, 1.0))
        steps.append(np.full(ids.size, t))
        rates.append(rate)
        residual[ids], residual_step[ids], last_visit[ids] = rate - base, t, t
        step_residual[int(t)] = float((rate - base).mean())
        succ[ids] = args.lam * succ[ids] + s
        roll[ids] = args.lam * roll[ids] + n
        gs, gn = gs + s.sum(), gn + n.sum()
    steps, rates = np.concatenate(steps), np.concatenate(rates)
    out = {"run": str(args.run), "lam": args.lam}
    for (src, e), v in preds.items():
        p = np.concatenate(v)
        out[f"{src} eta {e}"] = {"mae": mae(p, rates), "within_r": within_batch(steps, p, rates)["pearson"]}
    emit(out, args.out)


if __name__ == "__main__":
    main()
