"""What reading an outcomes file costs against its size: peak memory and time of ``io.outcomes.read_outcomes``.

    .venv/bin/python bench/outcomes_stream.py [--sizes-mb 10 100 1000] [--ids 150000] [--format jsonl] [--out F]

For each size, writes an outcomes file of that many megabytes (counts rows ``{"id", "n", "s"}`` over a pool of
``--ids`` prompt ids, as a long run's steps would repeat them) and parses it in a fresh process, which reports its
peak resident memory (``ru_maxrss``) and the seconds the parse took; the same process's baseline (imports, the
id index) is reported beside it, so the parse's own share is the difference. JSONL and CSV are read as a
stream: the peak should stay flat as the file grows, bounded by the distinct ids.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import emit, write_outcomes  # noqa: E402

CHILD = r"""
import json, resource, sys, time
from graphdiff_cli.io.outcomes import read_outcomes
from graphdiff_cli.io.readers import IdIndex
path, n_ids = sys.argv[1], int(sys.argv[2])
index = IdIndex([f"p{i:07d}" for i in range(n_ids)])
index.index  # the STATE's id map, built before the parse as a STATE holds it
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
try:
    out = read_outcomes(path, index=index)
except TypeError:  # a graphdiff before the streaming reader took no index: compare with it
    out = read_outcomes(path)
dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "baseline_rss_mb": base / 1024, "rows": out.n_rows, "ids": len(out.ids)}))
"""


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--ids", type=int, default=150_000, help="distinct prompt ids (the STATE's size)")
    ap.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
    ap.add_argument("--work", default=None, help="folder for the files (default: a temporary one)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="gd-outcomes-"))
    work.mkdir(parents=True, exist_ok=True)
    runs = []
    for mb in args.sizes_mb:
        path = work / f"o_{mb:g}mb.{args.format}"
        rows = write_outcomes(path, mb, [f"p{i:07d}" for i in range(args.ids)], args.format)
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", CHILD, str(path), str(args.ids)], capture_output=True,
                              text=True, check=True)
        res = json.loads(proc.stdout)
        res.update(size_mb=round(path.stat().st_size / 1e6, 1), rows_written=rows,
                   process_s=round(time.perf_counter() - t, 2))
        runs.append(res)
        print(json.dumps(res), file=sys.stderr)
        path.unlink()
    return {"bench": "outcomes_stream", "format": args.format, "ids": args.ids, "runs": runs,
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                        "python": platform.python_version()},
            "date": time.strftime("%Y-%m-%d")}


if __name__ == "__main__":
    ns = argparse.ArgumentParser(add_help=False)
    ns.add_argument("--out", default=None)
    known, _ = ns.parse_known_args()
    emit(main(), known.out)
