#!/usr/bin/env python3
"""The read-out's cost: the estimator's resident step at large N with and without the read-out of the
embedding. A planted graph (bench/handoff_roundtrip.py's: N prompts, K states, ~deg mutual neighbours) and
random unit embeddings of d coordinates; the default preset with and without ``embeddings=``; per step, as
the resident handoff runs it: ``update`` of a batch, then ``estimates`` of the next candidate batch. Prints
the median and range of the steps after the first two (the first steps relax q from the prior), the
predictions of every prompt once, the read-out's memory, and the ratio. In-process: the durable write of a
step (the same for both but for the read-out's (d + 1)^2 statistics) is not included.

    .venv/bin/python bench/readout_cost.py --n 150000 --k 320 --deg 40 --dim 384 --batch 256 --steps 9
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
from bench.common import synthetic_graph  # noqa: E402


def run(w, labels, k, emb, args, rng_seed=0):
    from graphdiff_cli.estimator import Estimator

    rng = np.random.default_rng(rng_seed)
    n = w.shape[0]
    true_p = rng.beta(1.2, 1.5, n)
    est = Estimator(w, labels, k, embeddings=emb, device="cpu", max_iters=args.max_iters)
    times = []
    for _ in range(args.steps):
        ids = rng.choice(n, args.batch, replace=False)
        s = rng.binomial(args.rollouts, true_p[ids])
        nxt = rng.choice(n, args.batch, replace=False)
        t0 = time.perf_counter()
        est.update(ids, np.full(ids.size, args.rollouts), s)
        est.estimates(nxt, group_size=args.rollouts)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    est.predict()
    t_all = time.perf_counter() - t0
    tail = np.array(times[2:]) if len(times) > 2 else np.array(times)
    return {"step_median_s": float(np.median(tail)), "step_min_s": float(tail.min()), "step_max_s": float(tail.max()),
            "steps": [round(t, 4) for t in times], "predict_all_s": t_all, "readout": est.readout_,
            "readout_ridge": est.readout_ridge_}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=150_000)
    ap.add_argument("--k", type=int, default=320)
    ap.add_argument("--deg", type=int, default=40)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--max-iters", type=int, default=50)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    w, labels = synthetic_graph(args.n, args.k, args.deg)
    rng = np.random.default_rng(1)
    emb = rng.standard_normal((args.n, args.dim)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    out = {"date": str(date.today()), "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
           "n": args.n, "k": args.k, "deg": args.deg, "dim": args.dim, "batch": args.batch,
           "embeddings_mb": emb.nbytes / 2**20}
    out["without"] = run(w, labels, args.k, None, args)
    out["with_readout"] = run(w, labels, args.k, emb, args)
    out["ratio_step"] = out["with_readout"]["step_median_s"] / out["without"]["step_median_s"]
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
