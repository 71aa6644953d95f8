#!/usr/bin/env python3
"""Benchmark: offline counterfactual replay of selection and allocation on the One-Shot-RLVR log.

Needs ../shared/data/oneshot_rlvr and the graph/clusters/embeddings artifacts of its prompts:

    python -c "from graphdiff_cli.evaluation.oneshot import write_oneshot; \
               write_oneshot('../shared/data/oneshot_rlvr', 'W/prompts.jsonl', 'W/log.jsonl')"
    graphdiff embed W/prompts.jsonl --out W/emb.zarr
    graphdiff build-graph W/emb.zarr --out W/graph.zarr
    graphdiff cluster W/graph.zarr --out W/clusters.zarr
    python bench/counterfactual_oneshot.py W [--batch-size 128 --pool-factor 2 --seeds 0 1 2]

Prints one table per replay and writes W/counterfactual.json. The replay cannot show how the policy
would have responded to other choices (see graphdiff_cli.evaluation.counterfactual).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("work", type=Path)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--pool-factor", type=float, default=2.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--no-allocation", action="store_true")
    args = ap.parse_args()
    from graphdiff_cli.stages.counterfactual import counterfactual

    w = args.work
    runs = []
    for i, seed in enumerate(args.seeds):
        runs.append(counterfactual(w / "log.jsonl", w / "graph.zarr", w / "clusters.zarr", embeddings=w / "emb.zarr",
                                   batch_size=args.batch_size, pool_factor=args.pool_factor, seed=seed, device="cpu",
                                   allocation=() if (args.no_allocation or i) else ("uniform", "variance", "vip")))
    sel: dict = {}
    for r in runs:
        for row in r["selection"]["results"]:
            sel.setdefault((row["strategy"], row["estimator"]), []).append(row)
    print(f"selection: B = {args.batch_size}, pool = {runs[0]['selection']['pool_size']}, "
          f"{runs[0]['selection']['pools']} pools over {runs[0]['selection']['rounds']} rounds, seeds {args.seeds}")
    print(f"{'strategy':20s} {'estimator':16s} {'eff. rate':>9s} {'sd':>6s} {'round 0':>8s} {'later':>7s} {'vs unif':>8s}")
    for (st, est), rows in sorted(sel.items(), key=lambda kv: -np.mean([r["effective_rate"] for r in kv[1]])):
        rates = [r["effective_rate"] for r in rows]
        print(f"{st:20s} {est:16s} {np.mean(rates):9.4f} {np.std(rates):6.4f} "
              f"{np.mean([r['effective_rate_round0'] for r in rows]):8.4f} "
              f"{np.mean([r['effective_rate_later'] for r in rows]):7.4f} {np.mean([r['vs_uniform'] for r in rows]):8.4f}")
    if "allocation" in runs[0]:
        a = runs[0]["allocation"]
        print(f"\nallocation: {a['steps']} steps, {a['budget_per_prompt']} rollouts per prompt on average, "
              f"n in [{a['min']}, {a['max']}]; truth = recorded rates")
        for row in sorted(a["results"], key=lambda r: -r["expected_nondegenerate_per_step"]):
            print(f"{row['strategy']:10s} {row['estimator']:22s} {row['expected_nondegenerate_per_step']:8.2f} "
                  f"{row['vs_uniform']:7.4f}")
    print("\n" + runs[0]["note"])
    (w / "counterfactual.json").write_text(json.dumps(runs, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
