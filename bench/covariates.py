#!/usr/bin/env python3
"""What the user already knows of each prompt (covariates: text statistics of the prompt and its answer, a
reference model's pass rate) in graphdiff's estimate, against the peers that read only that: two benchmarks.

oneshot     The One-Shot-RLVR run's real log (a workflow run folder: data/log.jsonl, data/prompts.jsonl,
            graph/*.zarr, clusters/*.zarr, embeddings.zarr), replayed through (no look-ahead,
            ``evaluation.replay``): the default preset with embeddings (a), + text statistics of the prompt and
            its answer (b), + those and Qwen2.5-Math-7B's pass rate over 128 attempts joined on the problem text
            (c; 887 of 1,209 prompts, the rest without); the covariates-only peer (``covariates``: the ridge
            read-out of the same encoded covariates, graphdiff's covariates source alone) on the text
            statistics and on text + rate; the reference-only peer (``reference``: BOTS's interpolation prior);
            the embedding-only peer (``ridge``). Figures: round-0 (first visits) within-batch Pearson r and
            full-log MAE, each with the circular block bootstrap over steps (``metrics.ratio_bootstrap``), the
            paired differences of b and c against the default and each peer (``within_r_difference``,
            ``mae_difference``), the ECE of P(all-same group) (``metrics.zero_variance_ece``), and the online
            choices graphdiff settled on.
deepscaler  The cold start of ``evaluation.coldstart`` on DeepScaleR's 29,095 problems (a run folder made by embed,
            build-graph, cluster on deepscaler_difficulty/problems.jsonl): 2/10/30% revealed, seeds 0, 1, 2, 8
            rollouts ~ Binomial(8, s/128) per revealed problem in steps of 256; every hidden problem scored by
            Pearson r and MAE against s/128. graphdiff with and without the text statistics of the problem and
            its answer (the 7B rate is the target here, never a covariate), the covariates-only peer and the
            methods of --methods; each draw's paired difference graphdiff (with covariates) - every other row.

The covariates are ``core.covariates``'s, encoded by a spec made from every prompt's (unsupervised: no outcome is
read); every method's settings are its defaults, nothing is tuned on the log.

    .venv/bin/python bench/covariates.py oneshot artifacts/oneshot --out cov_oneshot.json   # 36 min, loaded 2-core VM
    .venv/bin/python bench/covariates.py deepscaler artifacts/deepscaler --out cov_ds.json     # 11 min
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import (SHARED_DATA, emit, oneshot_prompts, reference_rates, round0_steps, run_file,  # noqa: E402
                          run_inputs, run_log, step_scores)

RATE = "qwen2.5_math_7b_pass_rate"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def text_columns(problems, answers) -> dict:
    """{statistic: ``Raw`` text column} of the problems and their answers (``core.covariates.text_statistics``)."""
    from graphdiff_cli.core.covariates import Raw, text_statistics

    return {name: Raw("text", values) for name, values in text_statistics(problems, answers).items()}


def encoded(raw: dict, n: int):
    """The covariates of ``raw`` encoded by the spec made from them (``make_spec``, then ``encode``)."""
    from graphdiff_cli.core.covariates import encode, make_spec

    return encode(make_spec(raw), raw, n)


def fmt(b: dict, digits: int = 4) -> str:
    return f"{b['estimate']:.{digits}f} [{b['lo']:.{digits}f}, {b['hi']:.{digits}f}]"


# ----------------------------------------------------------------------------------------------------
# the One-Shot log


def oneshot(args) -> None:
    from graphdiff_cli.core.covariates import Raw
    from graphdiff_cli.estimator import Estimator
    from graphdiff_cli.evaluation.baselines import BOTS_SETTINGS, CovariateReadout, ReferencePrior, RidgeReadout
    from graphdiff_cli.evaluation.methods import GraphdiffMethod
    from graphdiff_cli.evaluation.metrics import mae_difference, within_r_difference, zero_variance_ece
    from graphdiff_cli.evaluation.replay import replay
    from graphdiff_cli.io.readers import embedding_matrix

    t_start = time.perf_counter()
    inp = run_inputs(args.run)
    ids, w, labels, k = inp.ids, inp.w, inp.labels, inp.k
    n_nodes = len(ids)
    emb = embedding_matrix(run_file(args.run, "embeddings.zarr"), inp.graph)
    lg = run_log(args.run, inp)
    texts = oneshot_prompts(args.run, args.data)
    sn, join = reference_rates(args.run, args.data)
    problems = [texts[i][0] for i in ids]
    answers = [texts[i][1] for i in ids]
    text = text_columns(problems, answers)
    rate = Raw("reference", [None if i not in sn else sn[i][0] / sn[i][1] for i in ids],
               attempts=[None if i not in sn else sn[i][1] for i in ids], attempts_field="n")
    cov_text = encoded(text, n_nodes)
    cov_both = encoded({**text, RATE: rate}, n_nodes)
    r0_steps = round0_steps(lg["step"], lg["id"])
    log(f"{args.run}: N = {n_nodes}, {len(np.unique(lg['step']))} steps, round 0 = {len(r0_steps)} steps; "
        f"7B rates joined: {join}; covariates: {cov_text.features.shape[1]} text features, "
        f"{cov_both.features.shape[1]} with the rate")

    def graphdiff(name, cov=None):
        est = Estimator(w, labels, k, embeddings=emb, device="cpu",
                        covariates=None if cov is None else cov.features,
                        reference_rate=None if cov is None else cov.reference)
        return GraphdiffMethod(est, name=name)

    A, B, C = "a default", "b default + text", "c default + text + 7B rate"
    COV_T, COV_B, REF, RIDGE = "covariates (text)", "covariates (text + 7B rate)", "reference (BOTS)", "ridge"
    methods = [graphdiff(A), graphdiff(B, cov_text), graphdiff(C, cov_both),
               CovariateReadout(cov_text.features, None, name=COV_T),
               CovariateReadout(cov_both.features, cov_both.reference, name=COV_B),
               ReferencePrior(cov_both.reference, **BOTS_SETTINGS, name=REF),
               RidgeReadout(emb, name=RIDGE)]
    t0 = time.perf_counter()

    def progress(done, total):
        if done % 10 == 0 or done == total:
            log(f"replayed {done}/{total} steps, {time.perf_counter() - t0:.0f} s")

    res = replay(lg["step"], lg["id"], lg["n"], lg["s"], methods, n_nodes=n_nodes, progress=progress)
    seconds = time.perf_counter() - t0

    r0 = np.isin(res.step, r0_steps)
    joined = np.array([ids[i] in sn for i in res.ids])
    every = np.ones(res.step.size, dtype=bool)
    out = {"run": str(args.run), "join": join, "round0_steps": int(len(r0_steps)), "rows_in_log": int(res.step.size),
           "covariates": {"text": cov_text.features.shape[1], "text_and_rate": cov_both.features.shape[1],
                          "notes": list(cov_both.notes)},
           "bots_settings": BOTS_SETTINGS, "replay_seconds": seconds, "rows": {}, "differences": {}}
    for name in res.methods:
        p = res.predictions[name]
        r0_r, _ = step_scores(res.step, p, res.rate, r0)
        _, full = step_scores(res.step, p, res.rate, every)
        r0_joined, _ = step_scores(res.step, p, res.rate, r0 & joined)
        out["rows"][name] = {"round0_r": r0_r, "mae": full, "round0_r_joined": r0_joined,
                             "zero_variance_ece": zero_variance_ece(res.zero_variance[name], res.n, res.s),
                             "zero_variance_source": res.zero_variance_source[name]}
    pairs = [(B, A), (B, COV_T), (B, RIDGE), (C, A), (C, B), (C, COV_B), (C, REF), (C, RIDGE)]
    for x, y in pairs:
        px, py = res.predictions[x], res.predictions[y]
        out["differences"][f"{x} - {y}"] = {
            "round0_r": within_r_difference(res.step[r0], px[r0], py[r0], res.rate[r0]),
            "mae": mae_difference(res.step, px, py, res.rate)}
    for m in methods[:3]:
        est = m.estimator
        out.setdefault("settled", {})[m.name] = {"kappa": est.kappa_, "propagation": est.propagation_,
                                                 "readout": est.readout_, "covariate_readout": est.covariate_readout_}
    rows = out["rows"]
    out["targets"] = {
        "with the rate: round-0 r >= 0.70": rows[C]["round0_r"]["estimate"] >= 0.70,
        "with the rate: full MAE below the default's": rows[C]["mae"]["estimate"] < rows[A]["mae"]["estimate"],
        "without the rate: round-0 r >= covariates-only + 0.02":
            rows[B]["round0_r"]["estimate"] >= rows[COV_T]["round0_r"]["estimate"] + 0.02,
        "without the rate: round-0 r >= ridge + 0.02":
            rows[B]["round0_r"]["estimate"] >= rows[RIDGE]["round0_r"]["estimate"] + 0.02,
    }
    out["seconds_total"] = time.perf_counter() - t_start

    print(f"\n{'estimator':30s} {'round-0 within r [95%]':>28s} {'full MAE [95%]':>28s} "
          f"{'round-0 r, 887 joined':>28s} {'P(all-same) ECE':>16s}")
    for name, row in rows.items():
        print(f"{name:30s} {fmt(row['round0_r']):>28s} {fmt(row['mae']):>28s} {fmt(row['round0_r_joined']):>28s} "
              f"{row['zero_variance_ece']:>16.4f}")
    print("\npaired differences (x - y)")
    for label, d in out["differences"].items():
        print(f"{label:58s} {fmt(d['round0_r']):>28s} {fmt(d['mae']):>28s}")
    for label, ok in out["targets"].items():
        print(f"target {label}: {'met' if ok else 'missed'}")
    emit(out, args.out)


# ----------------------------------------------------------------------------------------------------
# DeepScaleR's cold start


def deepscaler(args) -> None:
    from graphdiff_cli.evaluation.coldstart import reveal, score_cold_start, t_interval
    from graphdiff_cli.evaluation.methods import DISCOUNTED, build_methods, load_config, parse_methods
    from graphdiff_cli.io.readers import read_inputs

    t_start = time.perf_counter()
    inp = read_inputs(run_file(args.run, "graph/*.zarr"), run_file(args.run, "clusters/*.zarr"),
                      args.run / "embeddings.zarr")
    rows = {}
    with open(args.problems, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            rows[str(row["id"])] = row
    missing = [i for i in inp.ids if i not in rows]
    if missing:
        raise SystemExit(f"{args.problems}: no row for {len(missing)} graph prompts, e.g. {missing[0]!r}")
    n_nodes = len(inp.ids)
    rate = np.array([int(rows[i]["s"]) / int(rows[i]["n"]) for i in inp.ids])
    cov = encoded(text_columns([rows[i]["problem"] for i in inp.ids], [rows[i].get("answer") for i in inp.ids]),
                  n_nodes)
    keys = parse_methods(args.methods.split(","))
    cfg = load_config(None)
    log(f"{n_nodes:,} prompts, K = {inp.k}, {cov.features.shape[1]} covariates (text statistics); methods {keys}")
    base = (cfg, inp.w, inp.labels, inp.k, inp.embeddings, n_nodes)
    fractions = [float(x) for x in args.fractions.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    draws = []
    for frac in fractions:
        for seed in seeds:
            plan = reveal(rate, frac, seed=seed, rollouts=args.rollouts, batch=args.batch)
            methods, _ = build_methods(keys, *base, tuned=DISCOUNTED, covariates=cov.features)
            if "graphdiff" in keys and args.plain:
                plain, _ = build_methods(["graphdiff"], *base, tuned=DISCOUNTED)
                plain[0].name = "graphdiff without covariates"
                methods.append(plain[0])
            t0 = time.perf_counter()
            res = score_cold_start(methods, plan, rate)
            row = {"fraction": frac, "seed": seed, "revealed": int(plan.revealed.size),
                   "methods": {m.name: {"pearson": res[m.name]["pearson"], "mae": res[m.name]["mae"]} for m in methods}}
            gd = getattr(next((m for m in methods if m.name == "graphdiff"), None), "estimator", None)
            if gd is not None:
                row["graphdiff_choices"] = {"kappa": gd.kappa_, "propagation": gd.propagation_, "readout": gd.readout_,
                                            "covariate_readout": gd.covariate_readout_}
            draws.append(row)
            log(f"fraction {frac:g} seed {seed}: {time.perf_counter() - t0:.0f} s; " +
                ", ".join(f"{n} r {v['pearson']:.3f}" for n, v in row["methods"].items()))
    names = list(draws[0]["methods"])
    summary = {}
    for frac in fractions:
        here = [d for d in draws if d["fraction"] == frac]
        summary[f"{frac:g}"] = {n: {"pearson": t_interval([d["methods"][n]["pearson"] for d in here]),
                                    "mae": t_interval([d["methods"][n]["mae"] for d in here])} for n in names}
        if "graphdiff" in names:
            summary[f"{frac:g}"]["graphdiff minus"] = {
                n: [d["methods"]["graphdiff"]["pearson"] - d["methods"][n]["pearson"] for d in here]
                for n in names if n != "graphdiff"}
    out = {"command": "deepscaler", "run": str(args.run), "problems": str(args.problems), "prompts": n_nodes,
           "states": inp.k, "covariates": cov.features.shape[1], "fractions": fractions, "seeds": seeds,
           "rollouts": args.rollouts, "batch": args.batch, "summary": summary, "draws": draws,
           "seconds": time.perf_counter() - t_start,
           "interval": "mean over draws with a 95% Student-t interval (t_{0.975, draws-1} sd / sqrt(draws))"}
    print(f"\n{'method':32s} " + " ".join(f"{f'r, {f:.0%} revealed':>24s}" for f in fractions))
    for n in names:
        cells = []
        for f in fractions:
            t = summary[f"{f:g}"][n]["pearson"]
            cells.append(f"{t['mean']:.3f} [{t['lo']:.3f}, {t['hi']:.3f}]")
        print(f"{n:32s} " + " ".join(f"{c:>24s}" for c in cells))
    if "graphdiff" in names:
        print("\ngraphdiff - each other row, per draw (seeds " + ", ".join(map(str, seeds)) + ")")
        for n in names:
            if n != "graphdiff":
                print(f"{n:32s} " + " ".join(
                    f"{' '.join(f'{v:+.3f}' for v in summary[f'{f:g}']['graphdiff minus'][n]):>24s}"
                    for f in fractions))
    emit(out, args.out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    a = sub.add_parser("oneshot", help="the One-Shot run's real log: rows a-c, the covariate and embedding peers")
    a.add_argument("run", type=Path, help="the One-Shot workflow run folder (data/log.jsonl, data/prompts.jsonl, "
                                          "graph/*.zarr, clusters/*.zarr, embeddings.zarr)")
    a.add_argument("--data", type=Path, default=SHARED_DATA, help="the shared data folder (oneshot_rlvr/, "
                                                                   "deepscaler_difficulty/)")
    a.add_argument("--out", default=None, help="also write the figures here (JSON)")
    b = sub.add_parser("deepscaler", help="DeepScaleR's cold start with text statistics as covariates")
    b.add_argument("run", type=Path, help="run folder with embeddings.zarr, graph/*.zarr, clusters/*.zarr")
    b.add_argument("--problems", type=Path, default=SHARED_DATA / "deepscaler_difficulty" / "problems.jsonl",
                   help="DeepScaleR's problems (id, problem, answer, s, n)")
    b.add_argument("--methods", default="graphdiff,ridge,labelprop,covariates", help="method keys (comma-separated)")
    b.add_argument("--fractions", default="0.02,0.1,0.3")
    b.add_argument("--seeds", default="0,1,2")
    b.add_argument("--rollouts", type=int, default=8)
    b.add_argument("--batch", type=int, default=256)
    b.add_argument("--plain", action=argparse.BooleanOptionalAction, default=True,
                   help="also graphdiff without covariates (--no-plain: not)")
    b.add_argument("--out", default=None, help="also write the figures here (JSON)")
    args = ap.parse_args()
    oneshot(args) if args.command == "oneshot" else deepscaler(args)


if __name__ == "__main__":
    main()
