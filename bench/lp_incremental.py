#!/usr/bin/env python3
"""Issue 32, item 2, an experiment (not a product option): can label propagation's field be updated from what
changed, with work that follows the batch and its neighbourhood instead of N?

On a graph artifact (e.g. the 150,000-prompt mutual-kNN graph that `bench/extend.py cost --n 150000 --add 1000
--dim 384 --k-nn 80 --states 320 --work W` leaves in W/old_g.zarr, W/old_c.zarr), a run of --steps steps is
simulated: each step 205 new prompts and 51 seen ones (batch 256) get 8 rollouts at a per-cluster rate (Beta(2,2)
plus N(0, 0.1) per prompt), and the field is solved as the product solves it (``harmonic_solution`` warm-started
from the step before, to relative residual 1e-6: the reference for cost) and to 1e-11 (the reference for error).
It reports:

  reach      the share of the graph within 1, 2 and 3 hops of one batch: how far a change can travel in as many
             products (a local method's work cannot stay in a ball that is the whole graph);
  tau        max, 99th percentile and median of tau = L_UU^-1 1 with 205 to 20,500 prompts labelled: for any
             approximate field with Dirichlet residual r, |error_i| <= tau_i max_j |r_j| (L_UU is an M-matrix),
             so tau says how small a residual a certified tolerance needs;
  push       Gauss-Southwell push (simultaneous Jacobi updates of every node whose scaled residual exceeds
             --push-tol, the residual carried as the push goes) from the exact field of step 1 to step 2's
             labels: sweeps, work in products with W, seconds, and the error left;
  capped     conjugate gradients capped at k products a step, warm-started from its own previous field (the field
             tracked over the run rather than solved): seconds and error, max and mean over prompts and over the
             next batch's propagated estimate, at chosen steps.

    .venv/bin/python bench/lp_incremental.py W/old_g.zarr W/old_c.zarr [--steps 100] [--caps 5 10 20]
"""

from __future__ import annotations

import argparse
import platform
import time
from datetime import date
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components
from scipy.sparse.linalg import LinearOperator, cg
from threadpoolctl import threadpool_limits

from _emit import emit  # bench/ is on sys.path when a script runs
from handoff_roundtrip import read_inputs
from graphdiff_cli.core.graph import row_parallel_matvec
from graphdiff_cli.core.harmonic import harmonic_solution

REPORT = (2, 3, 5, 10, 20, 30, 50, 70, 100)


class System:
    """The Dirichlet problem of one step: which prompts are labelled, the mask of those solved for, the
    right-hand side."""

    def __init__(self, w, prod, deg, comps, lab, vals, fill):
        n = w.shape[0]
        self.lab, self.vals, self.fill = lab, vals, fill
        is_lab = np.zeros(n, bool)
        is_lab[lab] = True
        has = np.zeros(comps.max() + 1, bool)
        has[comps[lab]] = True
        self.free = ~is_lab & has[comps]
        self.mask = self.free.astype(float)
        self.start = np.full(n, fill)
        self.start[lab] = vals
        bnd = np.zeros(n)
        bnd[lab] = vals
        self.rhs = self.mask * prod(bnd)
        self.w, self.prod, self.deg = w, prod, deg

    def lap(self, x):
        x = self.mask * x
        return self.mask * (self.deg * x - self.prod(x))

    def pcg(self, rhs, x0, rtol, maxiter):
        """Jacobi-preconditioned CG on L_UU (no fallback: the iterate as it stands after ``maxiter``)."""
        n = self.mask.size
        with threadpool_limits(1, "blas"):
            return cg(LinearOperator((n, n), self.lap), rhs, x0=x0, rtol=rtol, atol=0.0, maxiter=maxiter,
                      M=LinearOperator((n, n), self.jacobi()))[0]

    def field(self, x):
        """The whole field from a solution ``x`` on the free prompts: labelled prompts keep their rates, prompts in
        no labelled component the fill, the solved ones clipped to the rates' range (the maximum principle)."""
        f = self.start.copy()
        f[self.free] = np.clip(x[self.free], self.vals.min(), self.vals.max())
        return f

    def jacobi(self):
        """Jacobi's preconditioner of L_UU as a function (0 off the free prompts)."""
        inv = np.where(self.free, 1 / np.where(self.deg > 0, self.deg, 1), 0)
        return lambda v: inv * v

    def capped_cg(self, x0, k):
        """k Jacobi-PCG products from x0."""
        return self.field(self.pcg(self.rhs, self.mask * x0, 1e-6, k))

    def tau(self):
        """L_UU^-1 1 on the free prompts (0 elsewhere), by Jacobi-PCG to 1e-8."""
        return self.mask * self.pcg(self.mask.copy(), None, 1e-8, 5000)

    def push(self, f, tol, max_sweeps=2000):
        """Gauss-Southwell push, every node over the tolerance at once: (field, sweeps, entries of W read)."""
        f = f.copy()
        f[self.lab] = self.vals
        deg = np.where(self.deg > 0, self.deg, 1.0)
        r = self.mask * (self.prod(f) - self.deg * f)
        work = sweeps = 0
        while sweeps < max_sweeps:
            act = np.flatnonzero(np.abs(r) > tol * deg)
            if act.size == 0:
                break
            step = r[act] / deg[act]
            f[act] += step
            r[act] = 0.0
            rows = self.w[act]  # W is symmetric: its rows are the columns the update spreads along
            work += rows.nnz
            hit, inv = np.unique(rows.indices, return_inverse=True)
            r[hit] += np.bincount(inv.reshape(-1), np.repeat(step, np.diff(rows.indptr)) * rows.data) * self.mask[hit]
            sweeps += 1
        return f, sweeps, work


