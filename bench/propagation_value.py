#!/usr/bin/env python3
"""What label propagation's field adds to the default estimate, against what it costs: the default preset beside
the default without label propagation and the default with the field solved only every m-th step, on the three
logs and on DeepScaleR's cold start.

logs        Workflow run folders (data/log.jsonl, graph/*.zarr, clusters/*.zarr, embeddings.zarr), each replayed
            (no look-ahead, ``evaluation.replay``) through the rows, each with the run's embeddings (the default
            preset's read-out on). Figures: full-log MAE, within-batch r and round-0 (first visits) within-batch r,
            each with its circular block bootstrap over steps (``metrics.ratio_bootstrap``), and every row's
            paired difference against the default (``mae_difference``, ``within_r_difference``); ms per step; the
            online choices each row settled on.
deepscaler  The cold start of ``evaluation.coldstart`` on DeepScaleR's 29,095 problems (the run folder that embed,
            build-graph and cluster make from deepscaler_difficulty/problems.jsonl, embeddings included): 2/10/30%
            revealed, seeds 0, 1, 2, 8 rollouts ~ Binomial(8, s/128) per revealed problem in steps of 256; every
            hidden problem scored by Pearson r and MAE against s/128; each draw's paired difference row - default,
            summarised by a 95% Student-t interval over draws.

Rows: "default" (the preset), "without label propagation" (``label_propagation: null``) and, for each m of
``--every``, "field every m" (``propagation_every: m``). Nothing is tuned on the logs.

    .venv/bin/python bench/propagation_value.py logs artifacts/{demo,oneshot,math} --every 4 --out lp_logs.json
    .venv/bin/python bench/propagation_value.py deepscaler artifacts/deepscaler --every 4 --out lp_ds.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import SHARED_DATA, emit, round0_steps, run_file, run_inputs, run_log, step_scores  # noqa: E402

DEFAULT, WITHOUT = "default", "without label propagation"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def rows_of(every: list[int], without: bool = True) -> dict[str, dict]:
    """{row name: settings on top of the default preset}."""
    rows = {DEFAULT: {}}
    if without:
        rows[WITHOUT] = {"label_propagation": None}
    for m in every:
        rows[f"field every {m}"] = {"propagation_every": m}
    return rows


def fmt(b: dict, digits: int = 4) -> str:
    return f"{b['estimate']:+.{digits}f} [{b['lo']:+.{digits}f}, {b['hi']:+.{digits}f}]"


def settled(est) -> dict:
    return {"kappa": est.kappa_, "propagation": est.propagation_, "readout": est.readout_}


def logs(args) -> None:
    from graphdiff_cli.estimator import Estimator
    from graphdiff_cli.evaluation.metrics import mae_difference, within_r_difference
    from graphdiff_cli.evaluation.methods import GraphdiffMethod
    from graphdiff_cli.evaluation.replay import replay
    from graphdiff_cli.io.readers import embedding_matrix

    rows = rows_of(args.every, not args.no_without)
    out = {"command": "logs", "rows": rows, "runs": {}}
    for run in args.runs:
        inp = run_inputs(run)
        emb = embedding_matrix(run_file(run, "embeddings.zarr"), inp.graph)
        lg = run_log(run, inp)
        r0_steps = round0_steps(lg["step"], lg["id"])
        methods = [GraphdiffMethod(Estimator(inp.w, inp.labels, inp.k, embeddings=emb, device="cpu", **s), name=name)
                   for name, s in rows.items()]
        log(f"{run}: N = {len(inp.ids)}, {len(np.unique(lg['step']))} steps, round 0 = {len(r0_steps)} steps")
        t0 = time.perf_counter()
        res = replay(lg["step"], lg["id"], lg["n"], lg["s"], methods, n_nodes=len(inp.ids))
        r0 = np.isin(res.step, r0_steps)
        every = np.ones(res.step.size, dtype=bool)
        fig = {"replay_seconds": time.perf_counter() - t0, "round0_steps": int(len(r0_steps)), "rows": {},
               "differences": {}}
        for m in methods:
            p = res.predictions[m.name]
            within, full = step_scores(res.step, p, res.rate, every)
            r0_r, _ = step_scores(res.step, p, res.rate, r0)
            fig["rows"][m.name] = {"mae": full, "within_r": within, "round0_r": r0_r,
                                   "ms_per_step": 1000 * float(res.seconds[m.name].mean()),
                                   "settled": settled(m.estimator)}
        base = res.predictions[DEFAULT]
        for name in rows:
            if name == DEFAULT:
                continue
            p = res.predictions[name]
            fig["differences"][f"{name} - {DEFAULT}"] = {
                "mae": mae_difference(res.step, p, base, res.rate),
                "within_r": within_r_difference(res.step, p, base, res.rate),
                "round0_r": within_r_difference(res.step[r0], p[r0], base[r0], res.rate[r0]),
                "max_abs_prediction_difference": float(np.max(np.abs(p - base)))}
        out["runs"][str(run)] = fig
        print(f"\n{run} ({fig['replay_seconds']:.0f} s)")
        print(f"{'row':28s} {'MAE [95%]':>28s} {'within r [95%]':>28s} {'round-0 r [95%]':>28s} {'ms/step':>8s}")
        for name, row in fig["rows"].items():
            print(f"{name:28s} {fmt(row['mae']):>28s} {fmt(row['within_r']):>28s} {fmt(row['round0_r']):>28s} "
                  f"{row['ms_per_step']:8.1f}  {row['settled']}")
        for name, d in fig["differences"].items():
            print(f"{name:28s} {fmt(d['mae']):>28s} {fmt(d['within_r']):>28s} {fmt(d['round0_r']):>28s}"
                  f"  max |dp| {d['max_abs_prediction_difference']:.3g}", flush=True)
    emit(out, args.out)


def deepscaler(args) -> None:
    from graphdiff_cli.estimator import Estimator
    from graphdiff_cli.evaluation.coldstart import reveal, score_cold_start, t_interval
    from graphdiff_cli.evaluation.methods import GraphdiffMethod
    from graphdiff_cli.io.readers import read_inputs

    inp = read_inputs(run_file(args.run, "graph/*.zarr"), run_file(args.run, "clusters/*.zarr"),
                      args.run / "embeddings.zarr")
    known = {}
    with open(args.problems, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            known[str(row["id"])] = int(row["s"]) / int(row["n"])
    rate = np.array([known[i] for i in inp.ids])
    rows = rows_of(args.every, not args.no_without)
    fractions = [float(x) for x in args.fractions.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    log(f"{len(inp.ids):,} prompts, K = {inp.k}; rows {list(rows)}")
    draws = []
    for frac in fractions:
        for seed in seeds:
            plan = reveal(rate, frac, seed=seed, rollouts=8, batch=256)
            methods = [GraphdiffMethod(Estimator(inp.w, inp.labels, inp.k, embeddings=inp.embeddings, device="cpu",
                                                 **s), name=name) for name, s in rows.items()]
            res = score_cold_start(methods, plan, rate)
            steps = int(plan.step.max())
            draws.append({"fraction": frac, "seed": seed, "steps": steps,
                          "rows": {m.name: {"pearson": res[m.name]["pearson"], "mae": res[m.name]["mae"],
                                            "ms_per_step": 1000 * res[m.name]["update_seconds"] / steps,
                                            "settled": settled(m.estimator)} for m in methods}})
            log(f"fraction {frac:g} seed {seed}: " + ", ".join(
                f"{n} r {v['pearson']:.4f} MAE {v['mae']:.4f} ({v['ms_per_step']:.0f} ms/step)"
                for n, v in draws[-1]["rows"].items()))
    summary = {}
    for frac in fractions:
        here = [d for d in draws if d["fraction"] == frac]
        summary[f"{frac:g}"] = {
            "rows": {n: {k: t_interval([d["rows"][n][k] for d in here]) for k in ("pearson", "mae")} for n in rows},
            "differences": {f"{n} - {DEFAULT}": {k: t_interval([d["rows"][n][k] - d["rows"][DEFAULT][k] for d in here])
                                                 for k in ("pearson", "mae")} for n in rows if n != DEFAULT}}
    out = {"command": "deepscaler", "run": str(args.run), "rows": rows, "fractions": fractions, "seeds": seeds,
           "summary": summary, "draws": draws,
           "interval": "mean over draws with a 95% Student-t interval (t_{0.975, draws-1} sd / sqrt(draws))"}
    for frac, s in summary.items():
        print(f"\n{float(frac):.0%} revealed: {'Pearson r [95%]':>30s} {'MAE [95%]':>30s}")
        for name, v in {**s["rows"], **s["differences"]}.items():
            cells = [f"{v[k]['mean']:+.4f} [{v[k]['lo']:+.4f}, {v[k]['hi']:+.4f}]" for k in ("pearson", "mae")]
            print(f"{name:40s} {cells[0]:>30s} {cells[1]:>30s}")
    emit(out, args.out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    a = sub.add_parser("logs", help="replay workflow runs' logs through the rows")
    a.add_argument("runs", type=Path, nargs="+")
    b = sub.add_parser("deepscaler", help="DeepScaleR's cold start through the rows")
    b.add_argument("run", type=Path)
    b.add_argument("--problems", type=Path, default=SHARED_DATA / "deepscaler_difficulty" / "problems.jsonl")
    b.add_argument("--fractions", default="0.02,0.1,0.3")
    b.add_argument("--seeds", default="0,1,2")
    for p in (a, b):
        p.add_argument("--every", type=lambda t: [int(x) for x in t.split(",") if x], default=[],
                       help="m values of the field-every-m rows (e.g. 2,4)")
        p.add_argument("--no-without", action="store_true", help="leave out the row without label propagation")
        p.add_argument("--out", default=None)
    args = ap.parse_args()
    {"logs": logs, "deepscaler": deepscaler}[args.command](args)


if __name__ == "__main__":
    main()
