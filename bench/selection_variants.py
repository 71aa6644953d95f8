#!/usr/bin/env python3
"""Which graphdiff settings steer prompt selection best in the offline counterfactual replay?

The selection replay of `graphdiff evaluate --counterfactual` (core.counterfactual.selection_replay:
each step a pool of pool-factor x B prompts of the current round, B chosen, only their outcomes
revealed), run for graphdiff variants under one strategy. Input: a workflow run folder, e.g.

    snakemake --cores 2 --configfile configs/oneshot.yaml
    python bench/selection_variants.py artifacts/oneshot [--strategy target] [--batch-size 128]

Variants: the default preset; kappa fixed at 0.05; prompt forgetting 0.7 and 0.5; and the default with
every never-chosen prompt predicted 0.5 (MoPPS's Beta(1, 1) mean), which isolates exploration.
The figures of docs/results.md ("Decisions on the real log") come from this script.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

VARIANTS = {
    "default": {},
    "kappa 0.05": {"prior_strength": 0.05},
    "lambda 0.7": {"prompt_forgetting": 0.7},
    "lambda 0.5": {"prompt_forgetting": 0.5},
    "unseen -> 0.5": {"unseen_half": True},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--strategy", default="target")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--pool-factor", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from graphdiff_cli.core import baselines as B
    from graphdiff_cli.core.counterfactual import selection_replay
    from graphdiff_cli.estimator import Estimator, preset_settings
    from graphdiff_cli.stages.evaluate import read_clusters_artifact, read_graph_artifact, read_log

    class UnseenHalf(B.GraphdiffAdapter):
        def predict(self, ids):
            p = super().predict(ids)
            return np.where(self.estimator.rollouts_[np.asarray(ids)] > 0, p, 0.5)

    _, ids, w = read_graph_artifact(sorted(args.run.glob("graph/*.zarr"))[0])
    _, labels, k = read_clusters_artifact(sorted(args.run.glob("clusters/*.zarr"))[0], ids)
    lg = read_log(args.run / "data" / "log.jsonl", ids)

    def factory(overrides):
        kw = dict(overrides)
        cls = UnseenHalf if kw.pop("unseen_half", False) else B.GraphdiffAdapter
        settings = preset_settings("default") | {"device": "cpu"} | kw
        return lambda: cls(Estimator(w, labels, k, **settings))

    res = selection_replay(lg["step"], lg["id"], lg["n"], lg["s"], {n: factory(o) for n, o in VARIANTS.items()},
                           strategies=(args.strategy,), batch_size=args.batch_size, pool_factor=args.pool_factor,
                           seed=args.seed, n_nodes=len(ids))
    print(f"{'strategy':12s} {'graphdiff variant':18s} {'eff. rate':>9s} {'round 0':>8s} {'later':>7s}")
    for r in sorted(res["results"], key=lambda r: -r["effective_rate"]):
        print(f"{r['strategy']:12s} {r['estimator']:18s} {r['effective_rate']:9.4f} {r['effective_rate_round0']:8.4f} "
              f"{r['effective_rate_later']:7.4f}")


if __name__ == "__main__":
    main()
