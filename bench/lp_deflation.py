#!/usr/bin/env python3
"""Issue 32, item 2's direction, an experiment (not a product option): does deflating the slow modes cut the
conjugate-gradient products of label propagation's solve? On a graph artifact (e.g. the 150,000-prompt kNN graph
that `bench/extend.py cost --n 150000 --add 1000 --dim 384 --k-nn 80 --states 320 --work W` leaves in
W/old_g.zarr, W/old_c.zarr): 2,000 prompts labelled with noisy per-cluster rates, the field solved cold; then the
m smallest eigenvectors of the Jacobi-scaled Dirichlet Laplacian (LOBPCG, loosely) kept as a deflation space Z,
and three steps of 256 new labels each, solved warm from the previous field by Jacobi-PCG (what the product
does) and by deflated PCG with that Z (Frank & Vuik: P = I - A Z (Z^T A Z)^-1 Z^T), both to relative residual
1e-6. (Components without a label are singular blocks where the two may differ; the product fills them.)

    .venv/bin/python bench/lp_deflation.py W/old_g.zarr W/old_c.zarr
"""
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator, cg, lobpcg
from threadpoolctl import threadpool_limits

from handoff_roundtrip import read_inputs  # bench/ is on sys.path when a script runs
from graphdiff_cli.core.graph import row_parallel_matvec


def main() -> None:
    _ids, labels, w = read_inputs(Path(sys.argv[1]), Path(sys.argv[2]))
    w = sp.csr_matrix(w, dtype=np.float64)
    n = w.shape[0]
    deg = np.asarray(w.sum(1)).ravel()
    prod = row_parallel_matvec(w)
    rng = np.random.default_rng(0)
    rate = rng.beta(2, 2, labels.max() + 1)[labels]

    def system(lab):
        """(mask of the unlabelled prompts, right-hand side) with these prompts labelled."""
        mask = np.ones(n)
        mask[lab] = 0
        bnd = np.zeros(n)
        bnd[lab] = np.clip(rate[lab] + rng.normal(0, .1, lab.size), 0, 1)
        return mask, mask * prod(bnd)

    def lap(mask):
        return lambda x: mask * (deg * (mask * x) - prod(mask * x))

    def solve(mask, b, x0, z=None, rtol=1e-6):
        """(field, products, seconds, relative residual) by Jacobi-PCG, deflated by z when given."""
        a = lap(mask)
        inv = np.where(mask > 0, 1 / np.maximum(deg, 1e-300), 0)
        k = [0]
        if z is not None:
            az = np.stack([a(c) for c in z.T], 1)
            e = z.T @ az
            bb = b - az @ np.linalg.solve(e, z.T @ b)
        else:
            bb = b

        def op(v):
            k[0] += 1
            av = a(v)
            return av if z is None else av - az @ np.linalg.solve(e, az.T @ v)

        t = time.perf_counter()
        with threadpool_limits(1, "blas"):
            xh, _ = cg(LinearOperator((n, n), op), bb, x0=mask * x0, atol=0.0, maxiter=5000,
                       rtol=rtol * np.linalg.norm(b) / max(np.linalg.norm(bb), 1e-300),
                       M=LinearOperator((n, n), lambda v: inv * v))
        x = xh if z is None else z @ np.linalg.solve(e, z.T @ b) + xh - z @ np.linalg.solve(e, az.T @ xh)
        return x, k[0], time.perf_counter() - t, np.linalg.norm(b - a(x)) / np.linalg.norm(b)

    lab = rng.choice(n, 2000, replace=False)
    mask, b = system(lab)
    x, its, el, res = solve(mask, b, np.zeros(n))
    print(f"cold solve: {its} products, {el:.2f} s, relative residual {res:.1e}", flush=True)
    for m in (16, 48):
        t = time.perf_counter()
        a = lap(mask)
        dh = np.where(mask > 0, 1 / np.sqrt(np.maximum(deg, 1e-300)), 0)
        scaled = LinearOperator((n, n), matvec=lambda v: dh * a(dh * np.asarray(v).ravel()),
                                matmat=lambda v: np.stack([dh * a(dh * v[:, j]) for j in range(v.shape[1])], 1),
                                dtype=np.float64)
        vals, vecs = lobpcg(scaled, rng.standard_normal((n, m)) * mask[:, None], largest=False, maxiter=60, tol=1e-3)
        z = dh[:, None] * vecs
        print(f"m {m}: LOBPCG {time.perf_counter() - t:.1f} s, smallest eigenvalues {np.sort(vals)[:3]}", flush=True)
        xp, labs = x.copy(), lab.copy()
        for step in range(3):  # 256 new labels a step, warm from the previous field, the same z kept
            labs = np.union1d(labs, rng.choice(n, 256, replace=False))
            mk, bk = system(labs)
            x1, i1, e1, r1 = solve(mk, bk, xp)
            _x2, i2, e2, r2 = solve(mk, bk, xp, z * mk[:, None])
            print(f"  step {step}: Jacobi-PCG {i1} products {e1:.2f} s (residual {r1:.1e}) | deflated {i2} products "
                  f"{e2:.2f} s (residual {r2:.1e})", flush=True)
            xp = x1


if __name__ == "__main__":
    main()
