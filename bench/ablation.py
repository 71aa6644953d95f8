#!/usr/bin/env python3
"""Ablation: from the paper's estimator to graphdiff's default preset, one change at a time.

Replays a run's log (each batch predicted before its outcomes) through a list of estimator settings
and prints full-run MAE, within-batch Pearson r, the paper's batch-level r and the cold-start
within-batch r over round 0 (the steps before any prompt is seen a second time). Input: a workflow run
folder (artifacts/<run>/ with data/log.jsonl, graph/*.zarr and clusters/*.zarr, one of each), e.g.

    snakemake --cores 2 --configfile configs/oneshot.yaml     # or configs/math.yaml, configs/default.yaml
    python bench/ablation.py artifacts/oneshot [--json out.json]

The figures of docs/lab/results.md ("Ablation") come from this script.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import round0_steps, run_inputs, run_log  # noqa: E402

# each row: (name, settings on top of the "paper" preset)
LADDER = [
    ("paper (Sections 3.4-3.6)", {}),
    ("+ residual schedule", {"schedule": "residual"}),
    ("+ evidence mixing, kappa 4", {"schedule": "residual", "mixing": "evidence", "prior_strength": 4.0}),
    ("+ kappa auto (prequential)", {"schedule": "residual", "mixing": "evidence", "prior_strength": "auto"}),
    ("+ prompt forgetting 0.85", {"schedule": "residual", "mixing": "evidence", "prior_strength": "auto",
                                  "prompt_forgetting": 0.85}),
    ("+ observed state prior", {"schedule": "residual", "mixing": "evidence", "prior_strength": "auto",
                                "prompt_forgetting": 0.85, "state_prior": "observed"}),
    ("+ neighbour smoothing 4 (the default before the online choices)", {"preset": "default", "label_propagation": None,
                                                           "time_forgetting": 1.0}),
    ("+ label propagation, time forgetting auto (= default)", {"preset": "default"}),
    ("default, offset mixing", {"preset": "default", "mixing": "offset"}),
    ("default, kappa 4 fixed", {"preset": "default", "prior_strength": 4.0}),
    ("default, state forgetting 0.95", {"preset": "default", "state_forgetting": 0.95}),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="workflow run folder (data/log.jsonl, graph/*.zarr, clusters/*.zarr)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--only", nargs="*", help="row names to run (default: all)")
    args = ap.parse_args()

    from graphdiff_cli.evaluation import baselines as B
    from graphdiff_cli.evaluation.metrics import batch_pearson, mae, within_batch
    from graphdiff_cli.evaluation.replay import replay
    from graphdiff_cli.estimator import Estimator
    from graphdiff_cli.evaluation.methods import GraphdiffMethod

    inp = run_inputs(args.run)
    ids, w, labels, k = inp.ids, inp.w, inp.labels, inp.k
    log = run_log(args.run, inp)
    r0 = round0_steps(log["step"], log["id"])
    print(f"{args.run}: N = {len(ids)}, K = {k}, {len(np.unique(log['step']))} steps, "
          f"{len(log['step'])} rows, round 0 = {len(r0)} steps", flush=True)

    methods = [B.HistoryMean(len(ids)), B.DiscountedHistory(len(ids), 0.8, 0.0, name="discounted(0.8, m=0)"),
               B.LabelPropagation(w)]
    for name, overrides in LADDER:
        if args.only and name not in args.only:
            continue
        s = {"device": "cpu", **overrides}
        methods.append(GraphdiffMethod(Estimator(w, labels, k, preset=s.pop("preset", "paper"), **s), name=name))
    t0 = time.perf_counter()
    res = replay(log["step"], log["id"], log["n"], log["s"], methods, n_nodes=len(ids))
    out = {}
    print(f"{'estimator':40s} {'MAE':>7s} {'within r':>9s} {'batch r':>8s} {'round-0 r':>10s} {'ms/step':>8s}")
    for m in methods:
        p, r = res.predictions[m.name], res.rate
        sel = np.isin(res.step, r0)
        row = {"mae": mae(p, r), "within_r": within_batch(res.step, p, r)["pearson"],
               "batch_r": batch_pearson(res.step, p, r),
               "round0_r": within_batch(res.step[sel], p[sel], r[sel])["pearson"],
               "ms_per_step": 1000 * float(res.seconds[m.name].mean())}
        if hasattr(m, "estimator"):
            row["kappa_end"] = m.estimator.kappa_
        out[m.name] = row
        print(f"{m.name:40s} {row['mae']:7.4f} {row['within_r']:9.4f} {row['batch_r']:8.4f} "
              f"{row['round0_r']:10.4f} {row['ms_per_step']:8.1f}", flush=True)
    print(f"replay: {time.perf_counter() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
