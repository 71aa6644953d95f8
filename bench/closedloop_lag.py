#!/usr/bin/env python3
"""How far graphdiff's estimate lags the policy in the closed loop.

Replays a run's outcome log (``outcomes.jsonl``: every generated group, in order) through a fresh graphdiff
Estimator loaded from the grid's STATE, the same outcomes in the same order: each step's groups predicted before
their outcomes, then the step's outcomes added (the runs' selection rules planned step t from the estimate after
step t-2, ``estimator_step_at_plan``: one step staler than this replay). Per window of steps: the mean predicted
pass rate, the mean observed s/n of the same groups, their difference (the level bias: negative = the estimate
trails an improving policy), the step-to-step rise of the observed rate, and the lag in steps that the bias amounts
to (-bias / rise per step); and the bias per (skill, level) cell over the whole run, groups pooled over seeds. On
the uniform arm the groups are an unbiased draw of the pool, so its observed rate is the policy's.

    .venv/bin/python bench/closedloop_lag.py --data artifacts/cl-cpu/data --state artifacts/cl-cpu/graph/STATE \
        --runs artifacts/cl-cpu/runs --schedulers uniform,gd-ds --seeds 0-5 [--window 10] [--out lag.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from graphdiff_cli.estimator import Estimator
from graphdiff_cli.io.readers import IdIndex

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import emit, seeds_of  # noqa: E402
from closedloop.scores import cell_of  # noqa: E402


def replay(state: Path, index: IdIndex, outcomes: Path, cells: dict) -> list[tuple[int, float, float, int]]:
    """(step, mean p-hat, mean s/n, groups) per step, each step predicted before its outcomes; ``cells``
    collects (p-hat - s/n) per group by cell."""
    est = Estimator.load(state, device="cpu")
    rows = []
    for line in outcomes.read_text().splitlines():
        r = json.loads(line)
        ids, n, s = index.nodes(r["ids"]), np.asarray(r["n"], float), np.asarray(r["s"], float)
        if not ids.size:
            continue
        p = est.predict(ids)
        for name, d in zip(r["ids"], p - s / n):
            cells.setdefault(cell_of(name), []).append(float(d))
        rows.append((int(r["step"]), float(p.mean()), float((s / n).mean()), len(ids)))
        est.update(ids, n.astype(int), s.astype(int))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, required=True, help="the grid's data folder (train.jsonl: node order)")
    ap.add_argument("--state", type=Path, required=True)
    ap.add_argument("--runs", type=Path, required=True)
    ap.add_argument("--schedulers", default="uniform,gd-ds")
    ap.add_argument("--seeds", default="0-5")
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    seeds = seeds_of(args.seeds)
    train = [json.loads(x) for x in (args.data / "train.jsonl").read_text().splitlines() if x.strip()]
    index = IdIndex([r["id"] for r in train], "the training pool")
    out = {"state": str(args.state), "runs": str(args.runs), "window": args.window, "schedulers": {}}
    for name in args.schedulers.split(","):
        cells: dict = {}
        per_seed = [replay(args.state, index, args.runs / name / f"s{seed}" / "outcomes.jsonl", cells)
                    for seed in seeds]
        steps = max(r[0] for rows in per_seed for r in rows)
        windows = []
        for lo in range(1, steps + 1, args.window):
            hi = min(lo + args.window - 1, steps)
            sel = [[r for r in rows if lo <= r[0] <= hi] for rows in per_seed]
            pred = np.array([np.mean([r[1] for r in x]) for x in sel])
            obs = np.array([np.mean([r[2] for r in x]) for x in sel])
            windows.append({"steps": f"{lo}-{hi}", "predicted": round(float(pred.mean()), 4),
                            "observed": round(float(obs.mean()), 4), "bias": round(float((pred - obs).mean()), 4),
                            "bias_sd_over_seeds": round(float((pred - obs).std(ddof=1)), 4) if len(sel) > 1 else None})
        # the observed rate's rise per step: least squares over all steps and seeds
        st = np.array([r[0] for rows in per_seed for r in rows], float)
        ob = np.array([r[2] for rows in per_seed for r in rows])
        slope = float(np.polyfit(st, ob, 1)[0])
        for w in windows:
            w["lag_steps"] = round(-w["bias"] / slope, 1) if slope > 0 else None
        out["schedulers"][name] = {"seeds": len(per_seed), "rise_per_step": round(slope, 5), "windows": windows,
                                   "bias_by_cell": {c: {"bias": round(float(np.mean(v)), 4), "groups": len(v)}
                                                    for c, v in sorted(cells.items())}}
        print(name, json.dumps(out["schedulers"][name]), flush=True)
    emit(out, args.out)


if __name__ == "__main__":
    main()
