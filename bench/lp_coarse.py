#!/usr/bin/env python3
"""Issue 32, an experiment (not a product option): would a coarse correction cut label propagation's solve?

The product solves the Dirichlet problem (D_UU - W_UU) f_U = W_UL f_L by conjugate gradients with a Jacobi
preconditioner, warm-started from the previous step's field, to relative residual 1e-6; on the 150k mutual-kNN
graph that is 60-110 products with W a step early in a run. This compares it, step by step along the same
simulated run as ``bench/lp_incremental.py`` (205 new and 51 seen prompts a step, 8 rollouts each at a per-cluster
rate plus per-prompt noise), with a two-level additive preconditioner: Jacobi plus a coarse solve on aggregates,
one per (cluster, connected component) pair of the graph's clustering (the K states of ``graphdiff cluster``),
M^-1 r = D^-1 r + P (P^T L_UU P)^-1 P^T r, P the aggregates' 0/1 indicator on the unlabelled prompts. Same
tolerance and warm start for both; reported: CG iterations, the coarse set-up's and the solve's seconds, and
the largest error against a solve to 1e-11.

    .venv/bin/python bench/lp_coarse.py W/old_g.zarr W/old_c.zarr [--steps 100] [--out lp_coarse.json]
"""

from __future__ import annotations

import platform
import time
from datetime import date
from pathlib import Path

import numpy as np
import scipy.linalg as sla
from scipy.sparse.linalg import LinearOperator

from _emit import emit  # bench/ is on sys.path when a script runs
from graphdiff_cli.core.harmonic import harmonic_solution
from lp_incremental import System, counted_cg, graph_parser, load, simulated_rates, simulated_run

REPORT = (1, 2, 5, 10, 20, 50, 100)


def main() -> None:
    ap = graph_parser()
    args = ap.parse_args()

    labels, w, deg, comps, prod = load(Path(args.graph), Path(args.clusters))
    n = w.shape[0]
    agg = np.unique(labels.astype(np.int64) * (comps.max() + 1) + comps, return_inverse=True)[1].reshape(-1)
    nagg = int(agg.max()) + 1
    coo = w.tocoo()
    ar, ac = agg[coo.row], agg[coo.col]
    rng = np.random.default_rng(0)
    rate = simulated_rates(rng, labels)
    out = {"date": str(date.today()), "machine": platform.platform(), "n": n, "nnz": int(w.nnz),
           "components": int(comps.max() + 1), "aggregates": nagg, "steps": []}

    def solve(sysm, x0, coarse):
        free = sysm.free
        jacobi = sysm.jacobi()
        t0 = time.perf_counter()
        if coarse:  # P^T L_UU P from W's entries between unlabelled prompts, then its Cholesky factor
            keep = free[coo.row] & free[coo.col]
            off = np.bincount(ar[keep] * nagg + ac[keep], coo.data[keep], minlength=nagg * nagg).reshape(nagg, nagg)
            a_c = np.diag(np.bincount(agg[free], deg[free], minlength=nagg)) - off
            act = np.flatnonzero(np.bincount(agg[free], minlength=nagg) > 0)
            factor = sla.cho_factor(a_c[np.ix_(act, act)])
            loc = np.full(nagg, -1)
            loc[act] = np.arange(act.size)
            fa = loc[agg[free]]

            def pre(r):
                y = sla.cho_solve(factor, np.bincount(fa, r[free], minlength=act.size))
                z = jacobi(r)
                z[free] += y[fa]
                return z
        else:
            pre = jacobi
        setup = time.perf_counter() - t0
        x, iters, seconds, info = counted_cg(LinearOperator((n, n), sysm.lap), sysm.rhs,
                                             None if x0 is None else sysm.mask * x0, LinearOperator((n, n), pre))
        return sysm.field(x), {"iterations": iters, "setup_s": round(setup, 3), "solve_s": round(seconds, 3),
                               "info": info}

    prev = {"jacobi": None, "two_level": None}
    for step, _batch, lab, vals, fill in simulated_run(rng, rate, args.steps):
        sysm = System(w, prod, deg, comps, lab, vals, fill)
        rows = {}
        for name in prev:
            prev[name], rows[name] = solve(sysm, prev[name], name == "two_level")
        if step in REPORT:
            exact = harmonic_solution(w, lab, vals, fill, comps, x0=prev["jacobi"], rtol=1e-11)
            for name in rows:
                rows[name]["max_error"] = float(np.abs(prev[name] - exact).max())
            out["steps"].append({"step": step, "labelled": int(lab.size), **rows})
            print(out["steps"][-1], flush=True)
    emit(out, args.out)


if __name__ == "__main__":
    main()
