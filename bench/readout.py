#!/usr/bin/env python3
"""The ridge read-out of the embedding as a source of graphdiff's estimate, replayed on a workflow
run's log. Rows: the default preset without embeddings (today's default), with the read-out chosen online
(readout auto: the preset's behaviour when the embeddings are given), each of its weights fixed, and label
propagation and the read-out-free default as references. Figures: full-log MAE, within-batch r, round-0
(first visits) within-batch r, ms per step; the read-out weight and ridge strength the online choice
settled at. Every prediction is made before its outcomes; no setting is tuned on the log.

    .venv/bin/python bench/readout.py artifacts/oneshot     # artifacts/math, artifacts/demo
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import round0_steps, run_file, run_inputs, run_log  # noqa: E402

ROWS = [
    ("default (no embeddings)", None, {}),
    ("default + readout auto", "emb", {"readout": "auto"}),
    ("default + readout 0.5", "emb", {"readout": 0.5}),
    ("default + readout 1 (read-out as the graph's estimate)", "emb", {"readout": 1.0}),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="workflow run folder (data/log.jsonl, graph/*.zarr, clusters/*.zarr, "
                                           "embeddings.zarr)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--only", nargs="*", help="row names to run (default: all)")
    args = ap.parse_args()

    from graphdiff_cli.evaluation import baselines as B
    from graphdiff_cli.evaluation.metrics import mae, within_batch
    from graphdiff_cli.evaluation.replay import replay
    from graphdiff_cli.estimator import Estimator
    from graphdiff_cli.io.readers import embedding_matrix
    from graphdiff_cli.evaluation.methods import GraphdiffMethod

    inp = run_inputs(args.run)
    ids, w, labels, k = inp.ids, inp.w, inp.labels, inp.k
    emb = embedding_matrix(run_file(args.run, "embeddings.zarr"), inp.graph)
    log = run_log(args.run, inp)
    r0 = round0_steps(log["step"], log["id"])
    print(f"{args.run}: N = {len(ids)}, d = {emb.shape[1]}, K = {k}, {len(np.unique(log['step']))} steps, "
          f"{len(log['step'])} rows, round 0 = {len(r0)} steps", flush=True)
    methods = [B.LabelPropagation(w)]
    for name, e, overrides in ROWS:
        if args.only and name not in args.only:
            continue
        est = Estimator(w, labels, k, embeddings=emb if e else None, device="cpu", **overrides)
        methods.append(GraphdiffMethod(est, name=name))
    t0 = time.perf_counter()
    res = replay(log["step"], log["id"], log["n"], log["s"], methods, n_nodes=len(ids))
    out = {}
    print(f"{'estimator':56s} {'MAE':>7s} {'within r':>9s} {'round-0 r':>10s} {'ms/step':>8s}  settled at")
    for m in methods:
        p, r = res.predictions[m.name], res.rate
        sel = np.isin(res.step, r0)
        row = {"mae": mae(p, r), "within_r": within_batch(res.step, p, r)["pearson"],
               "round0_r": within_batch(res.step[sel], p[sel], r[sel])["pearson"],
               "ms_per_step": 1000 * float(res.seconds[m.name].mean())}
        settled = ""
        if hasattr(m, "estimator"):
            est = m.estimator
            row.update(kappa=est.kappa_, propagation=est.propagation_, readout=est.readout_,
                       readout_ridge=est.readout_ridge_)
            settled = f"kappa {est.kappa_:.3g}, w {est.propagation_}, readout {est.readout_}, ridge {est.readout_ridge_}"
        out[m.name] = row
        print(f"{m.name:56s} {row['mae']:7.4f} {row['within_r']:9.4f} {row['round0_r']:10.4f} "
              f"{row['ms_per_step']:8.1f}  {settled}", flush=True)
    print(f"replay: {time.perf_counter() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
