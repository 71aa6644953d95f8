#!/usr/bin/env python3
"""The real log over the run: the default preset against discounted history at its best (lambda, m) over several
shuffles of the real log's later rounds (round 0 keeps the recorded first-draw order in every shuffle).

Each shuffle is `graphdiff_cli.evaluation.oneshot.write_oneshot(seed=S)` replayed one step ahead (as `graphdiff
evaluate`) through the default preset, label propagation and discounted history on a grid; prints per
shuffle and the paired mean with its standard error. Needs artifacts/oneshot (snakemake --configfile
configs/oneshot.yaml) and ../shared/data/oneshot_rlvr.

    .venv/bin/python bench/oneshot_shuffles.py --seeds 8 [--out result.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import emit, run_inputs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, default=ROOT / "artifacts" / "oneshot")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "oneshot_rlvr")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from graphdiff_cli.evaluation import baselines as B
    from graphdiff_cli.evaluation.metrics import mae, within_batch
    from graphdiff_cli.evaluation.replay import replay
    from graphdiff_cli.estimator import Estimator
    from graphdiff_cli.evaluation.oneshot import write_oneshot
    from graphdiff_cli.io.readers import read_log
    from graphdiff_cli.evaluation.methods import GraphdiffMethod

    inp = run_inputs(args.run)
    n_nodes = len(inp.ids)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            log_path = Path(tmp) / f"log{seed}.jsonl"
            write_oneshot(args.data, Path(tmp) / f"prompts{seed}.jsonl", log_path, seed=seed)
            log = read_log(log_path, inp.graph.index)
            methods = [B.LabelPropagation(inp.w)]
            methods += [B.DiscountedHistory(n_nodes, lam, m, name=f"discounted({lam}, {m})")
                        for lam in (0.7, 0.75, 0.8, 0.85, 0.9) for m in (0.0, 0.5)]
            methods.append(GraphdiffMethod(Estimator(inp.w, inp.labels, inp.k, preset="default", device="cpu"),
                                           name="default"))
            res = replay(log["step"], log["id"], log["n"], log["s"], methods, n_nodes=n_nodes)
            row = {m.name: {"mae": mae(res.predictions[m.name], res.rate),
                            "within_r": within_batch(res.step, res.predictions[m.name], res.rate)["pearson"]}
                   for m in methods}
            rows[seed] = row
            base = [k for k in row if k != "default"]
            print(f"shuffle {seed}: default MAE {row['default']['mae']:.6f} r {row['default']['within_r']:.4f}; "
                  f"best discounted MAE {min(row[k]['mae'] for k in base if k.startswith('disc')):.6f}; "
                  f"best baseline r {max(row[k]['within_r'] for k in base):.4f}", file=sys.stderr, flush=True)
    d = np.array([r["default"]["mae"] for r in rows.values()])
    h = np.array([min(v["mae"] for k, v in r.items() if k.startswith("disc")) for r in rows.values()])
    rd = np.array([r["default"]["within_r"] for r in rows.values()])
    rb = np.array([max(v["within_r"] for k, v in r.items() if k != "default") for r in rows.values()])
    rel, dr = (d - h) / h, rd - rb
    se = (lambda x: float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else float("nan"))
    emit({"shuffles": rows,
          "mae_relative_to_best_discounted": {"mean": float(rel.mean()), "se": se(rel)},
          "within_r_minus_best_baseline": {"mean": float(dr.mean()), "se": se(dr)}}, args.out)


if __name__ == "__main__":
    main()
