#!/usr/bin/env python3
"""What build-graph's k_nn does to the mutual-kNN graph of real prompt sets: isolated prompts and components
for a list of k, the old default (80 for any N) and the rule build-graph now applies when --k-nn is not given
(stages.prepare.auto_k_nn).

    python bench/knn_default.py /tmp/k31/oneshot_emb.zarr /tmp/k31/math_emb.zarr --k 10,20,30,40,60,80 \
        --subset 3000 --out /tmp/k31/knn_default.json

One exact search per artifact at the largest k (the same search build-graph runs); a smaller k keeps the
first k hits of each list, which is what a search at that k returns. ``--subset M`` adds a seeded sample of M
prompts of each artifact (a graph of those alone, as a user with M prompts would build). One JSON object on
stdout (and in --out), plus a markdown table on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from _emit import emit  # bench/ is on sys.path when a script runs


def graph_rows(name: str, x: np.ndarray, ks: list[int]) -> list[dict]:
    from graphdiff_cli.backends.knn import knn_search
    from graphdiff_cli.core.graph import drop_self, mutual_knn_graph, normalize_rows, summarize_graph
    from graphdiff_cli.stages.prepare import AUTO_KNN_MAX as AUTO_KNN_OLD, auto_k_nn

    x = normalize_rows(x).astype(np.float32)
    n = x.shape[0]
    auto = auto_k_nn(n)
    k_all = sorted({min(k, n - 1) for k in (*ks, AUTO_KNN_OLD, auto)})
    t0 = time.perf_counter()
    res = knn_search(x, k_all[-1] + 1, device="cpu")
    nbr_all, sim_all = drop_self(res.neighbors, res.similarities, k_all[-1])
    search_s = time.perf_counter() - t0
    rows = []
    for k in k_all:
        s = summarize_graph(mutual_knn_graph(nbr_all[:, :k], sim_all[:, :k]))
        rows.append({"set": name, "n": n, "k": k, "old_default": k == min(AUTO_KNN_OLD, n - 1),
                     "new_default": k == min(auto, n - 1), "edges": s.n_edges,
                     "mean_degree": round(s.mean_degree, 1), "isolated": s.isolated, "components": s.components,
                     "largest_component": s.largest_component})
    print(f"{name}: N = {n}, search at k = {k_all[-1]} in {search_s:.1f} s", file=sys.stderr)
    return rows


def main() -> None:
    from graphdiff_cli.io.readers import read_embeddings

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("embeddings", nargs="+", help="embeddings artifacts (graphdiff embed)")
    ap.add_argument("--k", default="10,20,30,40,60,80", help="comma-separated k values")
    ap.add_argument("--subset", type=int, default=0, help="also a seeded sample of this many prompts of each")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ks = [int(v) for v in args.k.split(",")]
    rows = []
    for path in args.embeddings:
        x = np.asarray(read_embeddings(path).array("embeddings"), dtype=np.float32)
        name = path.rstrip("/").split("/")[-1].removesuffix(".zarr")
        rows += graph_rows(name, x, ks)
        if args.subset and args.subset < x.shape[0]:
            pick = np.sort(np.random.default_rng(args.seed).choice(x.shape[0], args.subset, replace=False))
            rows += graph_rows(f"{name}[{args.subset}]", x[pick], ks)
    print("| set | N | k | mean degree | isolated | components | largest |", file=sys.stderr)
    print("|---|---:|---:|---:|---:|---:|---:|", file=sys.stderr)
    for r in rows:
        mark = " (old default)" * r["old_default"] + " (new default)" * r["new_default"]
        print(f"| {r['set']} | {r['n']:,} | {r['k']}{mark} | {r['mean_degree']} | {r['isolated']} | "
              f"{r['components']} | {r['largest_component']:,} |", file=sys.stderr)
    emit({"bench": "knn_default", "rows": rows}, args.out)


if __name__ == "__main__":
    main()
