"""Benchmark one trainer round trip through the STATE directory: `graphdiff update` + `graphdiff predict`.

Builds a synthetic prompt graph (N nodes, K planted states, about `deg` mutual neighbours per node,
85% of them inside the node's state), writes it as "graph" and "clusters" artifacts (the planted
states stand in for the spectral clusters: clustering is not what is timed), runs `graphdiff init`,
then times, as a trainer would run them, the real CLI processes

    graphdiff update  --state STATE --step 1 --outcomes step1.jsonl   (B prompts x n rollouts)
    graphdiff predict --state STATE --out predictions.<fmt>           (every prompt)

and reports each one's wall time (process start and imports included) and its own split into load,
inference and write (from --json). Then the resident handoff on the same STATE, in this process
(``graphdiff_cli.State``, what ``graphdiff watch`` and the trainer integrations use): the STATE read
once, then per step update + predictions of the next candidate pool only (``--batch`` ids), each step
timed from outcomes file in to predictions file out, with the ratio to the two-process round trip of the
same run, and what each step wrote (``written_mb``: its step folder; ``delta``: rows of q, or q whole) and the
STATE's steps/ folder at the end. Prints one JSON object (and writes it to --out if given). Not run by the
tests. ``--snapshot-every 1`` writes every step whole (the layout before delta steps).

    .venv/bin/python bench/handoff_roundtrip.py --n 150000 --k 320 --deg 40 --batch 256 --max-iters 50

``--graph G.zarr --clusters C.zarr`` replaces the planted graph by existing artifacts (a real mutual-kNN
graph, e.g. the 150,000-prompt one that ``bench/extend.py cost --work DIR`` leaves in DIR/all_g.zarr and
DIR/all_c.zarr); --n and --k are then theirs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import emit, read_artifacts, rss_mb, run_graphdiff, write_inputs  # noqa: E402


def resident_steps(state, work, ids, labels, p_state, rng, args) -> dict:
    """The resident handoff (one State object, this process): per step, outcomes in -> update -> predictions
    of the next pool (args.batch ids) out; the first read of the STATE timed apart."""
    import statistics

    from graphdiff_cli import State

    import torch  # noqa: F401 - the resident process imported it long ago

    rss_before = rss_mb(os.getpid())
    t0 = time.perf_counter()
    h = State.open(state, device="cpu")
    h.estimator()
    first_load_s = time.perf_counter() - t0
    rss_loaded = rss_mb(os.getpid())
    start = h.step
    per_step = []
    for t in range(start + 1, start + 1 + args.resident_steps):
        batch = rng.choice(args.n, size=args.batch, replace=False)
        s = rng.binomial(args.rollouts, p_state[labels[batch]])
        outcomes = work / f"resident{t}.jsonl"
        outcomes.write_text("".join(json.dumps({"id": ids[i], "n": args.rollouts, "s": int(si)}) + "\n"
                                    for i, si in zip(batch, s)))
        pool = work / f"pool{t}.txt"
        pool.write_text("".join(ids[i] + "\n" for i in rng.choice(args.n, size=args.batch, replace=False)))
        t1 = time.perf_counter()
        upd = h.update(t, outcomes)
        t2 = time.perf_counter()
        pred = h.predict(work / f"resident_pred{t}.{args.format}", ids_file=pool)
        t3 = time.perf_counter()
        written = state / "steps" / f"{t:08d}.zarr"  # what the step wrote: q whole, or a delta's rows
        per_step.append({"step": t, "wall_s": t3 - t1, "update_s": t2 - t1, "predict_s": t3 - t2,
                         "written_mb": du_mb(written), "delta": (written / "q_rows").is_dir(),
                         "rows": pred["rows"], "iterations": upd["iterations"],
                         "inference_s": upd["timings"]["inference_s"], "write_s": upd["timings"]["write_s"],
                         "rss_mb": rss_mb(os.getpid())})
    t4 = time.perf_counter()
    full = h.predict(work / f"resident_all.{args.format}")
    full_s = time.perf_counter() - t4
    whole = [du_mb(p) for p in (state / "steps").glob("*.zarr") if (p / "q").is_dir()]
    deltas = [x["written_mb"] for x in per_step if x["delta"]]
    return {"first_load_s": first_load_s,
            "whole_step_mb": max(whole) if whole else None,
            "delta_mb_median": statistics.median(deltas) if deltas else None,
            "steps_folder_mb": du_mb(state / "steps"), "retained_steps": h.dir.retained_steps(), "rss_mb_before_open": rss_before, "rss_mb_after_load": rss_loaded,
            "rss_mb_after_predict_all": rss_mb(os.getpid()),
            "peak_rss_mb_this_process": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "steps": per_step, "loads": h.loads,
            "step_wall_s_median": statistics.median(x["wall_s"] for x in per_step),
            "predict_all_prompts_s": full_s, "predict_all_rows": full["rows"]}


def du_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=150_000)
    ap.add_argument("--k", type=int, default=320)
    ap.add_argument("--deg", type=int, default=40)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--max-iters", type=int, default=50)
    ap.add_argument("--schedule", default=None, help="override init's (the default preset's: residual)")
    ap.add_argument("--steps", type=int, default=2, help="updates applied; the last one is the one reported "
                    "(step 1 after init starts from q = A; later steps are the steady state)")
    ap.add_argument("--format", default="jsonl", choices=["jsonl", "csv", "parquet"])
    ap.add_argument("--resident-steps", type=int, default=5, help="steps through the resident handoff after the "
                    "CLI ones (0: skip)")
    ap.add_argument("--workdir", default=None, help="Keep the files here (default: a temporary folder).")
    ap.add_argument("--out", default=None)
    ap.add_argument("--snapshot-every", type=int, default=None, help="init's --snapshot-every (default: its own)")
    ap.add_argument("--keep-every", type=int, default=None, help="init's --keep-every (default: its own)")
    ap.add_argument("--graph", default=None, help="an existing graph artifact instead of the planted one")
    ap.add_argument("--clusters", default=None, help="its clusters artifact (with --graph)")
    args = ap.parse_args()
    if bool(args.graph) != bool(args.clusters):
        ap.error("--graph and --clusters go together")

    work = Path(args.workdir or tempfile.mkdtemp(prefix="graphdiff-roundtrip-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        if args.graph:
            ids, labels, w = read_artifacts(Path(args.graph), Path(args.clusters))
            args.n, args.k = len(ids), int(labels.max()) + 1
            graph, clusters = Path(args.graph), Path(args.clusters)
        else:
            ids, labels, w = write_inputs(work, args.n, args.k, args.deg)
            graph, clusters = work / "graph.zarr", work / "clusters.zarr"
        t_inputs = time.perf_counter() - t0
        state = work / "STATE"
        shutil.rmtree(state, ignore_errors=True)
        extra = ["--schedule", args.schedule] if args.schedule else []
        for flag in ("snapshot_every", "keep_every"):
            if getattr(args, flag) is not None:
                extra += [f"--{flag.replace('_', '-')}", getattr(args, flag)]
        init, init_wall = run_graphdiff("init", "--graph", graph, "--clusters", clusters,
                              "--out", state, "--device", "cpu", "--max-iters", args.max_iters, *extra)
        rng = np.random.default_rng(1)
        p_state = rng.beta(2, 2, args.k)
        steps = []
        for t in range(1, args.steps + 1):
            batch = rng.choice(args.n, size=args.batch, replace=False)
            s = rng.binomial(args.rollouts, p_state[labels[batch]])
            outcomes = work / f"step{t}.jsonl"
            outcomes.write_text("".join(json.dumps({"id": ids[i], "n": args.rollouts, "s": int(si)}) + "\n"
                                        for i, si in zip(batch, s)))
            upd, upd_wall = run_graphdiff("update", "--state", state, "--step", t, "--outcomes", outcomes)
            steps.append({"step": t, "wall_s": upd_wall, "iterations": upd["iterations"],
                          "peak_rss_mb": upd["peak_rss_mb"], **upd["timings"]})
        pred, pred_wall = run_graphdiff("predict", "--state", state, "--out", work / f"predictions.{args.format}")
        resident = resident_steps(state, work, ids, labels, p_state, rng, args) if args.resident_steps else None
        result = {
            "benchmark": "handoff_roundtrip",
            "date": date.today().isoformat(),
            "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                        "python": platform.python_version()},
            "graph": args.graph or "planted", "n": args.n, "k": args.k, "mean_degree": float(w.nnz / args.n), "batch": args.batch,
            "rollouts": args.rollouts, "schedule": init["config"]["schedule"], "max_iters": args.max_iters,
            "updates": steps,
            "make_inputs_s": t_inputs,
            "init": {"wall_s": init_wall, **init["timings"]},
            "update": {"wall_s": upd_wall, "iterations": upd["iterations"], "converged": upd["converged"],
                       **upd["timings"]},
            "predict": {"wall_s": pred_wall, "format": args.format, "rows": pred["rows"],
                        "peak_rss_mb": pred["peak_rss_mb"], **pred["timings"]},
            "q_float32_plus_graph_mb": (args.n * args.k * 4 + w.data.nbytes + w.indices.nbytes + w.indptr.nbytes)
            / 2**20,
            "round_trip_wall_s": upd_wall + pred_wall,
            "resident": resident,
            "resident_over_round_trip": (resident["step_wall_s_median"] / (upd_wall + pred_wall)) if resident else None,
            "disk_mb": {"model": du_mb(state / "model.zarr"),
                        "step": du_mb(max((state / "steps").glob("*.zarr"))),  # the latest step's state
                        "predictions": (work / f"predictions.{args.format}").stat().st_size / 2**20},
        }
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    emit(result, args.out)


if __name__ == "__main__":
    main()
