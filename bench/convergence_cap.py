"""What a step that stops at ``max_iters`` costs in the estimates: the first steps of a real log applied to two
STATEs that differ only in ``max_iters`` (the default 50, and a cap no step reaches), the predictions compared.

    .venv/bin/python bench/convergence_cap.py NAME GRAPH.zarr CLUSTERS.zarr LOG.jsonl [--steps 5] [--cap 2000]

e.g. with the workflow's artifacts: artifacts/oneshot/graph/k80.zarr artifacts/oneshot/clusters/k80_Kauto_s0.zarr
artifacts/oneshot/data/log.jsonl. Prints one line per step (rounds, converged, max and mean |Δp| over every
prompt). Results: docs/explanation/estimator.md, "When a step does not converge". Not run by the tests.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from graphdiff_cli import State


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("graph")
    ap.add_argument("clusters")
    ap.add_argument("log")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--cap", type=int, default=2000)
    args = ap.parse_args()
    rows = defaultdict(list)
    with open(args.log) as f:
        for line in f:
            r = json.loads(line)
            rows[int(r["step"])].append({"id": r["id"], "n": r["n"], "s": r["s"]})
    work = Path(tempfile.mkdtemp(prefix="graphdiff-cap-"))
    try:
        states = {cap: State.init(args.graph, args.clusters, work / f"S{cap}", max_iters=cap, durable=False,
                                  device="cpu") for cap in (50, args.cap)}
        for t in sorted(rows)[: args.steps]:
            res = {cap: st.update(t, rows[t]) for cap, st in states.items()}
            ids = states[50].ids
            d = np.abs(states[50].estimates(ids)["p"] - states[args.cap].estimates(ids)["p"])
            print(json.dumps({"log": args.name, "step": t, "rounds": res[50]["iterations"],
                              "converged": res[50]["converged"], "rounds_uncapped": res[args.cap]["iterations"],
                              "max_abs_dp": float(d.max()), "mean_abs_dp": float(d.mean())}), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
