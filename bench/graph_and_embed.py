#!/usr/bin/env python3
"""Benchmark graph construction (faiss kNN + mutual filter) and embedding throughput.

    python bench/graph_and_embed.py knn --n 150000 --dim 1024 --k 80
    python bench/graph_and_embed.py knn --n 100000 --dim 384 --k 80 --index ivf     # recall on a sample
    python bench/graph_and_embed.py embed --prompts ../shared/data/math/math_train.jsonl --limit 2000

knn: random unit vectors with a planted cluster structure (N x dim, float32), the exact inner-product
search `graphdiff build-graph` runs (backends.knn.knn_search, k + 1 hits with self) and the mutual
filter (core.graph.mutual_knn_graph); prints seconds for each and the graph's size.
embed: graphdiff's Encoder (length-sorted batches, the difficulty-aware instruction) against raw
sentence-transformers `encode` of the same texts, model and device, both timed after one warm-up
batch; prints prompts per second and the ratio.
One JSON object on stdout (and in --out if given).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import emit  # noqa: E402


def bench_knn(args) -> dict:
    from graphdiff_cli.backends.knn import knn_search, sampled_recall
    from graphdiff_cli.core.graph import drop_self, mutual_knn_graph, normalize_rows

    rng = np.random.default_rng(0)
    centers = rng.standard_normal((max(2, args.n // 500), args.dim)).astype(np.float32)
    x = centers[rng.integers(0, centers.shape[0], args.n)] + 0.7 * rng.standard_normal((args.n, args.dim),
                                                                                         dtype=np.float32)
    x = normalize_rows(x).astype(np.float32)
    t0 = time.perf_counter()
    res = knn_search(x, args.k + 1, device=args.device, index=args.index)
    t_search = time.perf_counter() - t0
    recall = None
    if args.index != "exact":
        t1 = time.perf_counter()
        recall = sampled_recall(x, res.neighbors, sample=args.recall_sample) | {"seconds": time.perf_counter() - t1}
    t0 = time.perf_counter()
    nb, sim = drop_self(res.neighbors, res.similarities, args.k)
    w = mutual_knn_graph(nb, sim)
    t_mutual = time.perf_counter() - t0
    return {"n": args.n, "dim": args.dim, "k": args.k, "index": args.index, "index_params": res.params,
            "recall": recall, "backend": res.backend, "device": res.device,
            "search_s": t_search, "mutual_s": t_mutual, "total_s": t_search + t_mutual,
            "edges": int(w.nnz // 2), "mean_degree": float(w.nnz / args.n)}


def bench_embed(args) -> dict:
    from graphdiff_cli.backends.embed import DEFAULT_INSTRUCTION, Encoder, format_text

    texts = []
    with open(args.prompts, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            texts.append(row.get("prompt") or row.get("problem") or row.get("text"))
            if len(texts) >= args.limit:
                break
    formatted = [format_text(t, DEFAULT_INSTRUCTION) for t in texts]
    enc = Encoder(device=args.device)
    model = enc.model_
    model.encode(formatted[: args.batch_size], batch_size=args.batch_size)  # warm-up
    t0 = time.perf_counter()
    model.encode(formatted, batch_size=args.batch_size, convert_to_numpy=True)
    t_raw = time.perf_counter() - t0
    t0 = time.perf_counter()
    enc.encode(formatted, batch_size=args.batch_size)
    t_gd = time.perf_counter() - t0
    return {"prompts": len(texts), "batch_size": args.batch_size, "device": str(model.device),
            "raw_encode_s": t_raw, "graphdiff_encode_s": t_gd, "raw_per_s": len(texts) / t_raw,
            "graphdiff_per_s": len(texts) / t_gd, "graphdiff_over_raw_time": t_gd / t_raw}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    k = sub.add_parser("knn")
    k.add_argument("--n", type=int, default=150_000)
    k.add_argument("--dim", type=int, default=1024)
    k.add_argument("--k", type=int, default=80)
    k.add_argument("--device", default="auto")
    k.add_argument("--index", default="exact", choices=["exact", "hnsw", "ivf"])
    k.add_argument("--recall-sample", type=int, default=1000)
    e = sub.add_parser("embed")
    e.add_argument("--prompts", required=True)
    e.add_argument("--limit", type=int, default=2000)
    e.add_argument("--batch-size", type=int, default=64)
    e.add_argument("--device", default="auto")
    for p in (k, e):
        p.add_argument("--out")
    args = ap.parse_args()
    out = bench_knn(args) if args.what == "knn" else bench_embed(args)
    import torch

    out |= {"what": args.what, "date": date.today().isoformat(),
            "machine": f"{platform.machine()}, {torch.get_num_threads()} threads"}
    emit(out, args.out)


if __name__ == "__main__":
    main()
