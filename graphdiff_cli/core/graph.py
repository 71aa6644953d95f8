"""The difficulty-aware sample graph of Section 3.3.

W_ij = c_ij if x_i and x_j are mutual k-nearest neighbours and c_ij > 0, else 0, where
c_ij = phi_i . phi_j is the cosine similarity of L2-normalized embeddings. W is symmetric with a zero
diagonal and is returned as a SciPy CSR matrix.

The neighbour search itself (faiss, CPU or GPU) lives in ``graphdiff_cli.backends.knn``; this module
turns its output into W and checks graphs handed to the estimator, so it stays pure numpy/scipy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..errors import DataError, InvalidArgumentError


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """phi_i = phi~_i / ||phi~_i||_2 (float32). A zero row is refused: it has no direction."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise InvalidArgumentError(f"embeddings must be a 2-D array, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise DataError("embeddings contain NaN or infinite values")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    zero = np.flatnonzero(norms[:, 0] == 0)
    if zero.size:
        raise DataError(f"embedding row {int(zero[0])} is all zeros and has no cosine similarity")
    return x / norms


def truncate_matryoshka(x: np.ndarray, dim: int | None) -> np.ndarray:
    """Keep the first ``dim`` coordinates and renormalize (Matryoshka truncation, Appendix E)."""
    if dim is None or dim >= x.shape[1]:
        return normalize_rows(x)
    if dim < 1:
        raise InvalidArgumentError(f"--dim must be >= 1, got {dim}")
    return normalize_rows(np.ascontiguousarray(x[:, :dim]))


