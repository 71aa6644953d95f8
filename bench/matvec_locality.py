#!/usr/bin/env python3
"""Issue 32: what one product with W costs as the pool grows, and how much of it is locality. The planted graph
of bench/handoff_roundtrip.py (K states, ~deg mutual neighbours a prompt, 85% inside its state) at each size,
multiplied 10 times by the threaded product label propagation's solve uses (core.graph.row_parallel_matvec),
in the order it was built (neighbours scattered over the whole vector) and with the prompts ordered by state.

    .venv/bin/python bench/matvec_locality.py 1000000 3000000
"""

import sys
import time

import numpy as np
import scipy.sparse as sp

from handoff_roundtrip import synthetic_graph  # bench/ is on sys.path when a script runs
from graphdiff_cli.core.graph import row_parallel_matvec


def main() -> None:
    for n in [int(a) for a in sys.argv[1:]] or [1_000_000]:
        w, labels = synthetic_graph(n, 320, 40)
        w = sp.csr_matrix(w, dtype=np.float64)
        order = np.argsort(labels, kind="stable")
        wp = w[order][:, order].tocsr()
        x = np.random.default_rng(0).random(n)
        for name, m in (("as built", w), ("ordered by state", wp)):
            f = row_parallel_matvec(m)
            f(x)
            t = time.perf_counter()
            for _ in range(10):
                f(x)
            print(f"N {n:>9,}  {name:17s} {(time.perf_counter() - t) / 10 * 1000:7.1f} ms a product  (nnz {m.nnz:,})",
                  flush=True)
        del w, wp


if __name__ == "__main__":
    main()
