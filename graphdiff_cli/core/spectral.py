"""Spectral clustering of W into K latent difficulty states (Section 3.4, "Graph Prior").

Ng-Jordan-Weiss: the top eigenvectors of the normalized affinity D^{-1/2} W D^{-1/2}, rows normalized
to unit length, then seeded k-means (k-means++ initialization, several restarts, best inertia kept).

Disconnected graphs are handled on purpose rather than left to the eigensolver. A mutual-kNN graph
routinely has several components and some isolated prompts, and the normalized affinity of such a
graph has one eigenvalue 1 per component, so a global eigen-decomposition spends states on tiny
components and leaves isolated nodes with an undefined (all-zero) spectral row. Instead:

1. States are shared out between connected components in proportion to their size (largest remainder).
2. A component that receives >= 2 states is clustered spectrally on its own; one that receives exactly
   one state is a cluster as it stands.
3. Components too small to earn a state (K * size / N < 1/2, which includes every isolated node) are
   "orphans". With ``fallback_neighbors`` (the directed kNN lists from before the mutual filter) each
   orphan takes the label of its most similar non-orphan neighbour, so it starts in the state of the
   prompts it most resembles; without them, or when none of its neighbours is placed, orphans share
   one pooled state. Either way every label is in [0, K) and every state is non-empty when N >= K.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import scipy.sparse as sp

from ..errors import InvalidArgumentError

DENSE_EIGEN_MAX = 2000  # below this many nodes a dense eigh is faster and more robust than ARPACK
EIGEN_SOLVERS = ("arpack", "lobpcg")
LOBPCG_TOL = 1e-4  # LOBPCG stops when every returned pair has ||L v - mu v|| <= this (unit v)
LOBPCG_MAXITER = 200
AMG_SHIFT = 1e-5  # the preconditioner is built from L + AMG_SHIFT I: L itself is singular (scikit-learn's shift)


def kmeans(x: np.ndarray, k: int, seed: int = 0, n_init: int = 4, max_iter: int = 100) -> np.ndarray:
    """Lloyd's k-means with k-means++ seeding; returns labels in [0, k), every cluster non-empty.

    An empty cluster is re-seeded with the point farthest from its centre, so exactly k clusters come
    back whenever x has at least k distinct rows.
    """
    rng = np.random.default_rng(seed)
    n = x.shape[0]
    if k >= n:
        return np.arange(n) % k
    best_labels, best_inertia = None, np.inf
    sq = np.einsum("ij,ij->i", x, x)
    for _ in range(n_init):
        centers = kmeanspp(x, sq, k, rng)
        labels = np.zeros(n, dtype=np.int64)
        for it in range(max_iter):
            d = sq[:, None] - 2 * x @ centers.T + np.einsum("ij,ij->i", centers, centers)[None, :]
            new = np.argmin(d, axis=1)
            dist = d[np.arange(n), new]
            counts = np.bincount(new, minlength=k)
            for empty in np.flatnonzero(counts == 0):
                far = int(np.argmax(dist))
                new[far] = empty
                dist[far] = -np.inf
            if it > 0 and np.array_equal(new, labels):
                break
            labels = new
            centers = np.zeros_like(centers)
            np.add.at(centers, labels, x)
            centers /= np.bincount(labels, minlength=k)[:, None]
        inertia = float(np.sum((x - centers[labels]) ** 2))
        if inertia < best_inertia:
            best_inertia, best_labels = inertia, labels.copy()
    return best_labels


def inertia(x: np.ndarray, labels: np.ndarray) -> float:
    """The k-means objective of a partition: summed squared distance of each row to its cluster's mean."""
    k = int(labels.max()) + 1 if labels.size else 0
    counts = np.bincount(labels, minlength=k).astype(np.float64)
    sums = np.zeros((k, x.shape[1]))
    np.add.at(sums, labels, x)
    # sum |x|^2 - sum_c |S_c|^2 / n_c, the mean's identity
    return float(np.einsum("ij,ij->", x, x) - np.sum(np.einsum("ij,ij->i", sums, sums)[counts > 0] / counts[counts > 0]))


