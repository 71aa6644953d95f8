#!/usr/bin/env python3
"""Issue 32, an experiment (not a product option): what would a float32 product with W save?

Label propagation's solve is ~60-110 products with W a step on the 150k kNN graph, in float64. This times the
product as the solve runs it (``core.graph.row_parallel_matvec``, all threads) and on one thread, with W and x in
float64 and in float32 (30 products each after a warm-up, median and minimum), and the largest difference of
the float32 product from the float64 one relative to its largest entry.

    .venv/bin/python bench/matvec_precision.py W/old_g.zarr W/old_c.zarr [--out matvec_precision.json]
"""

from __future__ import annotations

import platform
import time
from datetime import date
from pathlib import Path

import numpy as np

from _emit import emit  # bench/ is on sys.path when a script runs
from graphdiff_cli.core.graph import matvec_threads, row_parallel_matvec, single_precision
from lp_incremental import graph_parser, load


def main() -> None:
    ap = graph_parser(steps=None)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()

    _labels, w, _deg, _comps, prod = load(Path(args.graph), Path(args.clusters))
    w32 = single_precision(w)
    x = np.random.default_rng(0).random(w.shape[0])
    x32 = x.astype(np.float32)
    out = {"date": str(date.today()), "machine": platform.platform(), "n": w.shape[0], "nnz": int(w.nnz),
           "index_dtype": str(w.indices.dtype), "threads": matvec_threads(), "rows": []}
    for name, f, v in (("float64, threads", prod, x), ("float32, threads", row_parallel_matvec(w32), x32),
                       ("float64, 1 thread", w.__matmul__, x), ("float32, 1 thread", w32.__matmul__, x32)):
        f(v)
        ts = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            f(v)
            ts.append(time.perf_counter() - t0)
        out["rows"].append({"product": name, "median_ms": round(1e3 * float(np.median(ts)), 2),
                            "min_ms": round(1e3 * min(ts), 2)})
        print(out["rows"][-1], flush=True)
    ref = prod(x)
    out["max_relative_difference"] = float(np.abs(row_parallel_matvec(w32)(x32) - ref).max() / np.abs(ref).max())
    emit(out, args.out)


if __name__ == "__main__":
    main()
