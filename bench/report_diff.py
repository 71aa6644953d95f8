#!/usr/bin/env python3
"""One method's figures in two `graphdiff evaluate` reports, side by side (e.g. graphdiff with and without the
read-out of the embedding: the same log evaluated once with --embeddings and once without).

    .venv/bin/python bench/report_diff.py artifacts/demo/report/metrics.json artifacts/demo/report_noreadout/metrics.json

Prints every numeric figure of the method (``--method``, default graphdiff) that differs between the two
reports' accuracy metrics (all phases and subsets), ground-truth error and counterfactual decisions, as
"B -> A" (the second report's value, then the first's); timings are left out.
"""

from __future__ import annotations

import argparse
import json


def leaves(x, path=()):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from leaves(v, path + (str(k),))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from leaves(v, path + (str(i),))
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield path, float(x)


def method_figures(m: dict, method: str) -> dict:
    out = {}
    for sec in ("metrics", "ground_truth"):
        for p, v in leaves(m.get(sec, {})):
            if method in p and "series" not in p and "reliability" not in p and "seconds" not in p[-1]:
                out[(sec,) + p] = v
    for kind in ("selection", "allocation"):
        for r in (m.get("counterfactual") or {}).get(kind, {}).get("results", []):
            if r.get("estimator") == method:
                for k, v in r.items():
                    if isinstance(v, float) and k != "seconds":
                        out[("decisions", kind, r["strategy"], k)] = v
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="metrics.json of report A")
    ap.add_argument("b", help="metrics.json of report B")
    ap.add_argument("--method", default="graphdiff")
    args = ap.parse_args()
    with open(args.a, encoding="utf-8") as fa, open(args.b, encoding="utf-8") as fb:
        a, b = method_figures(json.load(fa), args.method), method_figures(json.load(fb), args.method)
    for k in sorted(set(a) & set(b)):
        if abs(a[k] - b[k]) > 1e-12:
            print("/".join(k), f"{b[k]:.4f} -> {a[k]:.4f}")


if __name__ == "__main__":
    main()
