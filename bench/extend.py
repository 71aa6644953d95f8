"""Benchmark `graphdiff extend`: exactness, first predictions of added prompts, and cost.

quality: a random share of a data set's prompts (--new, default 20%) joins at step --join; the log's rows
of those prompts before it are dropped (a new data source has no past). Two STATEs replay that same log,
one-step-ahead (each batch predicted before its outcomes, as `graphdiff evaluate`):

  scratch   graph, clusters and estimator built on ALL prompts at step 0 (a rebuild that replays the log)
  extended  built on the old prompts only; at step --join the new ones are added exactly as `graphdiff
            extend` adds them (core.graph.extend_mutual_knn, core.spectral.label_new_nodes,
            Estimator.extend), then the replay goes on

It reports whether the extended graph equals the scratch graph (edges and weights), and for the added
prompts' first visits: MAE against the observed rate and within-batch Pearson r (the mean over steps of r
among the added prompts visited for the first time in that step), besides the same figures for every row
after the join. "global" is the no-graph prior a new prompt gets from MoPPS or a per-prompt history: the
running observed success rate.

    .venv/bin/python bench/extend.py quality --data math   # artifacts/math (snakemake --configfile configs/math.yaml)
    .venv/bin/python bench/extend.py quality --data demo

cost: a STATE of --n prompts (synthetic clustered unit vectors at --dim, written as a real embeddings
artifact, graph, clusters and `graphdiff init`) extended by --add prompts with the real CLI
(`graphdiff extend --embedded`, so the new prompts' embedding is not in the timing, as the issue asks),
against a rebuild of the same N + add prompts (`graphdiff build-graph` + `graphdiff cluster` + `graphdiff
init`), in one run; and the update + predict round trip (CLI processes, batch --batch x 8 rollouts)
once q is at its fixed point (warm-up updates until one converges), two before the extend and three after.

    .venv/bin/python bench/extend.py cost --n 150000 --add 1000 --dim 384 --k-nn 80

first-update: in-process, the update right after an extend with label propagation's field solved at extend
(as built) against the field dropped there (as before), on the same synthetic graph.

    .venv/bin/python bench/extend.py first-update --n 40000 --add 300
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import GRAPHDIFF, ROOT, emit, synthetic_embeddings  # noqa: E402


# ------------------------------------------------------------------------------------------- quality

def _graph(x, k_nn):
    from graphdiff_cli.backends.knn import knn_search
    from graphdiff_cli.core.graph import drop_self, mutual_knn_graph

    k = min(k_nn, x.shape[0] - 1)
    res = knn_search(x, k + 1, device="cpu")
    nbr, sim = drop_self(res.neighbors, res.similarities, k)
    return mutual_knn_graph(nbr, sim), nbr, sim


def _clusters(w, nbr, seed=0):
    from graphdiff_cli.core.spectral import spectral_clustering
    from graphdiff_cli.stages.prepare import auto_states

    k = auto_states(w.shape[0])
    return spectral_clustering(w, k, seed=seed, fallback_neighbors=nbr).astype(np.int64), k


def _replay(est, rows_by_step, join=None):
    """One-step-ahead predictions of every row; ``join(est)`` is called before step ``join_step``."""
    preds = []
    for t, (rows, n, s) in rows_by_step:
        if join is not None and t == join[0]:
            join[1](est)
        preds.append(est.predict(rows))
        est.update(rows, n, s)
    return np.concatenate(preds)


def quality(args) -> dict:
    from graphdiff_cli.core.graph import extend_mutual_knn, normalize_rows
    from graphdiff_cli.evaluation.metrics import mae, within_batch
    from graphdiff_cli.core.spectral import label_new_nodes
    from graphdiff_cli.estimator import Estimator
    from graphdiff_cli.io.artifacts import read_artifact

    base = ROOT / "artifacts" / args.data
    art = read_artifact(base / "embeddings.zarr", "embeddings")
    ids = [str(i) for i in art.array("ids")]
    x = normalize_rows(art.array("embeddings"))
    log = [json.loads(line) for line in open(base / "data" / "log.jsonl")]
    rng = np.random.default_rng(args.seed)
    n_all = len(ids)
    is_new = np.zeros(n_all, bool)
    is_new[rng.choice(n_all, int(round(args.new * n_all)), replace=False)] = True
    pos = {p: i for i, p in enumerate(ids)}
    rows = [(r["step"], pos[r["id"]], r["n"], r["s"]) for r in log
            if not (is_new[pos[r["id"]]] and r["step"] < args.join)]
    step = np.array([r[0] for r in rows])
    node = np.array([r[1] for r in rows])
    n = np.array([r[2] for r in rows])
    s = np.array([r[3] for r in rows])
    old_nodes, new_nodes = np.flatnonzero(~is_new), np.flatnonzero(is_new)
    # extended order: old prompts, then new ones (as extend appends them)
    order = np.concatenate([old_nodes, new_nodes])
    ext_of = np.empty(n_all, np.int64)
    ext_of[order] = np.arange(n_all)

    def by_step(index):
        out = []
        for t in np.unique(step):
            m = step == t
            out.append((t, (index[node[m]], n[m], s[m])))
        return out

    t0 = time.perf_counter()
    w_all, nbr_all, _ = _graph(x, args.k_nn)
    labels_all, k_all = _clusters(w_all, nbr_all)
    t_scratch_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    x_old, x_new = x[old_nodes], x[new_nodes]
    w_old, nbr_old, sim_old = _graph(x_old, args.k_nn)
    labels_old, k_old = _clusters(w_old, nbr_old)
    t_old_build = time.perf_counter() - t0
    ext = extend_mutual_knn(w_old, nbr_old, sim_old, x_old, x_new)
    # exactness: the extended W against the scratch W in the extended node order
    w_ref = w_all[order][:, order]
    diff_pattern = int(abs((ext.graph != 0).astype(np.int8) - (w_ref != 0).astype(np.int8)).sum())
    weight_diff = float(abs(ext.graph - w_ref).max()) if ext.graph.nnz else 0.0
    labels_ext = label_new_nodes(ext.graph, labels_old, ext.neighbors, ext.similarities, k_old)

    settings = {"preset": args.preset}
    scratch = Estimator(w_all, labels_all, k_all, **settings)
    p_scratch = _replay(scratch, by_step(np.arange(n_all)))
    extended = Estimator(w_old, labels_old, k_old, **settings)
    p_ext = _replay(extended, by_step(ext_of), join=(args.join, lambda est: est.extend(ext.graph, labels_ext)))

    rate = s / n
    first = np.zeros(step.size, bool)
    seen = set()
    for i, v in enumerate(node):
        if v not in seen:
            first[i] = True
            seen.add(v)
    added_first = first & is_new[node]
    after = step >= args.join
    # the no-graph prior: the running observed success rate before the step
    glob = np.empty(step.size)
    cs = cn = 0.0
    for t in np.unique(step):
        m = step == t
        glob[m] = (cs + 1.0) / (cn + 2.0)
        cs, cn = cs + s[m].sum(), cn + n[m].sum()

    def figures(mask):
        out = {}
        for name, p in (("scratch", p_scratch), ("extended", p_ext), ("global", glob)):
            wb = within_batch(step[mask], p[mask], rate[mask])
            out[name] = {"mae": round(mae(p[mask], rate[mask]), 4), "within_r": round(wb["pearson"], 4),
                         "batches": wb["batches"]}
        return out

    return {"bench": "extend-quality", "data": args.data, "date": str(date.today()), "machine": platform.node(),
            "prompts": n_all, "added": int(is_new.sum()), "join_step": args.join, "seed": args.seed,
            "k_nn": args.k_nn, "preset": args.preset, "states": {"scratch": k_all, "extended": k_old},
            "graph_equal": {"pattern_differences": diff_pattern, "max_weight_difference": weight_diff,
                            "edges": int(ext.graph.nnz // 2), "changed_lists": int(ext.changed.size)},
            "added_first_visits": {"rows": int(added_first.sum()), **figures(added_first)},
            "all_rows_after_join": {"rows": int(after.sum()), **figures(after)},
            "old_rows_after_join": {"rows": int((after & ~is_new[node]).sum()), **figures(after & ~is_new[node])},
            "seconds": {"scratch_graph_and_clusters": round(t_scratch_build, 2),
                        "old_graph_and_clusters": round(t_old_build, 2)}}


# ---------------------------------------------------------------------------------------------- cost

def _run(*argv) -> tuple[float, dict]:
    t = time.perf_counter()
    out = subprocess.run([str(GRAPHDIFF), *map(str, argv), "--json"], check=True, capture_output=True, text=True)
    return time.perf_counter() - t, json.loads(out.stdout)


def cost(args) -> dict:
    from graphdiff_cli.backends.embed import DEFAULT_INSTRUCTION
    from graphdiff_cli.io.artifacts import hash_arrays, write_artifact
    from graphdiff_cli.stages.prepare import ids_for_hash

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gd-extend-", dir=args.tmp))
    work.mkdir(parents=True, exist_ok=True)
    try:
        x = synthetic_embeddings(args.n + args.add, args.dim, args.topics)
        ids = [f"p{i}" for i in range(args.n + args.add)]
        params = {"model": "bundled", "instruction": DEFAULT_INSTRUCTION, "dim": args.dim, "batch_size": 64,
                  "shard": None, "id_field": "id", "text_field": "prompt"}

        def write(path, rows):
            ids_arr = ids_for_hash([ids[i] for i in rows])
            write_artifact(path, "embeddings", {"ids": ids_arr.astype(object), "embeddings": x[rows],
                                                "text_hash": np.asarray([f"{i:016x}" for i in rows], dtype=object)},
                           params=params, inputs={"prompts": "synthetic"}, content_hash=hash_arrays(ids_arr, x[rows]),
                           attrs={"native_dim": args.dim})

        old, new, everything = np.arange(args.n), np.arange(args.n, args.n + args.add), np.arange(args.n + args.add)
        k = ["--k-nn", args.k_nn]
        if not (work / "S0").is_dir():  # the old STATE (kept with --work: it takes minutes to build)
            write(work / "old.zarr", old)
            write(work / "new.zarr", new)
            write(work / "all.zarr", everything)
            _run("build-graph", work / "old.zarr", "--out", work / "old_g.zarr", *k)
            _run("cluster", work / "old_g.zarr", "--out", work / "old_c.zarr", "--states", args.states)
            _run("init", "--graph", work / "old_g.zarr", "--clusters", work / "old_c.zarr", "--out", work / "S0",
                 "--max-iters", 50)
        shutil.rmtree(work / "S", ignore_errors=True)
        shutil.copytree(work / "S0", work / "S")
        rng = np.random.default_rng(1)

        def outcomes(path, pool):
            b = rng.choice(pool, args.batch, replace=False)
            with open(path, "w") as f:
                for i in b:
                    f.write(json.dumps({"id": ids[i], "n": 8, "s": int(rng.integers(0, 9))}) + "\n")

        step = 0
        rounds = []

        def round_trip(pool):
            nonlocal step
            step += 1
            outcomes(work / f"o{step}.jsonl", pool)
            t_up, up = _run("update", "--state", work / "S", "--step", step, "--outcomes", work / f"o{step}.jsonl")
            t_pr, _ = _run("predict", "--state", work / "S", "--out", work / "p.parquet")
            r = {"step": step, "update_s": round(t_up, 2), "predict_s": round(t_pr, 2),
                 "inference_s": round(up["timings"]["inference_s"], 3), "iterations": up["iterations"],
                 "converged": up["converged"]}
            rounds.append(r)
            return r

        for _ in range(args.warmup):  # q reaches its fixed point: the steady state a trainer sees
            if round_trip(old)["converged"] and step >= 2:
                break
        before = [round_trip(old) for _ in range(2)]
        t_ext, ext = _run("extend", "--state", work / "S", "--embedded", work / "new.zarr")
        after = [round_trip(everything) for _ in range(3)]
        out = {"bench": "extend-cost", "date": str(date.today()), "machine": platform.node(), "n": args.n,
               "add": args.add, "dim": args.dim, "k_nn": args.k_nn, "states": args.states,
               "extend_wall_s": round(t_ext, 2),
               "extend_timings": {k2: round(v, 3) for k2, v in ext["timings"].items()},
               "changed_lists": ext["changed_lists"], "changed_rows": ext["changed_rows"],
               "extended_edges": ext["edges"], "round_trips": {"warm_up": rounds[:len(rounds) - 5],
                                                               "before": before, "after": after}}
        if args.rebuild:  # the rebuild of the same N + add prompts, in the same run
            shutil.rmtree(work / "S2", ignore_errors=True)
            t_g, g = _run("build-graph", work / "all.zarr", "--out", work / "all_g.zarr", *k)
            t_c, _ = _run("cluster", work / "all_g.zarr", "--out", work / "all_c.zarr", "--states", args.states)
            t_i, _ = _run("init", "--graph", work / "all_g.zarr", "--clusters", work / "all_c.zarr", "--out",
                          work / "S2", "--max-iters", 50)
            rebuild = t_g + t_c + t_i
            out.update({"rebuild_wall_s": {"build_graph": round(t_g, 2), "cluster": round(t_c, 2),
                                           "init": round(t_i, 2), "total": round(rebuild, 2)},
                        "ratio_extend_to_rebuild": round(t_ext / rebuild, 4),
                        "rebuild_edges": g["summary"]["n_edges"]})
        return out
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------- first update

def first_update(args) -> dict:
    """In-process: the update right after an extend, with label propagation's field solved at extend (as
    built) against no field at extend (what extend did before: the next update solved it cold)."""
    from graphdiff_cli.core import belief as bl
    from graphdiff_cli.core.graph import extend_mutual_knn
    from graphdiff_cli.core.spectral import label_new_nodes, spectral_clustering

    x = synthetic_embeddings(args.n + args.add, args.dim, max(200, args.n // 75))
    w, nbr, sim = _graph(x[:args.n], args.k_nn)
    labels = spectral_clustering(w, args.states, seed=0, fallback_neighbors=nbr).astype(np.int64)
    ext = extend_mutual_knn(w, nbr, sim, x[:args.n], x[args.n:])
    labels_ext = label_new_nodes(ext.graph, labels, ext.neighbors, ext.similarities, args.states)
    solve = {"s": 0.0}
    harmonic = bl.harmonic_field

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return harmonic(*a, **k)
        finally:
            solve["s"] += time.perf_counter() - t

    bl.harmonic_field = timed
    try:
        return _first_update_runs(args, w, labels, ext, labels_ext, solve)
    finally:
        bl.harmonic_field = harmonic


def _first_update_runs(args, w, labels, ext, labels_ext, solve) -> dict:
    from graphdiff_cli.estimator import Estimator

    p_true = np.random.default_rng(1).uniform(0, 1, args.n + args.add)
    out = {"n": args.n, "add": args.add, "k_nn": args.k_nn, "states": args.states, "batch": args.batch,
           "machine": platform.platform(), "date": date.today().isoformat()}
    for variant in ("field dropped at extend (before)", "field solved at extend (as built)"):
        est = Estimator(w, labels, args.states, preset="default", device="cpu")
        rng = np.random.default_rng(1)

        def step(n_nodes):
            ids = rng.choice(n_nodes, args.batch, replace=False)
            solve["s"] = 0.0
            t = time.perf_counter()
            est.update(ids, np.full(ids.size, 8), rng.binomial(8, p_true[ids]))
            return {"update_s": round(time.perf_counter() - t, 3), "solve_s": round(solve["s"], 3)}

        warm = [step(args.n) for _ in range(args.warmup)]
        if variant.startswith("field dropped"):
            est.lp_field_ = None  # extend then neither grows nor solves it: the next update solves it cold
        solve["s"] = 0.0
        t = time.perf_counter()
        changed = est.extend(ext.graph, labels_ext)
        extend_s = time.perf_counter() - t
        out[variant] = {"steady (last 3 before)": warm[-3:], "extend_s": round(extend_s, 3),
                        "extend_solve_s": round(solve["s"], 3), "rows_changed": int(changed.size),
                        "after": [step(args.n + args.add) for _ in range(3)]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--data", default="math", help="artifacts/<data> with embeddings.zarr and data/log.jsonl")
    q.add_argument("--new", type=float, default=0.2)
    q.add_argument("--join", type=int, default=30, help="the step at which the new prompts join")
    q.add_argument("--k-nn", type=int, default=80)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--preset", default="default")
    c, f = sub.add_parser("cost"), sub.add_parser("first-update")
    for p, n, add, warmup, until in ((c, 150000, 1000, 8, ", at most (until one converges)"), (f, 40000, 300, 5, "")):
        p.add_argument("--n", type=int, default=n)
        p.add_argument("--add", type=int, default=add)
        p.add_argument("--dim", type=int, default=384)
        p.add_argument("--k-nn", type=int, default=80)
        p.add_argument("--states", type=int, default=320)
        p.add_argument("--batch", type=int, default=256)
        p.add_argument("--warmup", type=int, default=warmup, help="updates before the measured ones" + until)
    c.add_argument("--topics", type=int, default=2000)
    c.add_argument("--tmp", default=None)
    c.add_argument("--work", default=None, help="keep the old STATE here and reuse it on the next run")
    c.add_argument("--no-rebuild", dest="rebuild", action="store_false")
    for p in (q, c, f):
        p.add_argument("--out", default=None)
    args = ap.parse_args()
    emit({"quality": quality, "cost": cost, "first-update": first_update}[args.what](args), args.out)


if __name__ == "__main__":
    main()
