#!/usr/bin/env python3
"""Issue 32, an experiment (not a product option): would algebraic multigrid (pyamg) cut label propagation's solve?

``bench/lp_coarse.py`` tried a coarse space of our own (the clustering's states); this tries the well-kept library
one: pyamg's smoothed-aggregation hierarchy of L_UU, the Dirichlet system of the simulated run's second step on
the 150k mutual-kNN graph (same run as ``bench/lp_incremental.py``), as the preconditioner of CG, cold-started,
to relative residual 1e-6, beside the product's Jacobi preconditioner and beside one symmetric Gauss-Seidel sweep
alone (SSOR, omega 1: the smoother without a coarse level). Reported per preconditioner: set-up seconds, levels and
their sizes, CG iterations, solve seconds, and the work in products with L_UU: per CG iteration one product plus
the V-cycle's, which on every level but the last is its sweeps and one residual, each a product with that level's
matrix (a symmetric Gauss-Seidel sweep is a forward and a backward one: two), and the restriction and
prolongation (products with R and P), all counted in entries of L_UU. ``products`` counts an ideal V-cycle;
``products_as_run`` adds the two residual norms pyamg's ``aspreconditioner`` computes around each cycle (its
``solve(b, maxiter=1)``), which the solve's seconds include. pyamg is not a dependency of graphdiff:
``pip install pyamg`` (5.4.1 measured) to run this.

    .venv/bin/python bench/lp_amg.py W/old_g.zarr W/old_c.zarr [--out lp_amg.json]
"""

from __future__ import annotations

import platform
import time
from datetime import date
from pathlib import Path

import numpy as np
import pyamg
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator

from _emit import emit  # bench/ is on sys.path when a script runs
from lp_incremental import System, counted_cg, graph_parser, load, simulated_rates, simulated_run

GS = ("block_gauss_seidel", {"sweep": "symmetric"})  # pyamg's default smoother: a forward and a backward sweep
JACOBI = ("jacobi", {"omega": 2 / 3, "iterations": 1, "withrho": False})  # omega as given, not over rho(D^-1 A)
JACOBI2 = ("jacobi", {"omega": 2 / 3, "iterations": 2, "withrho": False})
HIERARCHIES = {  # name: (keyword arguments of smoothed_aggregation_solver, sweeps per V-cycle on the finest level)
    "SA, Gauss-Seidel (pyamg's defaults)": ({}, 4),
    "plain aggregation, Gauss-Seidel": ({"smooth": None}, 4),
    "plain aggregation, 1 Jacobi sweep": ({"smooth": None, "presmoother": JACOBI, "postsmoother": JACOBI}, 2),
    "SA, 1 Jacobi sweep": ({"presmoother": JACOBI, "postsmoother": JACOBI}, 2),
    "plain aggregation, 2 Jacobi sweeps": ({"smooth": None, "presmoother": JACOBI2, "postsmoother": JACOBI2}, 4),
}


def main() -> None:
    ap = graph_parser(steps=None)
    args = ap.parse_args()

    labels, w, deg, comps, prod = load(Path(args.graph), Path(args.clusters))
    rng = np.random.default_rng(0)
    rate = simulated_rates(rng, labels)
    for _step, _batch, lab, vals, fill in simulated_run(rng, rate, 2):
        pass  # the second step's labels, as lp_coarse's step 2
    system = System(w, prod, deg, comps, lab, vals, fill)
    free = np.flatnonzero(system.free)
    a = (sp.diags(deg) - w).tocsr()[free][:, free].tocsr()
    b = system.rhs[free]
    out = {"date": str(date.today()), "machine": platform.platform(), "pyamg": pyamg.__version__,
           "n_free": int(free.size), "nnz": int(a.nnz), "labelled": int(lab.size), "rows": []}

    def solve(m):
        _x, iters, seconds, info = counted_cg(a, b, m=m)
        return iters, seconds, info

    dinv = 1 / a.diagonal()
    it, sec, info = solve(LinearOperator(a.shape, lambda r: dinv * r))
    out["rows"].append({"preconditioner": "Jacobi (the product's)", "setup_s": 0.0, "iterations": it,
                        "solve_s": round(sec, 2), "products": it, "info": info})
    print(out["rows"][-1], flush=True)

    def ssor(r):
        r = np.asarray(r, dtype=np.float64).ravel()
        z = np.zeros_like(r)
        pyamg.relaxation.relaxation.gauss_seidel(a, z, r, iterations=1, sweep="symmetric")
        return z

    it, sec, info = solve(LinearOperator(a.shape, ssor, dtype=np.float64))
    out["rows"].append({"preconditioner": "symmetric Gauss-Seidel alone (SSOR)", "setup_s": 0.0, "iterations": it,
                        "solve_s": round(sec, 2), "products": 3 * it, "info": info})
    print(out["rows"][-1], flush=True)
    for name, (kw, sweeps) in HIERARCHIES.items():
        t0 = time.perf_counter()
        ml = pyamg.smoothed_aggregation_solver(a, symmetry="hermitian", max_coarse=500, **kw)
        setup = time.perf_counter() - t0
        it, sec, info = solve(ml.aspreconditioner(cycle="V"))
        per_cycle = sum((sweeps + 1) * lv.A.nnz + lv.P.nnz + lv.R.nnz for lv in ml.levels[:-1]) / a.nnz
        out["rows"].append({"preconditioner": name, "setup_s": round(setup, 2), "levels": len(ml.levels),
                            "sizes": [lv.A.shape[0] for lv in ml.levels],
                            "operator_complexity": round(ml.operator_complexity(), 3), "iterations": it,
                            "solve_s": round(sec, 2), "products": round(it * (1 + per_cycle)),
                            "products_as_run": round(it * (3 + per_cycle)), "info": info})
        print(out["rows"][-1], flush=True)
    emit(out, args.out)


if __name__ == "__main__":
    main()
