#!/usr/bin/env python3
"""Issue 32: label propagation's solve in float32 - how much faster, how far off?

Along the simulated run of ``bench/lp_incremental.py`` on the 150k mutual-kNN graph (205 new and 51 seen prompts a
step), the solve - Jacobi-preconditioned CG on L_UU, warm-started from the previous step's field, to relative
residual 1e-6 - is run four ways each step, each warm-started from its own previous field:

  float64, float32   CG alone on the step's system (set up once, outside the timing), in float64 and with W, the
                     vectors and CG's arithmetic in float32 (scipy's ``cg`` works in the operator's dtype): the
                     experiment that sized the lever;
  product_float64    ``harmonic_solution`` as the product called it before 2026-11-28 (float64 only), set-up
                     included;
  product_mixed      ``harmonic_solution`` as the product calls it now (``w_single``: float32 CG, then float64 CG
                     from its result to the same tolerance in float64), set-up included.

Reported at some steps: CG iterations (for the mixed solve: float32, then float64), solve seconds, and the largest
error of each field against a solve to 1e-11 in float64.

    .venv/bin/python bench/lp_float32.py W/old_g.zarr W/old_c.zarr [--steps 100] [--out lp_float32.json]
"""

from __future__ import annotations

import platform
from datetime import date
from pathlib import Path

import numpy as np
from scipy.sparse.linalg import LinearOperator

from _emit import emit  # bench/ is on sys.path when a script runs
from graphdiff_cli.core.graph import row_parallel_matvec, single_precision
from graphdiff_cli.core.harmonic import dirichlet_operators, harmonic_solution
from lp_incremental import System, counted_cg, graph_parser, load, product_solve, simulated_rates, simulated_run

REPORT = (1, 2, 5, 10, 20, 50, 100)


def main() -> None:
    ap = graph_parser()
    args = ap.parse_args()

    labels, w, deg, comps, prod = load(Path(args.graph), Path(args.clusters))
    n = w.shape[0]
    w_single = single_precision(w)
    prod32 = row_parallel_matvec(w_single)
    rng = np.random.default_rng(0)
    rate = simulated_rates(rng, labels)
    out = {"date": str(date.today()), "machine": platform.platform(), "n": n, "nnz": int(w.nnz), "steps": []}

    def solve(sysm, x0, dtype):
        """The product's warm-started Jacobi-PCG to 1e-6: as it is (float64), or with W, the vectors and CG's
        arithmetic in float32."""
        if dtype == np.float64:
            op, pre = LinearOperator((n, n), sysm.lap, dtype=dtype), LinearOperator((n, n), sysm.jacobi(), dtype=dtype)
        else:  # the product's float32 operators (core.harmonic) on this step's system
            op, pre = dirichlet_operators(prod32, sysm.mask, deg, sysm.jacobi()(np.ones(n)), dtype)
        x, iters, seconds, info = counted_cg(op, sysm.rhs.astype(dtype),
                                             None if x0 is None else (sysm.mask * x0).astype(dtype), pre)
        return sysm.field(x.astype(np.float64)), {"iterations": iters, "solve_s": round(seconds, 3), "info": info}

    prev = {"float64": None, "float32": None, "product_float64": None, "product_mixed": None}
    for step, _batch, lab, vals, fill in simulated_run(rng, rate, args.steps):
        sysm = System(w, prod, deg, comps, lab, vals, fill)
        rows = {}
        for name in prev:
            if name.startswith("product"):
                prev[name], rows[name] = product_solve(w, lab, vals, fill, comps, prev[name], 1e-6,
                                                       w_single if name.endswith("mixed") else None)
                continue
            prev[name], rows[name] = solve(sysm, prev[name], np.float32 if name == "float32" else np.float64)
        if step in REPORT:
            exact = harmonic_solution(w, lab, vals, fill, comps, x0=prev["float64"], rtol=1e-11)
            for name in rows:
                rows[name]["max_error"] = float(np.abs(prev[name] - exact).max())
            out["steps"].append({"step": step, "labelled": int(lab.size), **rows})
            print(out["steps"][-1], flush=True)
    emit(out, args.out)


if __name__ == "__main__":
    main()
