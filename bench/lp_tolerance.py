#!/usr/bin/env python3
"""Issue 32: label propagation's solve at three tolerances - what a looser one saves, and what it costs in error.

Along the simulated run of ``bench/lp_incremental.py`` on the 150k mutual-kNN graph (205 new and 51 seen prompts a
step), the product's solve (``harmonic_solution`` with ``w_single``: float32 CG, then float64 CG to the tolerance in
float64) runs at relative residuals 1e-6, 1e-5 and 1e-4, each warm-started from its own previous field. Reported at
some steps: CG iterations (float32, then float64), seconds, and the error against a float64 solve to 1e-11 - of the
field (max and mean over prompts) and of the next batch's propagated estimate (the W-weighted mean of its
neighbours' field values, what p-hat reads).

    .venv/bin/python bench/lp_tolerance.py W/old_g.zarr W/old_c.zarr [--steps 100] [--out lp_tolerance.json]
"""

from __future__ import annotations

import platform
from datetime import date
from pathlib import Path

import numpy as np

from _emit import emit  # bench/ is on sys.path when a script runs
from graphdiff_cli.core.graph import single_precision
from graphdiff_cli.core.harmonic import harmonic_solution
from lp_incremental import graph_parser, load, product_solve, simulated_rates, simulated_run

REPORT = (1, 2, 5, 10, 20, 50, 100)
TOLERANCES = (1e-6, 1e-5, 1e-4)


def main() -> None:
    ap = graph_parser()
    args = ap.parse_args()

    labels, w, _deg, comps, _prod = load(Path(args.graph), Path(args.clusters))
    w_single = single_precision(w)
    rng = np.random.default_rng(0)
    rate = simulated_rates(rng, labels)
    out = {"date": str(date.today()), "machine": platform.platform(), "n": w.shape[0], "nnz": int(w.nnz), "steps": []}

    run = list(simulated_run(rng, rate, args.steps + 1))
    prev = dict.fromkeys(TOLERANCES)
    for (step, _batch, lab, vals, fill), (_, next_batch, *_rest) in zip(run[:-1], run[1:]):
        rows = {}
        for rtol in TOLERANCES:
            prev[rtol], rows[rtol] = product_solve(w, lab, vals, fill, comps, prev[rtol], rtol, w_single)
        if step not in REPORT:
            continue
        exact = harmonic_solution(w, lab, vals, fill, comps, x0=prev[1e-6], rtol=1e-11)
        w_next = w[next_batch]
        deg_next = np.asarray(w_next.sum(axis=1)).ravel()
        deg_next[deg_next == 0] = 1.0
        propagated = w_next @ exact / deg_next
        for rtol, row in rows.items():
            err = np.abs(prev[rtol] - exact)
            row.update(field_max_error=float(err.max()), field_mean_error=float(err.mean()),
                       next_batch_max_error=float(np.abs(w_next @ prev[rtol] / deg_next - propagated).max()))
        out["steps"].append({"step": step, "labelled": int(lab.size), **{f"rtol {r:g}": v for r, v in rows.items()}})
        print(out["steps"][-1], flush=True)
    emit(out, args.out)


if __name__ == "__main__":
    main()
