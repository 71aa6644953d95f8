#!/usr/bin/env python3
"""Which graphdiff settings steer prompt selection best in the offline counterfactual replay?

The selection replay of `graphdiff evaluate --counterfactual` (evaluation.counterfactual.selection_replay:
each step a pool of pool-factor x B prompts of the current round, B chosen, only their outcomes
revealed), run for graphdiff variants, the two MoPPS references and label propagation under the given strategies, over
several pool shuffles (--seeds): what a method sees depends on what it chose, so one shuffle's rates
move by about +-0.005; the table gives mean +- standard error over the seeds. Input: a workflow run
folder, e.g.

    snakemake --cores 2 --configfile configs/oneshot.yaml
    python bench/selection_variants.py artifacts/oneshot [--strategies target,thompson] [--seeds 0,1,2,3]

The target rule runs at select's default exploration (explore 1: "target") and without it
("target (explore 0)") for graphdiff and MoPPS (evaluation.counterfactual). Variants: the default preset; the default with belief_strength unset (the belief of the mixing, as
before the belief existed); prompt forgetting 0.5; and the default with every never-chosen prompt
predicted 0.5 (MoPPS's Beta(1, 1) mean), which isolates exploration. --calibration adds, on the
full log (every outcome revealed, as `graphdiff evaluate` replays it), how well each variant's
p_zero_variance predicts a group with s in {0, n}: Brier score, log-loss, AUROC.
The figures of docs/lab/results.md ("Decisions on the real log") come from this script.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

VARIANTS = {
    "default": {},
    "belief unset": {"belief_strength": None},
    "lambda 0.5": {"prompt_forgetting": 0.5},
    "unseen -> 0.5": {"unseen_half": True},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--strategies", default="target,thompson,skip-zero-variance")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--pool-factor", type=float, default=2.0)
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names of VARIANTS")
    ap.add_argument("--calibration", action="store_true")
    args = ap.parse_args()

    from graphdiff_cli.evaluation import baselines as B
    from graphdiff_cli.evaluation.counterfactual import selection_replay
    from graphdiff_cli.evaluation.metrics import auroc, zero_variance_outcome
    from graphdiff_cli.estimator import Estimator
    from graphdiff_cli.io.readers import read_inputs, read_log
    from graphdiff_cli.evaluation.methods import GraphdiffMethod

    class UnseenHalf(GraphdiffMethod):
        def estimates(self, ids, group_size):  # the replay always passes the group size
            out = dict(super().estimates(ids, group_size))
            seen = self.estimator.rollouts_[np.asarray(ids)] > 0
            for key in ("p", "mean"):  # an unseen prompt's p (and the belief's mean) is 0.5
                out[key] = np.where(seen, out[key], 0.5)
            return out

    inp = read_inputs(sorted(args.run.glob("graph/*.zarr"))[0], sorted(args.run.glob("clusters/*.zarr"))[0])
    w, labels, k = inp.w, inp.labels, inp.k
    lg = read_log(args.run / "data" / "log.jsonl", inp.graph.index)
    n_nodes = len(inp.ids)

    def factory(overrides):
        kw = dict(overrides)
        cls = UnseenHalf if kw.pop("unseen_half", False) else GraphdiffMethod
        settings = {"device": "cpu", **kw}
        return lambda: cls(Estimator(w, labels, k, **settings))

    factories = {f"graphdiff {v}": factory(VARIANTS[v]) for v in args.variants.split(",")}
    factories["mopps(lam=0.5)"] = lambda: B.MoPPS(n_nodes, lam=0.5)
    factories["mopps(lam=1)"] = lambda: B.MoPPS(n_nodes, lam=1.0)
    factories["labelprop"] = lambda: B.LabelPropagation(w)
    rates: dict[tuple[str, str], list[float]] = {}
    for seed in (int(x) for x in args.seeds.split(",")):
        res = selection_replay(lg["step"], lg["id"], lg["n"], lg["s"], factories,
                               strategies=tuple(args.strategies.split(",")), batch_size=args.batch_size,
                               pool_factor=args.pool_factor, seed=seed, n_nodes=n_nodes)
        for r in res["results"]:
            rates.setdefault((r["strategy"], r["estimator"]), []).append(r["effective_rate"])
    print(f"{'strategy':19s} {'estimator':26s} {'eff. rate':>9s} {'s.e.':>6s}  per seed")
    for (strategy, name), v in sorted(rates.items(), key=lambda kv: -np.mean(kv[1])):
        se = np.std(v) / np.sqrt(len(v))
        print(f"{strategy:19s} {name:26s} {np.mean(v):9.4f} {se:6.4f}  {' '.join(f'{x:.3f}' for x in v)}")

    if args.calibration:
        step = lg["step"]
        starts = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])
        ends = np.r_[starts[1:], step.size]
        y = zero_variance_outcome(lg["n"], lg["s"])
        print(f"\n{'p_zero_variance of':26s} {'Brier':>7s} {'log-loss':>8s} {'AUROC':>7s}")
        for name, make in factories.items():
            method, pz = make(), np.zeros(step.size)
            for a, b in zip(starts, ends):
                g = int(np.median(lg["n"][a:b]))
                pz[a:b] = method.estimates(lg["id"][a:b].copy(), g)["p_zero_variance"]
                method.update(lg["id"][a:b].copy(), lg["n"][a:b].copy(), lg["s"][a:b].copy())
            pc = np.clip(pz, 1e-6, 1 - 1e-6)
            logloss = -np.mean(np.where(y, np.log(pc), np.log(1 - pc)))
            print(f"{name:26s} {np.mean((pz - y) ** 2):7.4f} {logloss:8.4f} {auroc(pz, y):7.4f}")


if __name__ == "__main__":
    main()
