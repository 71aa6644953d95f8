#!/usr/bin/env python3
"""A reference model's pass rate (Qwen2.5-Math-7B's, 128 attempts: shared/data/deepscaler_difficulty) as a
source of graphdiff's estimate, replayed on the One-Shot-RLVR run's log. Rows: (a) the default preset with
embeddings; (b) the same plus a ReferenceRate source, its weight in the mix chosen online among 0, 1/4, 1/2,
3/4, 1; (c) the reference rate alone (the states' estimate at weight 0: no graph, no embedding), calibrated
online the same way and mixed with the prompt's own outcomes as graphdiff's estimate is; (d) the raw 7B rate,
uncalibrated (round 0 only). Figures: round-0 (first visits) within-batch Pearson r and full-log MAE, each
with the circular block bootstrap over steps of ``evaluation.metrics.ratio_bootstrap``, and the paired
differences b - a, b - c; on every prompt and on the prompts with a reference rate.

ReferenceRate is the embedding read-out's source (``sources.Readout``) with another feature matrix: for a
prompt with a reference rate r, x = [1, logit(clip(r, 1/258, 257/258))], a ridge fit of the forgotten
observed rate on x over the prompts with evidence and a rate (ridge strength chosen online among 1, 10, 100
on a board of its own); a prompt without a rate, and every prompt before any outcome, gets the observed global
rate. Added by subclassing ``Estimator`` with one more entry in ``SOURCES``; nothing of graphdiff_cli is
edited. Every prediction is made before its outcomes; nothing is tuned on the log.

Join: a One-Shot prompt has a reference rate when its problem text, stripped of leading and trailing
whitespace, is a DeepScaleR problem's (the count of exact, stripped and whitespace-collapsed matches is printed).

    .venv/bin/python bench/reference_rate.py artifacts/oneshot --out rr.json   # ~18 min on the 2-core VM
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import ROOT, emit, round0_steps, run_file, run_inputs, run_log  # noqa: E402

DATA = ROOT.parent / "shared" / "data"
CLIP = (1.0 / 258.0, 257.0 / 258.0)
REFERENCE_GRID = np.array([0.0, 0.25, 0.5, 0.75, 1.0])


def reference_rates(run: Path, data: Path):
    """{run id: 7B pass rate s / n} for the run's prompts whose stripped text is a DeepScaleR problem's, and the
    join counts (exact, stripped, whitespace-collapsed)."""
    squash = lambda t: re.sub(r"\s+", " ", t).strip()  # noqa: E731
    exact, stripped, squashed = {}, {}, {}
    with open(data / "deepscaler_difficulty" / "problems.jsonl", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            rate = row["s"] / row["n"]
            exact[row["problem"]] = stripped[row["problem"].strip()] = squashed[squash(row["problem"])] = rate
    out, counts = {}, {"prompts": 0, "exact": 0, "stripped": 0, "whitespace_collapsed": 0}
    with open(run_file(run, "data/prompts.jsonl"), encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            text = row["prompt"]
            counts["prompts"] += 1
            counts["exact"] += text in exact
            counts["whitespace_collapsed"] += squash(text) in squashed
            if text.strip() in stripped:
                counts["stripped"] += 1
                out[str(row["id"])] = stripped[text.strip()]
    return out, counts


def reference_source(rates: np.ndarray):
    """The ReferenceRate source class for these per-node rates (NaN: no rate): ``sources.Readout`` with the
    features [1, logit(clip(rate))] of the prompts that have one."""
    from graphdiff_cli.core import readout as ro
    from graphdiff_cli.estimator.sources import Readout, global_rate

    has = ~np.isnan(rates)
    r = np.clip(np.where(has, rates, 0.5), *CLIP)
    x_all = ro.features(np.log(r / (1.0 - r))[:, None])

    class ReferenceRate(Readout):
        name = "reference_rate"
        board = "reference_errors"  # its ridge strength's board (Readout's boards, ridge and score read it)
        arrays = ()  # a benchmark's source: nothing of it is saved
        grid = REFERENCE_GRID
        start = 0.5
        weight_setting = "auto"

        def __init__(self, settings, n_nodes, embeddings=None):
            self.weight = self.weight_setting
            self.ridge_setting = settings.readout_ridge
            self.readout_gram_, self.readout_moment_ = ro.empty_stats(1)
            self._theta = {}

        def fits(self, est, rows, ridges):
            fill = global_rate(est.global_counts_)
            out = []
            for ridge in ridges:
                ridge = float(ridge)
                if ridge not in self._theta:
                    self._theta[ridge] = ro.solve(self.readout_gram_, self.readout_moment_, ridge)
                out.append(np.where(has[rows], ro.predict(self._theta[ridge], x_all[rows], fill), fill))
            return out

        def theta(self, est):
            """The fit in use, (intercept, slope on the logit), or None before any outcome."""
            return ro.solve(self.readout_gram_, self.readout_moment_, self.ridge(est.mix.board))

        def observe(self, est, step):
            def rows_of(s, c, rows):  # only prompts with a reference rate enter the fit
                w, y = ro.rows_of(s[rows], c[rows])
                return w * has[rows], y

            rows, old, new = (step.obs.ids, step.old, step.new) if not step.switched else \
                (np.flatnonzero(step.new[1] > 0), None, step.new)
            if old is None:
                gram, moment = ro.stats_of(x_all[rows], *rows_of(*new, rows))
            else:
                gram, moment = ro.changed_stats(self.readout_gram_, self.readout_moment_, x_all[rows],
                                                rows_of(*old, rows), rows_of(*new, rows))
            return {"readout_gram_": gram, "readout_moment_": moment, "_theta": {}}

    return ReferenceRate


def scores(res, p, sel):
    """Round-0 within-batch r and MAE of predictions ``p`` on the rows ``sel``, with their bootstrap intervals
    over steps (``ratio_bootstrap``: each step's r over scored steps; each step's summed error over its rows)."""
    from graphdiff_cli.evaluation.metrics import ratio_bootstrap, within_batch_scores

    st, pp, r = res.step[sel], p[sel], res.rate[sel]  # steps non-decreasing: each step's rows contiguous
    pr, _, ok = within_batch_scores(st, pp, r)
    first = np.flatnonzero(np.r_[True, st[1:] != st[:-1]])
    err = np.add.reduceat(np.abs(pp - r), first)
    rows = np.diff(np.r_[first, st.size]).astype(np.float64)
    return ratio_bootstrap(np.where(ok, pr, 0.0), ok.astype(np.float64)), ratio_bootstrap(err, rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="the One-Shot workflow run folder (data/log.jsonl, data/prompts.jsonl, "
                                           "graph/*.zarr, clusters/*.zarr, embeddings.zarr)")
    ap.add_argument("--data", type=Path, default=DATA, help="the shared data folder (deepscaler_difficulty/)")
    ap.add_argument("--out", default=None, help="also write the figures here (JSON)")
    args = ap.parse_args()
    if not (args.data / "deepscaler_difficulty" / "problems.jsonl").is_file():
        sys.exit(f"{args.data}: no deepscaler_difficulty/problems.jsonl")

    from graphdiff_cli.estimator import Estimator
    from graphdiff_cli.estimator.sources import SOURCES, States
    from graphdiff_cli.evaluation.methods import GraphdiffMethod
    from graphdiff_cli.evaluation.metrics import mae_difference, pearson, within_r_difference
    from graphdiff_cli.evaluation.replay import replay
    from graphdiff_cli.io.readers import embedding_matrix

    t_start = time.perf_counter()
    inp = run_inputs(args.run)
    ids, w, labels, k = inp.ids, inp.w, inp.labels, inp.k
    emb = embedding_matrix(run_file(args.run, "embeddings.zarr"), inp.graph)
    log = run_log(args.run, inp)
    rates_by_id, join = reference_rates(args.run, args.data)
    rates = np.array([rates_by_id.get(str(i), np.nan) for i in ids])
    ref = reference_source(rates)
    alone = type("ReferenceAlone", (ref,), {"weight_setting": 1.0})
    r0_steps = round0_steps(log["step"], log["id"])
    print(f"{args.run}: N = {len(ids)}, {len(np.unique(log['step']))} steps, round 0 = {len(r0_steps)} steps; "
          f"reference rates joined: {join}", flush=True)

    methods = [
        GraphdiffMethod(Estimator(w, labels, k, embeddings=emb, device="cpu"), name="a default"),
        GraphdiffMethod(type("WithReference", (Estimator,), {"SOURCES": SOURCES + (ref,)})(
            w, labels, k, embeddings=emb, device="cpu"), name="b default + reference"),
        GraphdiffMethod(type("ReferenceOnly", (Estimator,), {"SOURCES": (States, alone)})(
            w, labels, k, device="cpu"), name="c reference alone"),
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
            r0_r, _ = scores(res, p, r0 & keep)
            _, full = scores(res, p, keep)
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
        src = est.mix.source("reference_rate")
        row = out.setdefault("settled", {})[m.name] = {"kappa": est.kappa_, "propagation": est.propagation_,
                                                        "readout": est.readout_}
        if src is not None:
            theta = src.theta(est)
            row.update(reference_weight=est.mix.weight(est.mix.sources.index(src)),
                       reference_ridge=src.ridge(est.mix.board),
                       reference_intercept_slope=None if theta is None else [float(v) for v in theta])
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
