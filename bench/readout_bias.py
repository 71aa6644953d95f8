#!/usr/bin/env python3
"""Where the read-out of the embedding moves the report's calibration and batch-mean figures. The
run's log replayed through graphdiff's default preset (the workflow's evaluate settings) without embeddings
(no read-out), with the read-out's weight chosen online (``readout: auto``, the default when the embeddings
are given) and with it fixed; per third of the run and per subset (all rows, rows of prompts seen before,
first visits): the level bias (mean p-hat - mean observed rate), ECE, batch-mean r and MAE, as `evaluate`
computes them (evaluation.metrics). Every prediction is made before its outcomes; nothing is tuned on the log.

    .venv/bin/python bench/readout_bias.py artifacts/math                 # artifacts/demo, artifacts/oneshot
    .venv/bin/python bench/readout_bias.py artifacts/math --rows none auto 0.25 1
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import run_file, run_inputs, run_log  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="workflow run folder (data/log.jsonl, graph/*.zarr, clusters/*.zarr, "
                                           "embeddings.zarr)")
    ap.add_argument("--rows", nargs="+", default=["none", "auto", "0.25", "1"],
                    help="none (no embeddings), auto, or a fixed read-out weight")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    from graphdiff_cli.evaluation import metrics as M
    from graphdiff_cli.evaluation.replay import replay
    from graphdiff_cli.estimator import Estimator
    from graphdiff_cli.io.readers import embedding_matrix
    from graphdiff_cli.evaluation.methods import GraphdiffMethod

    inp = run_inputs(args.run)
    emb = embedding_matrix(run_file(args.run, "embeddings.zarr"), inp.graph)
    log = run_log(args.run, inp)
    methods = []
    for row in args.rows:
        readout = {} if row == "none" else {"readout": row if row == "auto" else float(row)}
        est = Estimator(inp.w, inp.labels, inp.k, embeddings=None if row == "none" else emb, device="cpu",
                        beta=2.0, gamma=0.5, **readout)  # the workflow's evaluate settings (configs/*.yaml)
        methods.append(GraphdiffMethod(est, name=row))
    t0 = time.perf_counter()
    res = replay(log["step"], log["id"], log["n"], log["s"], methods, n_nodes=len(inp.ids))
    print(f"{args.run}: N = {len(inp.ids)}, {len(res.steps)} steps, {res.step.size} rows "
          f"({int((~res.seen).sum())} first visits); replay {time.perf_counter() - t0:.0f} s")
    rate, phases = res.rate, M.phase_of_steps(res.step)
    subsets = {"all": np.ones(res.step.size, bool), "seen": res.seen, "first visits": ~res.seen}
    out: dict = {}
    for m in methods:
        p = res.predictions[m.name]
        est = m.estimator
        out[m.name] = {"settled": {"readout": est.readout_, "ridge": est.readout_ridge_, "w": est.propagation_}}
        for sub, smask in subsets.items():
            for ph, pmask in phases.items():
                sel = smask & pmask
                if sel.sum() < 2:
                    continue
                out[m.name][f"{sub}/{ph}"] = {
                    "rows": int(sel.sum()), "bias": float(p[sel].mean() - rate[sel].mean()),
                    "ece": M.ece(p[sel], rate[sel]), "batch_r": M.batch_pearson(res.step[sel], p[sel], rate[sel]),
                    "mae": M.mae(p[sel], rate[sel]),
                    "within_r": M.within_batch(res.step[sel], p[sel], rate[sel])["pearson"]}
    print("settled at: " + "; ".join(f"{m.name}: readout {out[m.name]['settled']['readout']}, ridge "
                                      f"{out[m.name]['settled']['ridge']}, w {out[m.name]['settled']['w']}"
                                      for m in methods))
    keys = [k for k in out[methods[0].name] if k != "settled"]
    print(f"{'subset/phase':20s} {'rows':>6s}  " + "  ".join(f"{m.name + ': bias, ECE, batch r, MAE, within r':46s}"
                                                             for m in methods))
    for k in keys:
        cells = []
        for m in methods:
            f = out[m.name].get(k)
            cells.append(f"{f['bias']:+.4f} {f['ece']:.4f} {f['batch_r']:7.4f} {f['mae']:.4f} {f['within_r']:7.4f}"
                         .ljust(46) if f else "".ljust(46))
        print(f"{k:20s} {out[methods[0].name][k]['rows']:6d}  " + "  ".join(cells))
    lag = level_lag(res.step, res.ids, rate, ~res.seen)
    print(f"level lag: a batch's first visits score {lag.mean():+.4f} above the mean rate of the prompts seen before "
          f"them (mean over the {lag.size} steps with first visits after the first; what an estimator whose level is "
          "the history's mean misses)")
    out["level_lag"] = {"mean": float(lag.mean()), "steps": int(lag.size)}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


def level_lag(step, ids, rate, first) -> np.ndarray:
    """Per step with first visits (after the first step): the first visits' mean rate minus the mean of the
    first-visit rates of every prompt seen at earlier steps (each prompt once, as the read-out's rows)."""
    out, total, count = [], 0.0, 0
    for t in np.unique(step):
        m = step == t
        new = first[m]
        if count and new.any():
            out.append(rate[m][new].mean() - total / count)
        total, count = total + rate[m][new].sum(), count + int(new.sum())
    return np.array(out)


if __name__ == "__main__":
    main()
