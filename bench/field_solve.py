#!/usr/bin/env python3
"""Label propagation's field: the product's solve along a simulated run, in two measurements.

On a graph artifact (e.g. the 150,000-prompt mutual-kNN graph that `bench/extend.py cost --n 150000 --add 1000
--dim 384 --k-nn 80 --states 320 --work W` leaves in W/old_g.zarr, W/old_c.zarr), a run of --steps steps is
simulated: each step 205 new prompts and 51 seen ones (batch 256) get 8 rollouts at a per-cluster rate (Beta(2,2)
plus N(0, 0.1) per prompt), and the field is solved each step, warm-started from its own previous field. Errors
are against a float64 solve to 1e-11.

  precision  Jacobi-preconditioned CG on L_UU to relative residual 1e-6 four ways: CG alone on the step's system
             (set up once, outside the timing) in float64 and with W, the vectors and CG's arithmetic in float32
             (scipy's ``cg`` works in the operator's dtype); ``harmonic_solution`` float64 only (the product's
             solve before the mixed-precision one), set-up included; ``harmonic_solution`` as the product calls it
             (``w_single``: float32 CG, then float64 CG from its result to the same tolerance in float64). Reported
             at some steps: CG iterations (mixed: float32, then float64), seconds, the field's largest error.
  tolerance  the product's solve at relative residuals 1e-6, 1e-5 and 1e-4. Reported at some steps: CG iterations
             (float32, then float64), seconds, and the error of the field (max and mean over prompts) and of the
             next batch's propagated estimate (the W-weighted mean of its neighbours' field values, what p-hat
             reads).
  schedule   the field solved only at every m-th step (m 2, 4, 8; ``propagation_every``), warm-started, and between
             solves the last solution with the step's prompts clamped to their rates (``sources.propagation.clamped``),
             against the field solved at every step (the product's tolerance): the next batch's propagated estimate's
             error (max, mean) and the solve's seconds per step.

    .venv/bin/python bench/field_solve.py precision W/old_g.zarr W/old_c.zarr [--steps 100] [--out precision.json]
    .venv/bin/python bench/field_solve.py tolerance W/old_g.zarr W/old_c.zarr [--steps 100] [--out tolerance.json]
    .venv/bin/python bench/field_solve.py schedule W/old_g.zarr W/old_c.zarr [--steps 100] [--out schedule.json]

Results: docs/lab/performance.md, "The field's solve in mixed precision: built" and "The field's tolerance".
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components
from scipy.sparse.linalg import LinearOperator, cg
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import emit, read_artifacts  # noqa: E402
from graphdiff_cli.core.graph import row_parallel_matvec, single_precision  # noqa: E402
from graphdiff_cli.core.harmonic import dirichlet_operators, harmonic_solution  # noqa: E402

REPORT = (1, 2, 5, 10, 20, 50, 100)
TOLERANCES = (1e-6, 1e-5, 1e-4)
EVERY = (2, 4, 8)


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


def load(graph: Path, clusters: Path):
    """labels, W (float64 CSR), degrees, connected components and the product with W of graph and clusters
    artifacts."""
    _ids, labels, w = read_artifacts(graph, clusters)
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


def precision(args) -> None:
    """float64, float32 and the product's solves along the run."""

    labels, w, deg, comps, prod = load(Path(args.graph), Path(args.clusters))
    n = w.shape[0]
    w_single = single_precision(w)
    prod32 = row_parallel_matvec(w_single)
    rng = np.random.default_rng(0)
    rate = simulated_rates(rng, labels)
    out = {"date": str(date.today()), "machine": platform.platform(), "n": n, "nnz": int(w.nnz), "steps": []}

    def solve(sysm, x0, dtype):
        """The product's warm-started Jacobi-PCG to 1e-6: as it is (float64), or with W, the vectors and CG's
        arithmetic in float32."""
        if dtype == np.float64:
            op, pre = LinearOperator((n, n), sysm.lap, dtype=dtype), LinearOperator((n, n), sysm.jacobi(), dtype=dtype)
        else:  # the product's float32 operators (core.harmonic) on this step's system
            op, pre = dirichlet_operators(prod32, sysm.mask, deg, sysm.jacobi()(np.ones(n)), dtype)
        x, iters, seconds, info = counted_cg(op, sysm.rhs.astype(dtype),
                                             None if x0 is None else (sysm.mask * x0).astype(dtype), pre)
        return sysm.field(x.astype(np.float64)), {"iterations": iters, "solve_s": round(seconds, 3), "info": info}

    prev = {"float64": None, "float32": None, "product_float64": None, "product_mixed": None}
    for step, _batch, lab, vals, fill in simulated_run(rng, rate, args.steps):
        sysm = System(w, prod, deg, comps, lab, vals, fill)
        rows = {}
        for name in prev:
            if name.startswith("product"):
                prev[name], rows[name] = product_solve(w, lab, vals, fill, comps, prev[name], 1e-6,
                                                       w_single if name.endswith("mixed") else None)
                continue
            prev[name], rows[name] = solve(sysm, prev[name], np.float32 if name == "float32" else np.float64)
        if step in REPORT:
            exact = harmonic_solution(w, lab, vals, fill, comps, x0=prev["float64"], rtol=1e-11)
            for name in rows:
                rows[name]["max_error"] = float(np.abs(prev[name] - exact).max())
            out["steps"].append({"step": step, "labelled": int(lab.size), **rows})
            print(out["steps"][-1], flush=True)
    emit(out, args.out)


