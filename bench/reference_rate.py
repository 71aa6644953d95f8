"""A reference model's pass rate (Qwen2.5-Math-7B's, 128 attempts: shared/data/deepscaler_difficulty) as a
source of graphdiff's estimate, replayed on the One-Shot-RLVR run's log, through the product's covariates source
(``estimator.sources.Covariates``, setting ``covariate_readout``) on the rate alone. Rows: (a) the default preset
with embeddings; (b) the same given the rate as its only covariate (``core.covariates``: a reference column,
smoothed by its 128 attempts as (s + 1) / (n + 2), centred and scaled, with a missing indicator), the
covariates' weight in the mix chosen online as the default preset chooses it; (c) the rate alone: the
covariates' read-out at weight 1, without the embedding's read-out or label propagation (no graph sharing, no
embedding), mixed with the prompt's own outcomes as graphdiff's estimate is; (d) the raw 7B rate, uncalibrated
(round 0 only). Figures: round-0 (first visits) within-batch Pearson r and full-log MAE, each with the circular
block bootstrap over steps of ``evaluation.metrics.ratio_bootstrap``, and the paired differences b - a, b - c;
on every prompt and on the prompts with a reference rate. bench/covariates.py measures the rate with the text
statistics and against the peers.

Join: a One-Shot prompt has a reference rate when its problem text, stripped of leading and trailing
whitespace, is a DeepScaleR problem's (the count of exact, stripped and whitespace-collapsed matches is printed).

    .venv/bin/python bench/reference_rate.py artifacts/oneshot --out rr.json   # 3 min on the 2-core VM (18 loaded)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import (SHARED_DATA, emit, reference_rates, round0_steps, run_file, run_inputs,  # noqa: E402
                          run_log, step_scores)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="the One-Shot workflow run folder (data/log.jsonl, data/prompts.jsonl, "
                                           "graph/*.zarr, clusters/*.zarr, embeddings.zarr)")
    ap.add_argument("--data", type=Path, default=SHARED_DATA, help="the shared data folder (deepscaler_difficulty/)")
    ap.add_argument("--out", default=None, help="also write the figures here (JSON)")
    args = ap.parse_args()
    if not (args.data / "deepscaler_difficulty" / "problems.jsonl").is_file():
        sys.exit(f"{args.data}: no deepscaler_difficulty/problems.jsonl")

    from graphdiff_cli.core.covariates import Raw, encode, make_spec
    from graphdiff_cli.estimator import Estimator
    from graphdiff_cli.evaluation.methods import GraphdiffMethod
    from graphdiff_cli.evaluation.metrics import mae_difference, pearson, within_r_difference
    from graphdiff_cli.evaluation.replay import replay
    from graphdiff_cli.io.readers import embedding_matrix

    t_start = time.perf_counter()
    inp = run_inputs(args.run)
    ids, w, labels, k = inp.ids, inp.w, inp.labels, inp.k
    emb = embedding_matrix(run_file(args.run, "embeddings.zarr"), inp.graph)
    log = run_log(args.run, inp)
    sn, join = reference_rates(args.run, args.data)
    rates = np.array([sn[i][0] / sn[i][1] if i in sn else np.nan for i in ids])
    raw = {"qwen2.5_math_7b_pass_rate": Raw("reference", [sn[i][0] / sn[i][1] if i in sn else None for i in ids],
                                            attempts=[sn[i][1] if i in sn else None for i in ids],
                                            attempts_field="n")}
    cov = encode(make_spec(raw), raw, len(ids))
    r0_steps = round0_steps(log["step"], log["id"])
    print(f"{args.run}: N = {len(ids)}, {len(np.unique(log['step']))} steps, round 0 = {len(r0_steps)} steps; "
          f"reference rates joined: {join}", flush=True)

    given = {"covariates": cov.features, "reference_rate": cov.reference}
    methods = [
        GraphdiffMethod(Estimator(w, labels, k, embeddings=emb, device="cpu"), name="a default"),
        GraphdiffMethod(Estimator(w, labels, k, embeddings=emb, device="cpu", **given), name="b default + reference"),
        GraphdiffMethod(Estimator(w, labels, k, device="cpu", readout=None, label_propagation=None,
                                  covariate_readout=1.0, **given), name="c reference alone"),
    ]
    t0 = time.perf_counter()
    res = replay(log["step"], log["id"], log["n"], log["s"], methods, n_nodes=len(ids))
    seconds = time.perf_counter() - t0

    # (d) the raw rate; a prompt without one gets the global rate observed before its step (online)
    raw = rates[res.ids]
    steps = np.unique(res.step)
    cum_s = np.r_[0.0, np.cumsum([res.s[res.step == t].sum() for t in steps])][:-1]
    cum_n = np.r_[0.0, np.cumsum([res.n[res.step == t].sum() for t in steps])][:-1]
    g = ((cum_s + 1.0) / (cum_n + 2.0))[np.searchsorted(steps, res.step)]
    preds = {m.name: res.predictions[m.name] for m in methods}
    preds["d raw 7B rate"] = np.where(np.isnan(raw), g, raw)

    r0 = np.isin(res.step, r0_steps)
    joined = ~np.isnan(raw)
    out = {"run": str(args.run), "join": join, "round0_steps": len(r0_steps), "replay_seconds": seconds,
           "rows": {}, "differences": {}}
    for subset, keep in (("all", np.ones_like(joined)), ("joined", joined)):
        table = out["rows"][subset] = {}
        for name, p in preds.items():
            r0_r, _ = step_scores(res.step, p, res.rate, r0 & keep)
            _, full = step_scores(res.step, p, res.rate, keep)
            table[name] = {"round0_r": r0_r, "mae": full if not name.startswith("d") else None}
        pa, pb, pc = (preds[m.name] for m in methods)
        diff = out["differences"][subset] = {}
        for label, q in (("b - a", pa), ("b - c", pc)):
            s0, sk = r0 & keep, keep
            diff[label] = {"round0_r": within_r_difference(res.step[s0], pb[s0], q[s0], res.rate[s0]),
                           "mae": mae_difference(res.step[sk], pb[sk], q[sk], res.rate[sk])}
    first = r0 & joined
    out["d_pooled_r_round0_joined"] = {"pearson": pearson(raw[first], res.rate[first]), "rows": int(first.sum())}
    for m in methods:
        est = m.estimator
        src = est.mix.source("covariate_readout")
        out.setdefault("settled", {})[m.name] = {
            "kappa": est.kappa_, "propagation": est.propagation_, "readout": est.readout_,
            "reference_weight": est.covariate_readout_,
            "reference_ridge": None if src is None or est.covariate_readout_ is None else src.ridge(est.mix.board)}
    out["seconds_total"] = time.perf_counter() - t_start

    fmt = lambda b: f"{b['estimate']:.4f} [{b['lo']:.4f}, {b['hi']:.4f}]"  # noqa: E731
    for subset, table in out["rows"].items():
        print(f"\n{subset} prompts: {'estimator':26s} {'round-0 within r [95%]':>28s} {'MAE [95%]':>28s}")
        for name, row in table.items():
            print(f"{'':14s}{name:26s} {fmt(row['round0_r']):>28s} "
                  f"{fmt(row['mae']) if row['mae'] else '':>28s}")
        for label, d in out["differences"][subset].items():
            print(f"{'':14s}{label:26s} {fmt(d['round0_r']):>28s} {fmt(d['mae']):>28s}")
    emit(out, args.out)


if __name__ == "__main__":
    main()
