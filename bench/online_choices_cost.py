#!/usr/bin/env python3
"""What the online choices cost per step at scale: label propagation's harmonic solve, the
counts under every time forgetting and the 180 scored mixes, against the previous default.

Builds the synthetic graph of bench/handoff_roundtrip.py (N nodes, K planted states, ~deg neighbours), then
runs `steps` updates of `batch` prompts through two in-process estimators (the default preset, and the
default with label_propagation off and time_forgetting 1, which was the default before the online choices) and
reports each one's median update time and its predict time for a batch. Not run by the tests.

    .venv/bin/python bench/online_choices_cost.py --n 150000 --k 320 --deg 40 --batch 256 --steps 8
"""

from __future__ import annotations

import argparse
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
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from graphdiff_cli import Estimator

    w, labels = synthetic_graph(args.n, args.k, args.deg)
    rng = np.random.default_rng(1)
    p_state = rng.uniform(0.05, 0.95, args.k)
    batches = []
    for _ in range(args.steps):
        ids = rng.choice(args.n, args.batch, replace=False)
        batches.append((ids, np.full(args.batch, 8), rng.binomial(8, p_state[labels[ids]])))
    out = {"bench": "online_choices_cost", "date": str(date.today()), "machine": platform.platform(),
           "n": args.n, "k": args.k, "deg": args.deg, "batch": args.batch, "steps": args.steps}
    for name, kw in (("default", {}), ("previous default", {"label_propagation": None, "time_forgetting": 1.0})):
        est = Estimator(w, labels, args.k, device="cpu", **kw)
        upd, pred = [], []
        for ids, n, s in batches:
            t0 = time.perf_counter()
            est.update(ids, n, s)
            upd.append(time.perf_counter() - t0)
            nxt = rng.choice(args.n, args.batch, replace=False)
            t0 = time.perf_counter()
            est.estimates(nxt)
            pred.append(time.perf_counter() - t0)
        # the first update starts from every row (q = A is no fixed point): report the later ones
        out[name] = {"update_s_median": float(np.median(upd[1:])), "update_s_first": upd[0],
                     "predict_batch_s_median": float(np.median(pred[1:]))}
    emit(out, args.out)


if __name__ == "__main__":
    main()