def kmeanspp(x, sq, k, rng):
    """k-means++ seeding: k rows of x, each drawn with probability proportional to its squared distance to the
    nearest row drawn so far (``sq``: the rows' squared norms)."""
    n = x.shape[0]
    centers = np.empty((k, x.shape[1]), dtype=x.dtype)
    centers[0] = x[rng.integers(n)]
    d2 = np.maximum(sq - 2 * x @ centers[0] + centers[0] @ centers[0], 0)
    for c in range(1, k):
        total = d2.sum()
        idx = rng.choice(n, p=d2 / total) if total > 0 else rng.integers(n)
        centers[c] = x[idx]
        d2 = np.minimum(d2, np.maximum(sq - 2 * x @ centers[c] + centers[c] @ centers[c], 0))
    return centers


def normalized_affinity(w: sp.csr_matrix) -> tuple[sp.csr_matrix, np.ndarray]:
    """M = D^{-1/2} W D^{-1/2} and D^{1/2} 1 (the top eigenvector of a connected graph's M)."""
    sqrt_deg = np.sqrt(np.asarray(w.sum(axis=1)).ravel())
    dinv = 1.0 / sqrt_deg
    return sp.csr_matrix(sp.diags(dinv) @ w @ sp.diags(dinv)), sqrt_deg


def eigen_residual(m: sp.spmatrix, vals: np.ndarray, vecs: np.ndarray) -> float:
    """max_i ||M v_i - lambda_i v_i|| over the unit columns v_i of ``vecs`` (one sparse product)."""
    return float(np.max(np.linalg.norm(m @ vecs - vecs * vals[None, :], axis=0))) if vals.size else 0.0


def leading_eigenpairs(m: sp.csr_matrix, dim: int, seed: int = 0, eigen_solver: str = "arpack",
                       preconditioner: Callable | None = None, sqrt_deg: np.ndarray | None = None):
    """The ``dim`` largest eigenvalues of the normalized affinity ``m`` (descending) and their unit eigenvectors,
    with the name of the solver that ran: "dense" (eigh, below DENSE_EIGEN_MAX nodes, whatever was asked),
    "arpack" or "lobpcg". ``preconditioner(a)`` maps the shifted Laplacian a to a LinearOperator (LOBPCG only)."""
    n = m.shape[0]
    if eigen_solver not in EIGEN_SOLVERS:
        raise InvalidArgumentError(f"eigen_solver must be one of {', '.join(EIGEN_SOLVERS)}, got {eigen_solver!r}")
    if n <= DENSE_EIGEN_MAX or dim >= n - 1:
        vals, vecs = np.linalg.eigh(m.toarray())
        top = np.argsort(vals)[::-1][:dim]
        return vals[top], vecs[:, top], "dense"
    if eigen_solver == "arpack":
        from scipy.sparse.linalg import eigsh

        # Shift by +I so the wanted eigenvalues (largest, near 1) are also the largest in magnitude,
        # which is what ARPACK finds fastest; the shift leaves eigenvectors unchanged.
        v0 = np.random.default_rng(seed).standard_normal(n)
        vals, vecs = eigsh(m + sp.identity(n), k=dim, which="LA", v0=v0, tol=1e-6)
        order = np.argsort(vals)[::-1]
        return vals[order] - 1.0, vecs[:, order], "arpack"
    import warnings

    from scipy.sparse.linalg import lobpcg

    lap = sp.csr_matrix(sp.identity(n) - m)
    prec = None
    if preconditioner is not None:
        prec = preconditioner(sp.csr_matrix(lap + AMG_SHIFT * sp.identity(n)))
    x0 = np.random.default_rng(seed).standard_normal((n, dim))
    x0[:, 0] = sqrt_deg if sqrt_deg is not None else 1.0  # the exact first eigenvector of a connected graph
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "not converged": the residual is returned and stamped
        mu, vecs = lobpcg(lap, x0, M=prec, tol=LOBPCG_TOL, maxiter=LOBPCG_MAXITER, largest=False)
    vecs = vecs / np.linalg.norm(vecs, axis=0, keepdims=True)
    order = np.argsort(mu)
    return 1.0 - mu[order], vecs[:, order], "lobpcg"


