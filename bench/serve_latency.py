"""Per-call latency of a shell loop's graphdiff calls, each in its own process and through `graphdiff serve`.

A synthetic STATE (``bench.common.write_inputs``: N prompts, K planted states, ~deg neighbours) is made
twice. On the first, every call is its own process (``GRAPHDIFF_NO_SERVE=1``); on the second a
``graphdiff serve`` answers them. Each step of the loop is what a shell trainer runs:

    graphdiff select  --state STATE --candidates pool.txt --batch-size B --out batch.jsonl
    graphdiff update  --state STATE --step T --outcomes step_T.jsonl
    graphdiff predict --state STATE --ids pool.txt --out pred.jsonl

each timed as the caller sees it (wall, process start to exit). Also `graphdiff --version` and `status`,
and the server's own start-up (until its socket answers). Medians over --steps steps (the first step after
init is reported apart: it starts from q = A). Prints one JSON object. Not run by the tests.

    .venv/bin/python bench/serve_latency.py --n 3000 --k 120 --deg 30 --steps 8
    .venv/bin/python bench/serve_latency.py --n 150000 --k 320 --deg 40 --steps 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import GRAPHDIFF, emit, write_inputs  # noqa: E402


def call(*args, cwd, env=None) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([str(GRAPHDIFF), *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{args[0]} failed ({proc.returncode}): {proc.stderr.strip()}")
    return wall


def loop(folder: Path, ids, labels, p_state, args, env) -> dict:
    rng = np.random.default_rng(7)  # the same outcomes in both modes
    times: dict[str, list[float]] = {"select": [], "update": [], "predict": []}
    for t in range(1, args.steps + 1):
        pool = rng.choice(len(ids), size=4 * args.batch, replace=False)
        (folder / "pool.txt").write_text("".join(f"{ids[i]}\n" for i in pool))
        times["select"].append(call("select", "--state", "STATE", "--candidates", "pool.txt", "--batch-size",
                                    args.batch, "--seed", t, "--out", f"batch{t}.jsonl", cwd=folder, env=env))
        batch = pool[: args.batch]
        s = rng.binomial(args.rollouts, p_state[labels[batch]])
        (folder / f"step{t}.jsonl").write_text("".join(json.dumps({"id": ids[i], "n": args.rollouts, "s": int(x)})
                                                       + "\n" for i, x in zip(batch, s)))
        times["update"].append(call("update", "--state", "STATE", "--step", t, "--outcomes", f"step{t}.jsonl",
                                    cwd=folder, env=env))
        times["predict"].append(call("predict", "--state", "STATE", "--ids", "pool.txt", "--out",
                                     f"pred{t}.jsonl", cwd=folder, env=env))
    out = {}
    for name, xs in times.items():
        out[name] = {"first_s": round(xs[0], 3), "median_s": round(statistics.median(xs[1:] or xs), 3),
                     "min_s": round(min(xs[1:] or xs), 3), "max_s": round(max(xs[1:] or xs), 3)}
    out["step_median_s"] = round(statistics.median(
        [a + b + c for a, b, c in zip(times["select"][1:], times["update"][1:], times["predict"][1:])] or [0]), 3)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--k", type=int, default=120)
    ap.add_argument("--deg", type=int, default=30)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="graphdiff-serve-"))
    work.mkdir(parents=True, exist_ok=True)
    server = None
    try:
        ids, labels, _w = write_inputs(work, args.n, args.k, args.deg)
        p_state = np.random.default_rng(1).beta(2, 2, args.k)
        for mode in ("process", "served"):
            (work / mode).mkdir(exist_ok=True)
            shutil.rmtree(work / mode / "STATE", ignore_errors=True)
            call("init", "--graph", work / "graph.zarr", "--clusters", work / "clusters.zarr", "--out", "STATE",
                 "--device", "cpu", cwd=work / mode)
        plain = {"GRAPHDIFF_NO_SERVE": "1"}
        version = [call("--version", cwd=work) for _ in range(5)]
        status = [call("status", "--state", "STATE", cwd=work / "process", env=plain) for _ in range(3)]
        process = loop(work / "process", ids, labels, p_state, args, plain)

        t0 = time.perf_counter()
        server = subprocess.Popen([str(GRAPHDIFF), "serve", "--state", "STATE"], cwd=work / "served",
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        first = server.stderr.readline()
        if not first.startswith("serving"):
            raise SystemExit(f"graphdiff serve did not start: {first}{server.stderr.read()}")
        serve_start = time.perf_counter() - t0
        served_status = [call("status", "--state", "STATE", cwd=work / "served") for _ in range(3)]
        served = loop(work / "served", ids, labels, p_state, args, None)
        same = all((work / "process" / f"pred{t}.jsonl").read_bytes() == (work / "served" / f"pred{t}.jsonl").read_bytes()
                   for t in range(1, args.steps + 1))
        result = {
            "benchmark": "serve_latency", "date": date.today().isoformat(),
            "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                        "python": platform.python_version()},
            "n": args.n, "k": args.k, "deg": args.deg, "batch": args.batch, "pool": 4 * args.batch, "steps": args.steps,
            "version_s": round(statistics.median(version), 3),
            "status_s": {"process": round(statistics.median(status), 3),
                         "served": round(statistics.median(served_status), 3)},
            "serve_start_s": round(serve_start, 3),
            "process": process, "served": served,
            "speedup_per_step": round(process["step_median_s"] / served["step_median_s"], 1),
            "same_predictions": same,
        }
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=120)
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    emit(result, args.out)


if __name__ == "__main__":
    main()