def load(graph: Path, clusters: Path):
    """labels, W (float64 CSR), degrees, connected components and the product with W of graph and clusters
    artifacts."""
    _ids, labels, w = read_inputs(graph, clusters)
    w = sp.csr_matrix(w, dtype=np.float64)
    deg = np.asarray(w.sum(1)).ravel()
    comps = connected_components(w, directed=False)[1]
    return labels, w, deg, comps, row_parallel_matvec(w)


def simulated_rates(rng, labels):
    """Each prompt's pass rate: its cluster's Beta(2, 2) rate plus N(0, 0.1), clipped to [0.01, 0.99]."""
    return np.clip(rng.beta(2, 2, labels.max() + 1)[labels] + rng.normal(0, .1, labels.size), 0.01, .99)


def simulated_run(rng, rate, steps: int):
    """Per step (205 new prompts and 51 seen ones, 8 rollouts each): (step, batch, labelled prompts, their pass
    rates so far, the fill for prompts in no labelled component). Lazy: a caller's own draws from ``rng``
    between steps come between this run's."""
    n = rate.size
    S, C = np.zeros(n), np.zeros(n)
    seen = np.zeros(n, bool)
    for step in range(1, steps + 1):
        new = rng.choice(np.flatnonzero(~seen), 205, replace=False)
        old = rng.choice(np.flatnonzero(seen), 51, replace=False) if seen.any() else np.zeros(0, int)
        batch = np.concatenate([new, old])
        seen[new] = True
        C[batch] += 8
        S[batch] += rng.binomial(8, rate[batch])
        lab = np.flatnonzero(C > 0)
        yield step, batch, lab, S[lab] / C[lab], (S.sum() + 1) / (C.sum() + 2)


def counted_cg(a, b, x0=None, m=None, rtol: float = 1e-6, maxiter: int = 5000):
    """scipy's CG on one BLAS thread (as the product's solve): (solution, iterations, seconds, info)."""
    iters = [0]

    def count(_xk):
        iters[0] += 1

    t0 = time.perf_counter()
    with threadpool_limits(1, "blas"):
        x, info = cg(a, b, x0=x0, rtol=rtol, atol=0.0, maxiter=maxiter, M=m, callback=count)
    return x, iters[0], time.perf_counter() - t0, int(info)


def product_solve(w, lab, vals, fill, comps, x0, rtol, w_single=None):
    """The product's own solve (``harmonic_solution``; mixed-precision with ``w_single``), its CG iterations counted
    per stage (scipy's cg wrapped while it runs, which the solve imports when called): (field, {"iterations": one
    count per CG run, "solve_s"})."""
    import scipy.sparse.linalg as sla

    plain_cg, stages = sla.cg, []

    def counting_cg(a, b, *args, **kw):
        stages.append(0)

        def count(_xk):
            stages[-1] += 1
        return plain_cg(a, b, *args, callback=count, **kw)
    sla.cg = counting_cg
    try:
        t0 = time.perf_counter()
        f = harmonic_solution(w, lab, vals, fill, comps, x0=x0, rtol=rtol, w_single=w_single)
        seconds = time.perf_counter() - t0
    finally:
        sla.cg = plain_cg
    return f, {"iterations": stages, "solve_s": round(seconds, 3)}


