"""The harmonic function of a graph (Zhu, Ghahramani & Lafferty 2003): label propagation's solve.

Shared by the label-propagation peer (``baselines.LabelPropagation``) and graphdiff's propagated estimate
(``belief.harmonic_field``); it lives here so that neither of those modules imports the other.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..errors import InvalidArgumentError
from .graph import row_parallel_matvec, row_sums, single_blas_thread


def harmonic_solution(w: sp.csr_matrix, labeled: np.ndarray, values: np.ndarray, fill: float,
                      components: np.ndarray | None = None, x0: np.ndarray | None = None,
                      rtol: float = 1e-12, w_single: sp.csr_matrix | None = None,
                      degree: np.ndarray | None = None) -> np.ndarray:
    """The harmonic function of Zhu, Ghahramani & Lafferty (2003) on graph W.

    Labeled nodes L keep ``values``; the unlabeled nodes U solve (D_UU - W_UU) f_U = W_UL f_L, i.e. each
    is the W-weighted average of its neighbours. Unlabeled nodes in a connected component with no
    labeled node (isolated nodes included) have no harmonic value and get ``fill``. On the remaining
    nodes D_UU - W_UU is a symmetric, irreducibly diagonally dominant M-matrix per block, hence
    positive definite: it is solved by Jacobi-preconditioned conjugate gradients to relative residual
    ``rtol``, warm-started from ``x0`` (a full-length previous solution) when given. A direct sparse
    factorization is no option here: kNN graphs of embeddings have little locality and fill in badly
    (minutes per solve at N = 7,500). Solved values are clipped to [min, max] of ``values`` (the maximum
    principle), which only removes round-off.

    ``w_single``, W with float32 values (``graph.single_precision``), makes the solve mixed-precision: CG
    runs in float32 first (W's bytes are most of a product's cost: the solve 1.07-1.45x faster on a 150k
    kNN graph, docs/lab/performance.md), then the float64 CG above continues from its result. That CG recomputes
    the residual in float64 before its first iteration and stops at once if it already meets ``rtol``, so the
    solution meets the same float64 criterion either way; float32 only decides where float64 starts. Below
    ``SINGLE_MIN_RTOL`` float32 cannot get near the tolerance and the float32 stage is skipped.
    ``degree``, W's row sums when the caller keeps them (a product with W each solve otherwise).
    """
    from scipy.sparse.csgraph import connected_components
    from scipy.sparse.linalg import cg, spsolve

    n = w.shape[0]
    f = np.full(n, float(fill))
    labeled = np.asarray(labeled, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    f[labeled] = values
    if labeled.size == 0:
        return f
    if components is None:
        components = connected_components(w, directed=False)[1]
    is_lab = np.zeros(n, dtype=bool)
    is_lab[labeled] = True
    comp_has_label = np.zeros(components.max() + 1, dtype=bool)
    comp_has_label[components[labeled]] = True
    solve = np.flatnonzero(~is_lab & comp_has_label[components])
    if solve.size == 0:
        return f
    # (D_UU - W_UU) applied through W itself, masked to U: no sub-matrix is sliced out of W, which at
    # 10^5 prompts cost more than the solve (the estimator solves once per step, warm-started)
    mask = np.zeros(n)
    mask[solve] = 1.0
    degree = row_sums(w) if degree is None else np.asarray(degree, dtype=np.float64)
    boundary = np.zeros(n)
    boundary[labeled] = values
    product = row_parallel_matvec(w)
    rhs = mask * product(boundary)
    inv_deg = np.where(mask > 0, 1.0 / np.where(degree > 0, degree, 1.0), 0.0)
    op, pre = dirichlet_operators(product, mask, degree, inv_deg, np.float64)
    start = None if x0 is None else mask * np.asarray(x0, dtype=np.float64)
    maxiter = 20 * solve.size + 100
    # CG's dot products on one BLAS thread (``single_blas_thread``): vectors this short gain nothing from more
    with single_blas_thread():
        if w_single is not None and rtol >= SINGLE_MIN_RTOL:
            start = _single_precision_start(w_single, mask, degree, inv_deg, rhs, start, rtol, maxiter)
        full, info = cg(op, rhs, x0=start, rtol=rtol, atol=0.0, maxiter=maxiter, M=pre)
    sol = full[solve]
    if info != 0:  # not converged (should not happen for an SPD system): fall back to the exact solve
        w_u = w[solve]
        lap_uu = (sp.diags(degree[solve]) - w_u[:, solve]).tocsc()
        sol = spsolve(lap_uu, w_u[:, labeled] @ values)
    # a harmonic function lies between its boundary values; clip away round-off only
    lo, hi = float(values.min()), float(values.max())
    f[solve] = np.clip(sol, lo, hi)
    return f


# the float32 stage stops here at the latest (a cold solve at 150,000 prompts takes ~110 iterations); the float64
# stage goes on from wherever it stopped
SINGLE_MAXITER = 1000
# below this tolerance float32's rounding (unit roundoff 6e-8) leaves more and more to the float64 stage, and the
# float32 stage is skipped. Cold solves on a 6,000-prompt random kNN graph (k 20, 60 labelled), float32 + float64
# iterations against float64 alone: 1e-5 26 + 0 / 26, 1e-6 29 + 1 / 29, 1e-7 39 + 4 / 32, 1e-9 47 + 19 / 39
SINGLE_MIN_RTOL = 1e-6


def _single_precision_start(w_single: sp.csr_matrix, mask: np.ndarray, degree: np.ndarray, inv_deg: np.ndarray,
                            rhs: np.ndarray, start: np.ndarray | None, rtol: float, maxiter: int) -> np.ndarray | None:
    """The Jacobi-PCG of ``harmonic_solution`` with W, the vectors and the arithmetic in float32, to the same
    relative residual (as float32 computes it): the float64 solve's starting point. A float32 run that breaks
    down (a non-finite iterate) hands back the float64 start unchanged."""
    from scipy.sparse.linalg import cg

    f32 = np.float32
    if w_single.dtype != f32:
        raise InvalidArgumentError(f"w_single must hold float32 values, not {w_single.dtype}")
    op, pre = dirichlet_operators(row_parallel_matvec(w_single), mask, degree, inv_deg, f32)
    x32, _ = cg(op, rhs.astype(f32), x0=None if start is None else start.astype(f32), rtol=rtol, atol=0.0,
                maxiter=min(maxiter, SINGLE_MAXITER), M=pre)
    x = mask * np.asarray(x32, dtype=np.float64)
    return x if np.isfinite(x).all() else start


def dirichlet_operators(product, mask: np.ndarray, degree: np.ndarray, inv_deg: np.ndarray, dtype):
    """L_UU = mask (D - W) mask, applied through ``product`` (x -> W x in ``dtype``), and Jacobi's preconditioner
    (``inv_deg``, 0 off U), as scipy LinearOperators in ``dtype``: the system both stages of the solve run CG on."""
    from scipy.sparse.linalg import LinearOperator

    n = mask.size
    mask, degree, inv_deg = (np.asarray(a, dtype=dtype) for a in (mask, degree, inv_deg))

    def lap(x):
        x = mask * np.asarray(x, dtype=dtype).ravel()
        return mask * (degree * x - product(x))

    def jacobi(x):
        return inv_deg * np.asarray(x, dtype=dtype).ravel()

    return LinearOperator((n, n), matvec=lap, dtype=dtype), LinearOperator((n, n), matvec=jacobi, dtype=dtype)
