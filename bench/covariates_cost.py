#!/usr/bin/env python3
"""What the covariates' read-out costs a step: the default preset's resident ``update`` at the paper's scale
(a planted graph of N prompts, K states, ~deg neighbours, unit random embeddings of d coordinates for the
embedding's read-out), without covariates and with c covariate features and a reference rate, the two
estimators stepped alternately on the same batches (so a load on the machine falls on both alike). Prints the
median and range of each one's step time after --warm steps, and their ratio, as JSON.

Run against older code (``PYTHONPATH=<worktree>``), where ``Estimator`` takes no covariates, it times the one
without covariates alone: the step of the code before covariates existed.

    .venv/bin/python bench/covariates_cost.py --n 150000 --k 320 --deg 40 --batch 256 --steps 7
"""

from __future__ import annotations

import argparse
import inspect
import platform
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import emit, synthetic_graph  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=150_000)
    ap.add_argument("--k", type=int, default=320)
    ap.add_argument("--deg", type=int, default=40)
    ap.add_argument("--dim", type=int, default=384, help="embedding coordinates (the read-out of the embedding)")
    ap.add_argument("--features", type=int, default=20, help="covariate features (c)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--warm", type=int, default=3, help="steps before timing (the first starts from every row)")
    ap.add_argument("--steps", type=int, default=7, help="timed steps per estimator")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import graphdiff_cli
    from graphdiff_cli import Estimator

    rng = np.random.default_rng(0)
    w, labels = synthetic_graph(args.n, args.k, args.deg)
    emb = rng.standard_normal((args.n, args.dim)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    true_p = rng.beta(0.7, 0.9, args.k)[labels]
    ests = {"default": Estimator(w, labels, args.k, embeddings=emb)}
    if "covariates" in inspect.signature(Estimator.__init__).parameters:
        cov = rng.standard_normal((args.n, args.features))
        ref = np.where(rng.random(args.n) < 0.7, np.clip(true_p + rng.normal(0, 0.15, args.n), 0, 1), np.nan)
        ests["default + covariates"] = Estimator(w, labels, args.k, embeddings=emb, covariates=cov, reference_rate=ref)
    times = {name: [] for name in ests}
    for t in range(args.warm + args.steps):
        ids = rng.choice(args.n, args.batch, replace=False)
        n = np.full(args.batch, args.rollouts)
        s = rng.binomial(args.rollouts, true_p[ids])
        for name, est in ests.items():
            t0 = time.perf_counter()
            est.update(ids, n, s)
            if t >= args.warm:
                times[name].append(time.perf_counter() - t0)
    out = {"date": date.today().isoformat(), "machine": f"{platform.machine()}, {platform.processor() or '?'}",
           "graphdiff": str(Path(graphdiff_cli.__file__).resolve().parent), "args": vars(args), "edges": int(w.nnz),
           "steps": {name: {"median_s": float(np.median(v)), "min_s": float(min(v)), "max_s": float(max(v))}
                     for name, v in times.items()}}
    if len(times) == 2:
        a, b = (np.median(v) for v in times.values())
        out["ratio_with_covariates"] = float(b / a)
        out["covariate_weight"] = ests["default + covariates"].covariate_readout_
    emit(out, args.out)


if __name__ == "__main__":
    main()
