#!/usr/bin/env python3
"""A staged artifact's fsyncs one after another (``io.staging.fsync_tree`` as it was) against issued together (as
it is): each round copies one step artifact of a STATE afresh (so its pages are dirty again) and times making it
durable, the two ways interleaved; medians. Run it beside whatever else writes to the disk (on an idle disk the two
are alike; docs/lab/performance.md).

    .venv/bin/python bench/fsync_tree.py STATE/steps/00000012.zarr --rounds 12 --work /tmp/fsync
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import emit, fsync_tree_one_by_one  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact", type=Path, help="a folder to copy and fsync (a STATE's step artifact)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--work", type=Path, required=True, help="where the copies go (on the disk to measure)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from graphdiff_cli.io import staging
    ways = {"one by one": fsync_tree_one_by_one, "together": staging.fsync_tree}
    times = {w: [] for w in ways}
    entries = sum(len(d) + len(f) for _, d, f in os.walk(args.artifact)) + 1
    load_before = os.getloadavg()
    for r in range(args.rounds):
        for w in (list(ways) if r % 2 else list(ways)[::-1]):
            dst = args.work / f"{r}-{w.replace(' ', '_')}"
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(args.artifact, dst)
            t0 = time.perf_counter()
            ways[w](dst)
            times[w].append(time.perf_counter() - t0)
            shutil.rmtree(dst, ignore_errors=True)
    emit({"bench": "fsync_tree", "date": str(date.today()), "artifact": str(args.artifact), "entries": entries,
          "rounds": args.rounds, "load_average_before": load_before, "load_average_after": os.getloadavg(),
          "median_s": {w: round(statistics.median(t), 4) for w, t in times.items()},
          "seconds": {w: [round(x, 4) for x in t] for w, t in times.items()}}, args.out)


if __name__ == "__main__":
    main()