def unit_rows(vecs: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    return vecs / np.where(norms == 0, 1.0, norms)


def spectral_embedding(w: sp.csr_matrix, dim: int, seed: int = 0) -> np.ndarray:
    """Top-``dim`` eigenvectors of D^{-1/2} W D^{-1/2} for a connected graph (ARPACK), rows unit-normalized."""
    m, _ = normalized_affinity(w)
    return unit_rows(leading_eigenpairs(m, dim, seed=seed)[1])


def allocate_states(sizes: np.ndarray, n_states: int) -> np.ndarray:
    """Share n_states between components in proportion to size (largest remainder, ties by size)."""
    total = sizes.sum()
    quota = n_states * sizes / total
    alloc = np.floor(quota).astype(np.int64)
    remainder = n_states - alloc.sum()
    order = np.lexsort((-sizes, -(quota - alloc)))
    alloc[order[:remainder]] += 1
    return np.minimum(alloc, sizes)  # a component cannot use more states than it has nodes


@dataclass
class SpectralStates:
    """What ``spectral_states`` returns: the labels and how they were obtained. ``solvers`` counts the
    components clustered spectrally by the solver that ran ("dense", "arpack", "lobpcg");
    ``eigen_residual`` is the largest max_i ||M v_i - lambda_i v_i|| over them and ``inertia`` the summed
    k-means objective of their embeddings (both 0.0 when no component needed an eigen-decomposition)."""
    labels: np.ndarray
    solvers: dict
    eigen_residual: float
    inertia: float


def spectral_clustering(w: sp.csr_matrix, n_states: int, seed: int = 0,
                        fallback_neighbors: np.ndarray | None = None, progress=None, **how) -> np.ndarray:
    """Static cluster labels c_i in [0, K) of W (see the module docstring for components/orphans); ``how``
    as in ``spectral_states``."""
    return spectral_states(w, n_states, seed=seed, fallback_neighbors=fallback_neighbors, progress=progress,
                           **how).labels


def spectral_states(w: sp.csr_matrix, n_states: int, seed: int = 0, fallback_neighbors: np.ndarray | None = None,
                    progress=None, eigen_solver: str = "arpack", preconditioner: Callable | None = None,
                    assign: Callable | None = None) -> SpectralStates:
    """Static cluster labels c_i in [0, K) of W with the solver used, the eigen-residual and the k-means inertia.
    ``progress(done, n)``, when given, is called with the prompts placed so far, once per component.
    ``eigen_solver``: "arpack" (the paper's) or "lobpcg" (with ``preconditioner``, see ``leading_eigenpairs``);
    ``assign(x, k, seed)``: the k-means step (labels in [0, k), every cluster non-empty), ``kmeans`` when None."""
    from scipy.sparse.csgraph import connected_components

    n = w.shape[0]
    if n_states < 1:
        raise InvalidArgumentError(f"the number of states K must be >= 1, got {n_states}")
    if n_states > n:
        raise InvalidArgumentError(
            f"K = {n_states} states is more than the {n} prompts in the graph; choose K <= {n}")
    if eigen_solver not in EIGEN_SOLVERS:
        raise InvalidArgumentError(f"eigen_solver must be one of {', '.join(EIGEN_SOLVERS)}, got {eigen_solver!r}")
    assign = assign or kmeans
    w = sp.csr_matrix(w, dtype=np.float64)
    n_comp, comp = connected_components(w, directed=False)
    sizes = np.bincount(comp, minlength=n_comp)
    alloc = allocate_states(sizes, n_states)
    if _needs_pool(comp, alloc, fallback_neighbors) and alloc.sum() >= n_states:
        # keep one state free for orphans that cannot be attached to a neighbour: take it from the
        # component with the most states (it loses the least resolution)
        alloc[np.argmax(alloc)] -= 1
    labels = np.full(n, -1, dtype=np.int64)
    next_label, placed = 0, 0
    solvers, residual, total_inertia = {}, 0.0, 0.0
    if progress:
        progress(0, n)
    for c in np.flatnonzero(alloc > 0):
        nodes = np.flatnonzero(comp == c)
        kc = int(alloc[c])
        if kc == 1:
            labels[nodes] = next_label
        else:
            m, sqrt_deg = normalized_affinity(w[nodes][:, nodes])
            vals, vecs, used = leading_eigenpairs(m, kc, seed=seed, eigen_solver=eigen_solver,
                                                  preconditioner=preconditioner, sqrt_deg=sqrt_deg)
            solvers[used] = solvers.get(used, 0) + 1
            residual = max(residual, eigen_residual(m, vals, vecs))
            emb = unit_rows(vecs)
            part = np.asarray(assign(emb, kc, seed), dtype=np.int64)
            total_inertia += inertia(emb, part)
            labels[nodes] = next_label + part
        next_label += kc
        placed += nodes.size
        if progress:
            progress(placed, n)
    orphans = np.flatnonzero(labels < 0)
    if orphans.size:
        if fallback_neighbors is not None:
            labels = _attach_orphans(labels, orphans, np.asarray(fallback_neighbors))
        still = labels < 0
        if still.any():
            labels[still] = next_label
            next_label += 1
        if progress:
            progress(n, n)
    # If every orphan found a placed neighbour, the state kept free for them stays empty. Empty states
    # are legal: no prompt's prior favours them and their Beta stays at the prior.
    return SpectralStates(labels, solvers, residual, total_inertia)


def _needs_pool(comp: np.ndarray, alloc: np.ndarray, neighbors: np.ndarray | None) -> bool:
    """Whether some orphan will find no placed neighbour, so a pooled state must be kept free for it."""
    orphan = alloc[comp] == 0
    if not orphan.any():
        return False
    if neighbors is None:
        return True
    nb = np.asarray(neighbors)[orphan]
    placed = (nb >= 0) & (alloc[comp[np.clip(nb, 0, None)]] > 0)
    return not bool(placed.any(axis=1).all())


def _attach_orphans(labels: np.ndarray, orphans: np.ndarray, neighbors: np.ndarray) -> np.ndarray:
    placed = labels  # only nodes placed by the spectral step count, so the result is order-free
    out = labels.copy()
    for i in orphans:
        for j in neighbors[i]:
            if 0 <= j < placed.size and placed[j] >= 0:
                out[i] = placed[j]
                break
    return out


def label_new_nodes(w: sp.csr_matrix, labels_old: np.ndarray, neighbors: np.ndarray,
                    similarities: np.ndarray, n_states: int) -> np.ndarray:
    """Prior states of prompts appended to a clustered graph (``graphdiff extend``), without re-clustering.

    Node i >= len(labels_old) takes the state with the largest summed similarity among its mutual
    neighbours in W that already have one; a node with none takes it from its directed kNN list (the
    clustering's orphan rule); nodes whose neighbours are all new are placed in later passes from those
    just placed; what is left (no placed prompt anywhere in reach) joins the most common state.
    Returns labels for all nodes (the old ones unchanged).
    """
    n_old = labels_old.size
    n = w.shape[0]
    labels = np.concatenate([np.asarray(labels_old, dtype=np.int64), np.full(n - n_old, -1, np.int64)])
    w = sp.csr_matrix(w)
    todo = np.arange(n_old, n)
    while todo.size:
        placed = np.zeros(todo.size, bool)
        for source in ("graph", "lists"):
            for j, i in enumerate(todo):
                if placed[j]:
                    continue
                if source == "graph":
                    nb, c = w.indices[w.indptr[i]:w.indptr[i + 1]], w.data[w.indptr[i]:w.indptr[i + 1]]
                else:
                    nb, c = neighbors[i], similarities[i]
                    c = c[nb >= 0]
                    nb = nb[nb >= 0]
                ok = labels[nb] >= 0
                if ok.any():
                    votes = np.bincount(labels[nb[ok]], weights=np.maximum(c[ok], 1e-12), minlength=n_states)
                    labels[i] = int(np.argmax(votes))
                    placed[j] = True
        if not placed.any():
            labels[todo] = int(np.argmax(np.bincount(labels_old, minlength=n_states))) if n_old else 0
            break
        todo = todo[~placed]
    return labels
