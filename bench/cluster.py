#!/usr/bin/env python3
"""Benchmark `graphdiff cluster`'s eigen-solvers (ARPACK, LOBPCG + AMG) and k-means (numpy Lloyd, faiss).

    python bench/cluster.py graph --n 150000 --out /tmp/g150k                 # exact kNN graph, k_nn 80
    python bench/cluster.py graph --planted --n 1000000 --deg 60 --out /tmp/g1m
    python bench/cluster.py solve --graph /tmp/g150k --states 320 --solvers arpack lobpcg-amg --repeats 3
    python bench/cluster.py solve --artifact artifacts/deepscaler/graph/k80.zarr --states 320

graph: the graph `graphdiff cluster` is given at scale, saved as W (.w.npz) and the directed kNN lists
(.nbr.npy). By default bench/extend.py's rebuild input (clustered unit vectors: 2,000 topic centres plus
noise, 384-dim), searched exactly (backends.knn, k_nn 80) and mutually filtered as `build-graph` does;
with --planted, bench.common's planted graph (K planted states, ~deg neighbours each, 85% inside), which
needs no search and so reaches a million nodes.
solve: core.spectral.spectral_states on it with each eigen-solver, --repeats times, the k-means step run with
both Lloyd (the default) and faiss on the same spectral embedding. Each run reports wall and CPU seconds of
the eigen-solve and of each k-means, the load average around it, the eigen-residual max_i ||M v_i - lambda_i
v_i||, the k-means inertia, and the adjusted Rand index of each partition (Lloyd's) against --reference's or
else the first run's, and of faiss's against it. Medians over the repeats are given per solver. One JSON object on stdout (and in --out if given).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import adjusted_rand, emit, synthetic_embeddings, synthetic_graph  # noqa: E402


def build_graph(args) -> dict:
    t0 = time.perf_counter()
    if args.planted:
        w, _ = synthetic_graph(args.n, args.states, args.deg)
        nbr = None
    else:
        from graphdiff_cli.backends.knn import knn_search
        from graphdiff_cli.core.graph import drop_self, mutual_knn_graph

        x = synthetic_embeddings(args.n, args.dim, args.topics)
        res = knn_search(x, args.k_nn + 1, device="cpu", index=args.index)
        nbr, sim = drop_self(res.neighbors, res.similarities, args.k_nn)
        w = mutual_knn_graph(nbr, sim)
    seconds = time.perf_counter() - t0
    sp.save_npz(args.out + ".w.npz", sp.csr_matrix(w))
    if nbr is not None:
        np.save(args.out + ".nbr.npy", nbr)
    return {"n": args.n, "planted": args.planted, "edges": int(w.nnz // 2), "build_s": seconds, "out": args.out}


def load(args):
    if args.artifact:
        from graphdiff_cli.io.readers import read_graph

        g = read_graph(args.artifact)
        return sp.csr_matrix(g.w), g.knn_indices(), str(args.artifact)
    w = sp.load_npz(args.graph + ".w.npz").tocsr()
    nbr_path = Path(args.graph + ".nbr.npy")
    return w, (np.load(nbr_path) if nbr_path.exists() else None), args.graph


def solve(args) -> dict:
    from graphdiff_cli.backends.cluster import amg_preconditioner, faiss_kmeans
    from graphdiff_cli.core.spectral import inertia, kmeans, spectral_states

    w, nbr, source = load(args)
    runs, reference = [], None
    for solver in args.solvers:
        how = {} if solver == "arpack" else {"eigen_solver": "lobpcg", "preconditioner": amg_preconditioner}
        for rep in range(args.repeats):
            seen = {"lloyd_s": 0.0, "lloyd_cpu_s": 0.0, "faiss_s": 0.0, "faiss_cpu_s": 0.0, "faiss_inertia": 0.0,
                    "faiss_vs_lloyd": []}

            def assign(x, k, seed):
                for name, fn in (("faiss", faiss_kmeans), ("lloyd", kmeans)):
                    t, c = time.perf_counter(), time.process_time()
                    lab = fn(x, k, seed)
                    seen[f"{name}_s"] += time.perf_counter() - t
                    seen[f"{name}_cpu_s"] += time.process_time() - c
                    if name == "faiss":
                        seen["faiss_inertia"] += inertia(x, np.asarray(lab))
                        faiss_lab = np.asarray(lab)
                seen["faiss_vs_lloyd"].append(adjusted_rand(faiss_lab, np.asarray(lab)))
                return lab  # Lloyd's, as `cluster` runs by default

            load_before = os.getloadavg()[0]
            t, c = time.perf_counter(), time.process_time()
            res = spectral_states(w, args.states, seed=args.seed, fallback_neighbors=nbr, assign=assign, **how)
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            if reference is None:
                reference = np.load(args.reference) if args.reference else res.labels
            if args.labels_out:
                np.save(f"{args.labels_out}.{solver}.{rep}.npy", res.labels)
            runs.append({"solver": solver, "repeat": rep, "solvers": res.solvers,
                         "eigen_s": wall - seen["lloyd_s"] - seen["faiss_s"],
                         "eigen_cpu_s": cpu - seen["lloyd_cpu_s"] - seen["faiss_cpu_s"],
                         "lloyd_s": seen["lloyd_s"], "lloyd_cpu_s": seen["lloyd_cpu_s"],
                         "faiss_s": seen["faiss_s"], "faiss_cpu_s": seen["faiss_cpu_s"],
                         "eigen_residual": res.eigen_residual, "lloyd_inertia": res.inertia,
                         "faiss_inertia": seen["faiss_inertia"],
                         "faiss_vs_lloyd_ari": min(seen["faiss_vs_lloyd"], default=1.0),
                         "ari_vs_reference": adjusted_rand(reference, res.labels),
                         "load_1min": [load_before, os.getloadavg()[0]]})
            print(runs[-1], file=sys.stderr, flush=True)
    keys = ("eigen_s", "eigen_cpu_s", "lloyd_s", "lloyd_cpu_s", "faiss_s", "faiss_cpu_s", "eigen_residual",
            "lloyd_inertia", "faiss_inertia", "ari_vs_reference")
    medians = {s: {k: float(np.median([r[k] for r in runs if r["solver"] == s])) for k in keys}
               for s in args.solvers}
    return {"graph": source, "n": int(w.shape[0]), "edges": int(w.nnz // 2), "states": args.states,
            "repeats": args.repeats, "medians": medians, "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    g = sub.add_parser("graph")
    g.add_argument("--n", type=int, default=150_000)
    g.add_argument("--dim", type=int, default=384)
    g.add_argument("--topics", type=int, default=2000)
    g.add_argument("--k-nn", type=int, default=80)
    g.add_argument("--index", default="exact", choices=["exact", "hnsw", "ivf"])
    g.add_argument("--planted", action="store_true")
    g.add_argument("--states", type=int, default=320, help="planted states (--planted)")
    g.add_argument("--deg", type=int, default=60, help="neighbours per node (--planted)")
    g.add_argument("--out", required=True, help="path prefix of the saved graph")
    s = sub.add_parser("solve")
    s.add_argument("--graph", help="path prefix written by `graph`")
    s.add_argument("--artifact", help="a graph artifact instead (build-graph's)")
    s.add_argument("--states", type=int, default=320)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--solvers", nargs="+", default=["arpack", "lobpcg-amg"], choices=["arpack", "lobpcg-amg"])
    s.add_argument("--repeats", type=int, default=3)
    s.add_argument("--reference", help="labels (.npy) the partitions are compared with; else the first run's")
    s.add_argument("--labels-out", help="path prefix: each run's labels saved as PREFIX.SOLVER.REPEAT.npy")
    s.add_argument("--json-out", dest="out")
    g.add_argument("--json-out", dest="json_out")
    args = ap.parse_args()
    out = build_graph(args) if args.what == "graph" else solve(args)
    out |= {"what": args.what, "date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
            "threads": os.environ.get("OMP_NUM_THREADS", "default")}
    emit(out, getattr(args, "json_out", None) if args.what == "graph" else args.out)


if __name__ == "__main__":
    main()
