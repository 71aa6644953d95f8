"""Optional accelerations of ``graphdiff cluster`` (``core.spectral.spectral_states`` takes them as callables).

- ``amg_preconditioner``: pyamg's smoothed-aggregation multigrid as LOBPCG's preconditioner, as scikit-learn's
  ``spectral_embedding(eigen_solver="amg")`` builds it (the ``amg`` extra; ``amg_available`` says whether
  pyamg imports).
- ``faiss_kmeans``: faiss's Lloyd iterations (float32) from the core's k-means++ seeding, ``FAISS_KMEANS_NREDO``
  restarts, the best objective kept, in place of the core's numpy Lloyd (faiss is a dependency already: the kNN
  search). faiss's own random seeding merges clear clusters where k-means++ does not.
"""

from __future__ import annotations

import numpy as np

FAISS_KMEANS_NITER, FAISS_KMEANS_NREDO = 25, 4


def amg_available() -> bool:
    """Whether pyamg imports (the ``amg`` extra)."""
    try:
        import pyamg  # noqa: F401
    except ImportError:
        return False
    return True


def amg_preconditioner(a):
    """A LinearOperator approximating a^{-1}: one V-cycle of pyamg's smoothed-aggregation solver of ``a``
    (a symmetric positive definite CSR matrix: the shifted Laplacian)."""
    from pyamg import smoothed_aggregation_solver

    return smoothed_aggregation_solver(a).aspreconditioner()


def faiss_kmeans(x: np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    """Labels in [0, k) of faiss's k-means on the rows of ``x``, every cluster non-empty when x has >= k rows
    (an empty one takes the row farthest from its centre, as ``core.spectral.kmeans`` does)."""
    import faiss

    from ..core.spectral import kmeanspp

    n = x.shape[0]
    if k >= n:
        return np.arange(n) % k
    rng = np.random.default_rng(seed)
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    sq = np.einsum("ij,ij->i", x32, x32)
    best, best_obj = None, np.inf
    for r in range(FAISS_KMEANS_NREDO):
        km = faiss.Kmeans(x32.shape[1], k, niter=FAISS_KMEANS_NITER, seed=int(seed) + r, verbose=False,
                          max_points_per_centroid=max(256, -(-n // k)))  # every row, no subsample
        km.train(x32, init_centroids=kmeanspp(x32, sq, k, rng))
        if km.obj[-1] < best_obj:
            best, best_obj = km, km.obj[-1]
    dist, lab = best.index.search(x32, 1)
    labels, dist = lab[:, 0].astype(np.int64), dist[:, 0].astype(np.float64)
    counts = np.bincount(labels, minlength=k)
    for empty in np.flatnonzero(counts == 0):
        far = int(np.argmax(dist))
        labels[far] = empty
        dist[far] = -np.inf
    return labels