def graph_parser(steps: int | None = 100) -> argparse.ArgumentParser:
    """The arguments these solve experiments share: a graph and a clusters artifact (``load``), ``--out`` and, unless
    ``steps`` is None, the simulated run's ``--steps``."""
    ap = argparse.ArgumentParser()
    ap.add_argument("graph")
    ap.add_argument("clusters")
    if steps is not None:
        ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--out", default=None)
    return ap


def reach(w, batch):
    """Shares of the graph within 1, 2, 3 hops of ``batch``."""
    n = w.shape[0]
    seen = np.zeros(n, bool)
    seen[batch] = True
    front, out = batch, []
    for _ in range(3):
        nxt = np.unique(w[front].indices)
        front = nxt[~seen[nxt]]
        seen[front] = True
        out.append(round(float(seen.mean()), 4))
    return out


def main() -> None:
    ap = graph_parser()
    ap.add_argument("--caps", type=int, nargs="+", default=[5, 10, 20])
    ap.add_argument("--push-tol", type=float, nargs="+", default=[1e-4])
    args = ap.parse_args()

    labels, w, deg, comps, prod = load(Path(args.graph), Path(args.clusters))
    n = w.shape[0]
    rng = np.random.default_rng(0)
    rate = simulated_rates(rng, labels)
    out = {"date": str(date.today()), "machine": platform.platform(), "n": n, "nnz": int(w.nnz),
           "components": int(comps.max() + 1), "reach": [], "tau": [], "push": [], "capped": [], "warm_cg": []}

    t = time.perf_counter()
    prod(np.ones(n))
    out["product_s"] = time.perf_counter() - t
    order = rng.permutation(n)
    for m in (205, 2050, 10250, 20500):
        lab = order[:m]
        tau = System(w, prod, deg, comps, lab, np.full(m, .5), .5).tau()
        free = tau > 0
        out["tau"].append({"labelled": m, "max": float(tau.max()), "p99": float(np.quantile(tau[free], .99)),
                           "median": float(np.median(tau[free])), "in_components_without_label": int(n - m - free.sum())})
        print(out["tau"][-1], flush=True)

    exact = None
    tracked = {k: None for k in args.caps}
    for step, batch, lab, vals, fill in simulated_run(rng, rate, args.steps):
        sysm = System(w, prod, deg, comps, lab, vals, fill)
        if step in (1, 10, 50):
            out["reach"].append({"step": step, "within_1_2_3_hops": reach(w, batch)})
        previous = exact
        t = time.perf_counter()
        warm = harmonic_solution(w, lab, vals, fill, comps, x0=previous, rtol=1e-6)
        t_warm = time.perf_counter() - t
        exact = harmonic_solution(w, lab, vals, fill, comps, x0=warm, rtol=1e-11)
        nxt = rng.choice(n, 256, replace=False)
        rows = w[nxt]
        rdeg = np.asarray(rows.sum(1)).ravel()

        def errors(f):
            e = np.abs(f - exact)
            est = np.abs(rows @ (f - exact)) / rdeg
            return {"max": float(e.max()), "mean": float(e.mean()), "next_batch_max": float(est.max()),
                    "next_batch_mean": float(est.mean())}

        if step == 2:
            for tol in args.push_tol:
                t = time.perf_counter()
                f, sweeps, work = sysm.push(previous, tol)
                out["push"].append({"step": 2, "tol": tol, "sweeps": sweeps, "products": work / w.nnz,
                                    "seconds": time.perf_counter() - t, **errors(f)})
                print(out["push"][-1], flush=True)
        for k in args.caps:
            t = time.perf_counter()
            tracked[k] = sysm.capped_cg(exact if tracked[k] is None else tracked[k], k)
            el = time.perf_counter() - t
            if step in REPORT:
                out["capped"].append({"step": step, "products": k, "seconds": el, **errors(tracked[k])})
                print(out["capped"][-1], flush=True)
        if step in REPORT:
            out["warm_cg"].append({"step": step, "labelled": int(lab.size), "seconds": t_warm, **errors(warm)})
            print(out["warm_cg"][-1], flush=True)
    emit(out, args.out)


if __name__ == "__main__":
    main()