def tolerance(args) -> None:
    """The product's solve at three tolerances along the run."""

    labels, w, _deg, comps, _prod = load(Path(args.graph), Path(args.clusters))
    w_single = single_precision(w)
    rng = np.random.default_rng(0)
    rate = simulated_rates(rng, labels)
    out = {"date": str(date.today()), "machine": platform.platform(), "n": w.shape[0], "nnz": int(w.nnz), "steps": []}

    run = list(simulated_run(rng, rate, args.steps + 1))
    prev = dict.fromkeys(TOLERANCES)
    for (step, _batch, lab, vals, fill), (_, next_batch, *_rest) in zip(run[:-1], run[1:]):
        rows = {}
        for rtol in TOLERANCES:
            prev[rtol], rows[rtol] = product_solve(w, lab, vals, fill, comps, prev[rtol], rtol, w_single)
        if step not in REPORT:
            continue
        exact = harmonic_solution(w, lab, vals, fill, comps, x0=prev[1e-6], rtol=1e-11)
        w_next = w[next_batch]
        deg_next = np.asarray(w_next.sum(axis=1)).ravel()
        deg_next[deg_next == 0] = 1.0
        propagated = w_next @ exact / deg_next
        for rtol, row in rows.items():
            err = np.abs(prev[rtol] - exact)
            row.update(field_max_error=float(err.max()), field_mean_error=float(err.mean()),
                       next_batch_max_error=float(np.abs(w_next @ prev[rtol] / deg_next - propagated).max()))
        out["steps"].append({"step": step, "labelled": int(lab.size), **{f"rtol {r:g}": v for r, v in rows.items()}})
        print(out["steps"][-1], flush=True)
    emit(out, args.out)


def schedule(args) -> None:
    """The field solved at every m-th step only (``propagation_every``), against the field solved at every step."""
    from graphdiff_cli.core.belief import FIELD_RTOL

    labels, w, _deg, comps, _prod = load(Path(args.graph), Path(args.clusters))
    n = w.shape[0]
    w_single = single_precision(w)
    rng = np.random.default_rng(0)
    rate = simulated_rates(rng, labels)
    out = {"date": str(date.today()), "machine": platform.platform(), "n": n, "nnz": int(w.nnz), "rtol": FIELD_RTOL,
           "every": list(EVERY), "steps": []}
    run = list(simulated_run(rng, rate, args.steps + 1))
    every_step, fields = None, dict.fromkeys(EVERY)
    totals = {m: {"solve_s": 0.0, "solves": 0} for m in (1, *EVERY)}
    errors = {m: [] for m in EVERY}
    for (step, batch, lab, vals, fill), (_, next_batch, *_rest) in zip(run[:-1], run[1:]):
        rates = np.zeros(n)
        rates[lab] = vals
        every_step, row = product_solve(w, lab, vals, fill, comps, every_step, FIELD_RTOL, w_single)
        totals[1]["solve_s"] += row["solve_s"]
        totals[1]["solves"] += 1
        w_next = w[next_batch]
        deg_next = np.asarray(w_next.sum(axis=1)).ravel()
        deg_next[deg_next == 0] = 1.0
        reference = w_next @ every_step / deg_next
        rows = {}
        for m in EVERY:
            if fields[m] is None or step % m == 0:
                fields[m], r = product_solve(w, lab, vals, fill, comps, fields[m], FIELD_RTOL, w_single)
                totals[m]["solve_s"] += r["solve_s"]
                totals[m]["solves"] += 1
            else:  # the step's prompts clamped to their rates (``sources.propagation.clamped``)
                fields[m] = fields[m].copy()
                fields[m][batch] = rates[batch]
            err = np.abs(w_next @ fields[m] / deg_next - reference)
            errors[m].append((float(err.max()), float(err.mean())))
            rows[f"every {m}"] = {"next_batch_max_error": float(err.max()), "next_batch_mean_error": float(err.mean()),
                                  "field_max_error": float(np.abs(fields[m] - every_step).max())}
        if step in REPORT:
            out["steps"].append({"step": step, "labelled": int(lab.size), "every_step_solve_s": row["solve_s"], **rows})
            print(out["steps"][-1], flush=True)
    out["summary"] = {f"every {m}": {"solve_s_per_step": totals[m]["solve_s"] / args.steps,
                                     "solves": totals[m]["solves"],
                                     "next_batch_max_error": max(e[0] for e in errors.get(m, [(0, 0)])),
                                     "next_batch_mean_error_mean": float(np.mean([e[1] for e in errors.get(m, [(0, 0)])]))}
                      for m in (1, *EVERY)}
    print(out["summary"], flush=True)
    emit(out, args.out)


def main() -> None:
    ap = argparse.ArgumentParser(description="label propagation's field: the product's solve along a simulated run")
    sub = ap.add_subparsers(dest="measure", required=True)
    for name, text in (("precision", "float64, float32 and the product's mixed-precision solve"),
                       ("tolerance", "the product's solve at relative residuals 1e-6, 1e-5, 1e-4"),
                       ("schedule", "the field solved at every m-th step only, against every step")):
        p = sub.add_parser(name, help=text)
        p.add_argument("graph")
        p.add_argument("clusters")
        p.add_argument("--steps", type=int, default=100)
        p.add_argument("--out", default=None)
    args = ap.parse_args()
    {"precision": precision, "tolerance": tolerance, "schedule": schedule}[args.measure](args)


if __name__ == "__main__":
    main()
