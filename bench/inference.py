"""Benchmark one estimator update at the paper's scale (issue: fast inference).

Builds a synthetic prompt graph with N nodes, K planted states and about `deg` mutual neighbours per
node (most inside the node's state), warms the estimator up to a fixed point, then measures on the
same state:
  - one naive synchronous sweep (W q sparse product + Proposition 1 softmax), the unit of cost;
  - one `update` (batch B, n rollouts) with the residual schedule;
  - the converged synchronous solution of that same step (tol = 0), and the max |p| difference;
  - peak RSS.
Prints one JSON object (and writes it to --out if given).

    .venv/bin/python bench/inference.py --n 150000 --k 320 --deg 40 --batch 256
"""

from __future__ import annotations

import argparse
import platform
import resource
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import emit, synthetic_graph  # noqa: E402


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=150_000)
    ap.add_argument("--k", type=int, default=320)
    ap.add_argument("--deg", type=int, default=40)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--warm-steps", type=int, default=3)
    ap.add_argument("--reference", action="store_true", help="also run the converged synchronous reference")
    ap.add_argument("--reference-iters", type=int, default=300, help="rounds cap of the reference (tol 0)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out")
    args = ap.parse_args()

    from graphdiff_cli import Estimator
    from graphdiff_cli.core import meanfield as mf

    t0 = time.perf_counter()
    w, labels = synthetic_graph(args.n, args.k, args.deg)
    t_graph = time.perf_counter() - t0
    rng = np.random.default_rng(1)
    true_p = rng.uniform(0.05, 0.95, args.k)[labels]
    est = Estimator(w, labels, args.k, preset="paper", schedule="residual", device=args.device, max_iters=200)
    rss_base = peak_rss_mb()

    def batch():
        ids = rng.choice(args.n, args.batch, replace=False)
        return ids, np.full(args.batch, args.rollouts), rng.binomial(args.rollouts, true_p[ids])

    warm = []
    for _ in range(args.warm_steps):
        st = est.update(*batch())
        warm.append({"seconds": st["seconds"], "rounds": st["iterations"], "rows_updated": st["rows_updated"]})

    # one naive synchronous sweep: W q, logits, softmax (what every round of the paper's loop costs)
    spec = mf.ModelSpec(graph=est.graph, labels=est.labels, n_states=est.n_states, beta=est.settings.beta,
                        epsilon=est.settings.epsilon)
    q = torch.as_tensor(est.q_, device=args.device)
    w_t = spec.torch_graph(q.device, q.dtype)
    obs = mf.make_observations(*batch(), args.n)
    sweeps = []
    for _ in range(3):
        t = time.perf_counter()
        field = torch.sparse.mm(w_t, q)
        _ = torch.softmax(mf.assignment_logits(spec, field, est.a_, est.b_, obs, torch.as_tensor(obs.ids, device=q.device)), 1)
        sweeps.append(time.perf_counter() - t)
        del field, _
    sweep = float(np.median(sweeps))

    ids, n, s = batch()
    state = est.state_dict()
    t = time.perf_counter()
    st = est.update(ids, n, s)
    t_update = time.perf_counter() - t
    rss_update = peak_rss_mb()
    out = {
        "date": date.today().isoformat(), "machine": f"{platform.machine()}, {torch.get_num_threads()} threads",
        "n": args.n, "k": args.k, "edges": int(w.nnz // 2), "mean_degree": float(w.nnz / args.n),
        "batch": args.batch, "device": args.device, "graph_build_s": t_graph,
        "naive_sweep_s": sweep, "update_s": t_update, "update_over_sweep": t_update / sweep,
        "update_rounds": st["iterations"], "update_rows_updated": st["rows_updated"],
        "update_converged": st["converged"], "warm_steps": warm,
        "q_float32_plus_graph_mb": (args.n * args.k * 4 + w.data.nbytes + w.indices.nbytes + w.indptr.nbytes) / 2**20,
        "peak_rss_mb_before_update": rss_base, "peak_rss_mb_after_update": rss_update,
    }
    if args.reference:
        ref = Estimator.from_state_dict({**state, "config": {**state["config"], "schedule": "synchronous",
                                                             "tol": 0.0, "max_iters": args.reference_iters}})
        t = time.perf_counter()
        rs = ref.update(ids, n, s)
        out["reference_sync_s"] = time.perf_counter() - t
        out["reference_sync_rounds"] = rs["iterations"]
        out["max_abs_diff_vs_converged_sync"] = float(np.abs(ref.predict() - est.predict()).max())
    emit(out, args.out)


if __name__ == "__main__":
    main()
