#!/usr/bin/env python3
"""Print the summary tables of docs/lab/results.md from evaluate's metrics.json files.

    python bench/results_tables.py artifacts/oneshot/report artifacts/math/report artifacts/demo/report

One markdown table per report: every method's full-run figures, all rows and split into prompts seen
at an earlier step vs first visits (the cold start), best real estimator in bold; then, when the
report has one, the decisions (evaluate --counterfactual) table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

COLUMNS = [  # (header, split, key, higher is better, digits)
    ("MAE ↓", "all", "mae", False, 4),
    ("MAE seen ↓", "seen", "mae", False, 4),
    ("MAE first visit ↓", "unseen", "mae", False, 4),
    ("batch r ↑", "all", "batch_r", True, 3),
    ("within r ↑", "all", "within_r", True, 3),
    ("within r, first visits ↑", "unseen", "within_r", True, 3),
    ("Brier ↓", "all", "brier", False, 4),
    ("ECE ↓", "all", "ece", False, 3),
    ("AUROC ↑", "all", "auroc", True, 3),
    ("ms/step", "all", "seconds_per_step", False, 1),
]


def fmt(v, digits):
    return "–" if v is None else f"{v:.{digits}f}"


def table(doc: dict) -> str:
    methods = doc["metrics"]["methods"]
    run = doc["run"]
    lines = [f"{run['log']}: {run['rows']:,} rows, {run['steps']} steps, N = {run['n_prompts']:,}, "
             f"K = {run['n_states']}; discounted = best of its (λ, m) grid "
             f"(λ = {doc['discounted_best']['lam']:g}, m = {doc['discounted_best']['m']:g}) in hindsight.", "",
             "| Method | " + " | ".join(c[0] for c in COLUMNS) + " |",
             "|:---|" + "---:|" * len(COLUMNS)]
    best = {}
    for h, split, key, higher, _ in COLUMNS:
        vals = [m["phases"]["full"][split][key] for m in methods.values() if not m["oracle"]]
        vals = [v for v in vals if v is not None]
        if vals and key != "seconds_per_step":
            best[h] = max(vals) if higher else min(vals)
    for name, m in methods.items():
        cells = []
        for h, split, key, _, digits in COLUMNS:
            v = m["phases"]["full"][split][key]
            if key == "seconds_per_step" and v is not None:
                v *= 1000
            text = fmt(v, digits)
            if not m["oracle"] and h in best and v is not None and fmt(v, digits) == fmt(best[h], digits):
                text = f"**{text}**"
            cells.append(text)
        lines.append(f"| {name}{' †' if m['oracle'] else ''} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def decisions(doc: dict) -> str:
    cf = doc.get("counterfactual")
    if not cf:
        return ""
    sel = cf["selection"]
    rows = sorted(sel["results"], key=lambda r: -(r["effective_rate"] or 0))
    out = [f"Selection: B = {sel['batch_size']} of a pool of {sel['pool_size']}, {sel['pools']} pools, seed "
           f"{sel['seed']}.", "", "| Strategy | Estimator | effective-group rate | round 0 | later | vs uniform |",
           "|:---|:---|---:|---:|---:|---:|"]
    out += [f"| {r['strategy']} | {r['estimator']} | {fmt(r['effective_rate'], 3)} | {fmt(r['effective_rate_round0'], 3)}"
            f" | {fmt(r['effective_rate_later'], 3)} | {fmt(r['vs_uniform'], 3)} |" for r in rows]
    al = cf["allocation"]
    rows = sorted(al["results"], key=lambda r: -r["expected_nondegenerate_per_step"])
    out += ["", f"Allocation: {al['budget_per_prompt']} rollouts per prompt on average, n in [{al['min']}, {al['max']}].",
            "", "| Strategy | Estimator | non-degenerate groups / step | vs uniform |", "|:---|:---|---:|---:|"]
    out += [f"| {r['strategy']} | {r['estimator']} | {fmt(r['expected_nondegenerate_per_step'], 2)} | "
            f"{fmt(r['vs_uniform'], 4)} |" for r in rows]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+", type=Path, help="report folders written by graphdiff evaluate")
    args = ap.parse_args()
    for folder in args.reports:
        doc = json.loads((folder / "metrics.json").read_text())
        print(f"### {folder}\n\n{table(doc)}\n")
        d = decisions(doc)
        if d:
            print(d + "\n")


if __name__ == "__main__":
    main()