def exact_knn(embeddings: np.ndarray, k: int, block: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force cosine kNN in numpy (the reference the faiss backend is tested against).

    Returns (neighbors, similarities), each N x k, self excluded, most similar first.
    """
    x = normalize_rows(embeddings)
    n = x.shape[0]
    k = min(k, n - 1)
    nbr = np.empty((n, k), dtype=np.int64)
    sim = np.empty((n, k), dtype=np.float32)
    for start in range(0, n, block):
        stop = min(n, start + block)
        c = x[start:stop] @ x.T
        c[np.arange(stop - start), np.arange(start, stop)] = -np.inf
        part = np.argpartition(-c, k - 1, axis=1)[:, :k] if k < n else np.argsort(-c, axis=1)[:, :k]
        vals = np.take_along_axis(c, part, axis=1)
        order = np.argsort(-vals, axis=1, kind="stable")
        nbr[start:stop] = np.take_along_axis(part, order, axis=1)
        sim[start:stop] = np.take_along_axis(vals, order, axis=1)
    return nbr, sim


def drop_self(neighbors: np.ndarray, similarities: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Remove each row's own index from a (k+1)-neighbour search result and keep k neighbours.

    A search with the query set equal to the base set normally returns the point itself first, but not
    always (exact duplicates tie with it), so self is removed wherever it appears.
    """
    n = neighbors.shape[0]
    rows = np.arange(n)[:, None]
    keep = (neighbors != rows) & (neighbors >= 0)
    # stable: keeps the search order (most similar first) among the remaining entries
    order = np.argsort(~keep, axis=1, kind="stable")[:, :k]
    nbr = np.take_along_axis(neighbors, order, axis=1)
    simv = np.take_along_axis(similarities, order, axis=1)
    valid = np.take_along_axis(keep, order, axis=1)
    nbr = np.where(valid, nbr, -1)
    return nbr, simv


def mutual_knn_graph(neighbors: np.ndarray, similarities: np.ndarray) -> sp.csr_matrix:
    """Build W from directed kNN lists: keep edge (i, j) iff j in N_k(i), i in N_k(j) and c_ij > 0.

    ``neighbors`` is N x k (entries -1 are padding), ``similarities`` the matching cosine values.
    The two directed copies of an edge carry the same c_ij up to float rounding; W takes their mean so
    it is exactly symmetric. Returns CSR float32 with sorted indices and no explicit zeros.
    """
    neighbors = np.asarray(neighbors)
    similarities = np.asarray(similarities, dtype=np.float32)
    if neighbors.shape != similarities.shape or neighbors.ndim != 2:
        raise InvalidArgumentError(
            f"neighbors {neighbors.shape} and similarities {similarities.shape} must be N x k alike")
    n, k = neighbors.shape
    rows = np.repeat(np.arange(n, dtype=np.int64), k)
    cols = neighbors.reshape(-1).astype(np.int64)
    vals = similarities.reshape(-1)
    ok = (cols >= 0) & (cols != rows) & (vals > 0)
    rows, cols, vals = rows[ok], cols[ok], vals[ok]
    directed = sp.csr_matrix((vals, (rows, cols)), shape=(n, n), dtype=np.float32)
    directed.sum_duplicates()
    pattern = directed.copy()
    pattern.data = np.ones_like(pattern.data)
    mutual = pattern.multiply(pattern.T)  # 1 where both directions exist
    w = (directed.multiply(mutual) + directed.T.multiply(mutual)) * 0.5
    w = sp.csr_matrix(w, dtype=np.float32)
    w.eliminate_zeros()
    w.sort_indices()
    return w


@dataclass(frozen=True)
class GraphSummary:
    """Numbers a user wants to see about W."""

    n_nodes: int
    n_edges: int  # undirected
    mean_degree: float
    isolated: int
    components: int
    largest_component: int


def summarize_graph(w: sp.csr_matrix) -> GraphSummary:
    from scipy.sparse.csgraph import connected_components

    deg = np.diff(w.indptr)
    n_comp, labels = connected_components(w, directed=False)
    sizes = np.bincount(labels) if labels.size else np.zeros(1, dtype=int)
    return GraphSummary(
        n_nodes=int(w.shape[0]),
        n_edges=int(w.nnz // 2),
        mean_degree=float(deg.mean()) if deg.size else 0.0,
        isolated=int(np.sum(deg == 0)),
        components=int(n_comp),
        largest_component=int(sizes.max()) if sizes.size else 0,
    )


def _is_symmetric(w: sp.csr_matrix, atol: float, block_nnz: int = 1 << 19) -> bool:
    """max |W - W^T| <= atol, compared in row blocks of about ``block_nnz`` entries: W - W^T at once
    would allocate three nnz-sized temporaries (a loaded 150k-prompt state's peak memory)."""
    n = w.shape[0]
    a = 0
    while a < n:
        b = int(np.searchsorted(w.indptr, w.indptr[a] + block_nnz, side="right"))
        b = min(n, max(b - 1, a + 1))
        rows_t = w[:, a:b].T.tocsr()  # rows a..b of W^T: columns a..b of W
        diff = w[a:b] - rows_t
        if diff.nnz and float(np.abs(diff.data).max()) > atol:
            return False
        a = b
    return True


def validate_graph(graph, n_nodes: int | None = None, rtol: float = 1e-5) -> sp.csr_matrix:
    """Check a user-supplied W and return it as CSR float64 with sorted indices.

    W must be square, finite, non-negative, symmetric and have a zero diagonal (Appendix A: the
    mutual-neighbour graph is undirected and has no self-loops; Proposition 1 relies on both).
    """
    if not sp.issparse(graph):
        raise DataError("graph must be a scipy.sparse matrix (CSR), got " + type(graph).__name__)
    w = sp.csr_matrix(graph, dtype=np.float64)
    if w.shape[0] != w.shape[1]:
        raise DataError(f"graph must be square, got shape {w.shape}")
    if n_nodes is not None and w.shape[0] != n_nodes:
        raise DataError(f"graph has {w.shape[0]} nodes but labels have {n_nodes}")
    w.sum_duplicates()
    if w.data.size and not np.all(np.isfinite(w.data)):
        raise DataError("graph weights contain NaN or infinite values")
    if w.data.size and w.data.min() < 0:
        raise DataError("graph weights must be non-negative (W_ij = c_ij > 0 on mutual neighbours)")
    if w.diagonal().any():
        raise DataError("graph has self-loops: W must have a zero diagonal")
    if not _is_symmetric(w, rtol * max(1.0, float(w.data.max()) if w.data.size else 0.0)):
        raise DataError("graph is not symmetric: W_ij must equal W_ji")
    w.eliminate_zeros()
    w.sort_indices()
    return w
