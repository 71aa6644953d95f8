#!/usr/bin/env python3
"""Where a resident step goes, by source and phase: the default preset beside the default with label propagation's
field solved only every m-th step (``propagation_every``), and optionally beside the default without label
propagation (``--without-propagation``: ``--label-propagation none``; a weight of 0 would keep its solve) and the
default with its commit's fsyncs issued one by one (``--sequential-fsync``: ``io.staging.fsync_tree`` as it was) and
the default with its commit's arrays written one after another (``--sequential-writes``: ``io.artifacts.write_group``
as it was), stepped in turn on the same batches in one process.

On a graph and clusters artifact (the 150,000-prompt graph of ``bench/text_to_state.py``, or ``graphdiff build-graph
--k-nn 80`` and ``graphdiff cluster --states 320`` on the 150,000 clustered 384-d vectors of ``bench/extend.py``'s
``synthetic_embeddings``), one STATE per variant is made by ``graphdiff init`` (--max-iters 50; ``--embeddings`` for
the read-out of the embedding), all opened resident (``State.open``, CPU); then each step, the same batch of
``--batch`` prompts (8 rollouts at their cluster's rate) goes to each variant in turn through ``State.update``, and
the predictions of the next ``--batch`` prompts are read (``State.predict``). Timed inside the step by wrapping the
code's own functions (no profiler): the estimator's update, its mean-field residual update, the online choices'
scoring (``Mix.score``, the sources' estimates for the batch included), each source's ``observe`` (label
propagation's solve is its), every source's estimates (in the scoring and in the next batch's read), then
``State.update``'s own phases (the step's inference, its commit: ``write_s``) and the read. The first ``--warmup``
steps (q relaxing from the prior) are run but not counted; medians over the rest. Prints the load average before
and after. A STATE in ``--work`` is reused by a later run with the same variant and ``--embeddings`` (its folder
name says both).

    .venv/bin/python bench/step_phases.py W/graph.zarr W/clusters.zarr --embeddings W/embeddings.zarr \
        --every 4 --without-propagation --sequential-fsync --sequential-writes --steps 12 --warmup 3 --work /tmp/phases
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections import defaultdict
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import (emit, fsync_tree_one_by_one, read_artifacts, run_graphdiff,  # noqa: E402
                          write_group_one_by_one)

PHASES = defaultdict(float)  # seconds per phase in the step being measured


def timed(fn, name):
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            PHASES[name] += time.perf_counter() - t0
    return wrapper


def instrument(est) -> None:
    """Wrap the functions a step of estimators like ``est`` runs through (the classes of its mix and sources), each
    adding its seconds to ``PHASES``."""
    from graphdiff_cli.core import meanfield as mf

    cls = type(est)
    cls.update = timed(cls.update, "estimator update")
    mf.run_step_residual = timed(mf.run_step_residual, "  mean-field residual update")
    mix = type(est.mix)
    mix.score = timed(mix.score, "  online choices: scoring (sources' estimates included)")
    for src in {type(s) for s in est.mix.sources}:
        src.observe = timed(src.observe, f"  {src.name}: observe")
        src.estimate = timed(src.estimate, f"  {src.name}: estimates (scoring and reads)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graph", type=Path)
    ap.add_argument("clusters", type=Path)
    ap.add_argument("--every", type=int, default=4, help="m of the second variant (propagation_every)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--without-propagation", action="store_true",
                    help="a third variant: the default without label propagation (--label-propagation none)")
    ap.add_argument("--sequential-fsync", action="store_true",
                    help="a fourth variant: the default with its commit's files fsynced one after another (as before "
                         "io.staging.fsync_tree issued them together)")
    ap.add_argument("--sequential-writes", action="store_true",
                    help="a fifth variant: the default with its commit's arrays written one after another (as before "
                         "io.artifacts.write_group wrote them together)")
    ap.add_argument("--embeddings", type=Path, default=None,
                    help="the embeddings artifact the graph was built from (init --embeddings)")
    ap.add_argument("--work", type=Path, required=True, help="the STATEs go here (made once, reused when present)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from graphdiff_cli import State
    from graphdiff_cli.io import artifacts, staging

    parallel_fsync_tree, concurrent_write_group = staging.fsync_tree, artifacts.write_group

    ids, labels, _w = read_artifacts(args.graph, args.clusters)
    n = len(ids)
    variants = {"default": ([], "S_default"),
                f"field every {args.every}": (["--propagation-every", args.every], f"S_every{args.every}")}
    if args.without_propagation:
        variants["without label propagation"] = (["--label-propagation", "none"], "S_lp_none")
    if args.sequential_fsync:
        variants["default, fsync one by one"] = ([], "S_default_seqfsync")
    if args.sequential_writes:
        variants["default, arrays one by one"] = ([], "S_default_seqwrites")
    emb = ["--embeddings", args.embeddings] if args.embeddings else []
    states = {}
    for name, (flags, folder) in variants.items():
        path = args.work / (folder + ("_emb" if args.embeddings else ""))  # a STATE is reused only with its flags
        if not path.is_dir():
            run_graphdiff("init", "--graph", args.graph, "--clusters", args.clusters, "--out", path,
                          "--max-iters", 50, "--device", "cpu", *emb, *flags)
        states[name] = State.open(path, device="cpu")
        states[name].estimator()
    start = {name: h.step for name, h in states.items()}
    if len(set(start.values())) != 1:
        raise SystemExit(f"the STATEs in {args.work} are at different steps ({start}): remove them and rerun")
    instrument(states["default"].estimator())
    rng = np.random.default_rng(1)
    p_state = rng.uniform(0.05, 0.95, int(labels.max()) + 1)
    load_before = os.getloadavg()
    rows = {name: [] for name in states}
    t_all = time.perf_counter()
    for t in range(start["default"] + 1, start["default"] + 1 + args.steps):
        batch = rng.choice(n, size=args.batch, replace=False)
        s = rng.binomial(8, p_state[labels[batch]])
        outcomes = [{"id": str(ids[i]), "n": 8, "s": int(si)} for i, si in zip(batch, s)]
        pool = args.work / "pool.txt"
        pool.write_text("".join(str(ids[i]) + "\n" for i in rng.choice(n, size=args.batch, replace=False)))
        for name, h in states.items():
            staging.fsync_tree = fsync_tree_one_by_one if name == "default, fsync one by one" else parallel_fsync_tree
            artifacts.write_group = (write_group_one_by_one if name == "default, arrays one by one"
                                     else concurrent_write_group)
            PHASES.clear()
            t0 = time.perf_counter()
            res = h.update(t, outcomes)
            t1 = time.perf_counter()
            h.predict(args.work / "pred.jsonl", ids_file=pool)
            t2 = time.perf_counter()
            row = {"step": t, "resident step (update + next predictions)": t2 - t0, "State.update": t1 - t0,
                   "  the step's inference (apply_step)": res["timings"]["inference_s"],
                   "  the step's commit (write_s)": res["timings"]["write_s"],
                   "predictions of the next batch": t2 - t1, **PHASES}
            rows[name].append(row)
            print(json.dumps({"variant": name, **{k: round(v, 4) for k, v in row.items()}}), flush=True)
    load_after = os.getloadavg()
    counted = {name: r[args.warmup:] for name, r in rows.items()}
    keys = list(dict.fromkeys(k for r in counted.values() for x in r for k in x if k != "step"))
    medians = {name: {k: statistics.median(x.get(k, 0.0) for x in r) for k in keys} for name, r in counted.items()}
    out = {"bench": "step_phases", "date": str(date.today()), "machine": platform.platform(), "cpus": os.cpu_count(),
           "graph": str(args.graph), "n": n, "batch": args.batch, "steps": args.steps, "warmup": args.warmup,
           "load_average_before": load_before, "load_average_after": load_after,
           "wall_s": time.perf_counter() - t_all, "medians": medians, "steps_measured": rows}
    names = list(medians)
    print(f"\nmedians of steps {args.warmup + 1}-{args.steps} (s); load average before {load_before[0]:.1f}, "
          f"after {load_after[0]:.1f} ({os.cpu_count()} CPUs)")
    print(f"{'phase':58s} " + " ".join(f"{n_:>18s}" for n_ in names))
    for k in keys:
        print(f"{k:58s} " + " ".join(f"{medians[n_][k]:18.4f}" for n_ in names))
    emit(out, args.out)


if __name__ == "__main__":
    main()
