"""The difficulty-aware sample graph of Section 3.3.

W_ij = c_ij if x_i and x_j are mutual k-nearest neighbours and c_ij > 0, else 0, where
c_ij = phi_i . phi_j is the cosine similarity of L2-normalized embeddings. W is symmetric with a zero
diagonal and is returned as a SciPy CSR matrix.

The neighbour search itself (faiss, CPU or GPU) lives in ``graphdiff_cli.backends.knn``; this module
turns its output into W and checks graphs handed to the estimator, so it stays pure numpy/scipy.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
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
    return mutual_knn_graph_from_entries(rows, neighbors.reshape(-1).astype(np.int64), similarities.reshape(-1), n)


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


def _is_symmetric(w: sp.csr_matrix, atol: float) -> bool:
    """max |W - W^T| <= atol for a CSR W in canonical form (sorted indices, no duplicates, no explicit zeros):
    W^T built once (scipy's O(nnz) transpose, canonical too) and compared array by array, one nnz-sized copy
    at a time. (The first version compared row blocks with column slices of W, each O(nnz): 13 s at a
    million prompts, quadratic in the graph's size.)"""
    t = w.T.tocsr()  # sorted indices, and no zeros or duplicates since W has none
    if np.array_equal(t.indptr, w.indptr) and np.array_equal(t.indices, w.indices):
        step = 1 << 20  # the difference a slice at a time: W^T is the only nnz-sized copy held
        return all(float(np.abs(t.data[i:i + step] - w.data[i:i + step]).max()) <= atol
                   for i in range(0, t.data.size, step))
    diff = w - t  # patterns differ: entries of one side only may still be within atol, as before
    return not diff.nnz or float(np.abs(diff.data).max()) <= atol


def validate_graph(graph, n_nodes: int | None = None, rtol: float = 1e-5, *,
                   check_symmetry: bool = True) -> sp.csr_matrix:
    """Check a user-supplied W and return it as CSR float64 with sorted indices.

    W must be square, finite, non-negative, symmetric and have a zero diagonal (Appendix A: the
    mutual-neighbour graph is undirected and has no self-loops; Proposition 1 relies on both).
    ``check_symmetry=False`` is for a W read back from an artifact graphdiff wrote, its checksums verified
    on the read: it was checked when it was written, and the symmetry test is the one check that costs a
    copy of W (2-4 s and 230 MiB of a million-prompt load); the other checks stay.
    """
    if not sp.issparse(graph):
        raise DataError("graph must be a scipy.sparse matrix (CSR), got " + type(graph).__name__)
    # canonicalised below in place: a float64 CSR W is the caller's own (its equivalent canonical form), any
    # other is copied whole (a dtype change alone would copy the values but share the indices it rewrites)
    w = sp.csr_matrix(graph, dtype=np.float64, copy=getattr(graph, "dtype", None) != np.float64)
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
    w.eliminate_zeros()
    w.sort_indices()
    if check_symmetry and not _is_symmetric(w, rtol * max(1.0, float(w.data.max()) if w.data.size else 0.0)):
        raise DataError("graph is not symmetric: W_ij must equal W_ji")
    return w



@dataclass(frozen=True)
class GraphExtension:
    """What adding prompts to a mutual-kNN graph changes (``extend_mutual_knn``)."""

    graph: sp.csr_matrix       # W over the old prompts then the new ones (float32, sorted indices)
    neighbors: np.ndarray      # (N + M) x k directed kNN lists, most similar first
    similarities: np.ndarray   # their cosine similarities (float32)
    changed: np.ndarray        # old prompts whose list a new prompt entered (their W row may have changed)


def _sorted_topk(cand: np.ndarray, sims: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the k largest ``sims`` (most similar first; ties by lower index) and their ``cand``."""
    order = np.lexsort((cand, -sims), axis=1)[:, :k]
    return np.take_along_axis(cand, order, axis=1), np.take_along_axis(sims, order, axis=1)


def _sorted_member(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Whether each of ``keys`` is in the ascending array ``sorted_keys`` (np.isin without its hashing)."""
    pos = np.minimum(np.searchsorted(sorted_keys, keys), sorted_keys.size - 1)
    return sorted_keys[pos] == keys if sorted_keys.size else np.zeros(keys.size, bool)


def list_similarities(x: np.ndarray, neighbors: np.ndarray, block: int = 8192) -> np.ndarray:
    """c_ij for every j in row i's list (float32, N x k), in row blocks (a graph artifact made before the
    similarities were stored keeps only the lists)."""
    out = np.empty(neighbors.shape, dtype=np.float32)
    for a in range(0, neighbors.shape[0], block):
        b = min(neighbors.shape[0], a + block)
        out[a:b] = np.einsum("ijd,id->ij", x[neighbors[a:b]], x[a:b])
    return out


def extend_mutual_knn(w_old: sp.csr_matrix, neighbors_old: np.ndarray, similarities_old: np.ndarray,
                      x_old: np.ndarray, x_new: np.ndarray, block: int = 256) -> GraphExtension:
    """W over N old then M new prompts, as ``mutual_knn_graph(drop_self(exact search of all N + M)))``
    builds it, from the old W and directed lists (most similar first) in O(M (N + M) d) time.

    A new prompt's list is its k most similar prompts among all N + M. An old prompt's list changes only
    where a new prompt is more similar than its k-th neighbour: the new prompt enters and the least
    similar leaves. Old lists only lose old prompts, so an old-old edge survives unless one end dropped
    the other, and no old-old edge appears; edges to new prompts are mutual where both lists hold them.
    The lists must be full (k < N: the old search was not capped at N - 1).
    """
    nbr_old = np.asarray(neighbors_old, dtype=np.int64)
    sim_old = np.asarray(similarities_old, dtype=np.float32)
    x_old = np.asarray(x_old, dtype=np.float32)
    x_new = np.asarray(x_new, dtype=np.float32)
    n, k = nbr_old.shape
    m = x_new.shape[0] if x_new.ndim == 2 else -1
    if (sim_old.shape != (n, k) or x_old.shape[0] != n or w_old.shape != (n, n) or m < 0
            or x_new.shape[1] != x_old.shape[1]):
        raise InvalidArgumentError(f"extend_mutual_knn: W {w_old.shape}, lists {nbr_old.shape}, similarities "
                                   f"{sim_old.shape}, old embeddings {x_old.shape} and new {x_new.shape} do not fit")
    if k < 1 or k >= n or (nbr_old < 0).any():
        raise InvalidArgumentError(f"extend_mutual_knn needs full kNN lists of width 1 <= k < N, got k = {k}, N = {n}")
    total = n + m
    kth = sim_old.min(axis=1)  # a new prompt enters an old list where it is more similar than its k-th
    new_nbr = np.empty((m, k), dtype=np.int64)
    new_sim = np.empty((m, k), dtype=np.float32)
    e_rows, e_cols, e_sims = [], [], []  # (old prompt, new prompt, c) for every new prompt entering a list
    k_new = min(k, m - 1)
    for a in range(0, m, block):
        b = min(m, a + block)
        s_old = x_new[a:b] @ x_old.T  # (b - a) x N: the search's cost, O(M N d)
        top_old = np.argpartition(-s_old, k - 1, axis=1)[:, :k]
        cand, sims = top_old, np.take_along_axis(s_old, top_old, axis=1)
        if k_new > 0:  # the other new prompts (self excluded)
            s_new = x_new[a:b] @ x_new.T
            s_new[np.arange(b - a), np.arange(a, b)] = -np.inf
            top_new = np.argpartition(-s_new, k_new - 1, axis=1)[:, :k_new]
            cand = np.concatenate([cand, top_new + n], axis=1)
            sims = np.concatenate([sims, np.take_along_axis(s_new, top_new, axis=1)], axis=1)
        new_nbr[a:b], new_sim[a:b] = _sorted_topk(cand, sims, k)
        r, c = np.nonzero(s_old > kth[None, :])
        e_rows.append(c)
        e_cols.append(r + a + n)
        e_sims.append(s_old[r, c])
        del s_old
    e_rows, e_cols, e_sims = (np.concatenate(v) for v in (e_rows, e_cols, e_sims))
    neighbors = np.concatenate([nbr_old, new_nbr])
    similarities = np.concatenate([sim_old, new_sim])
    changed = np.unique(e_rows)
    dropped_r, dropped_c = np.zeros(0, np.int64), np.zeros(0, np.int64)
    if changed.size:
        order = np.argsort(e_rows, kind="stable")
        e_rows, e_cols, e_sims = e_rows[order], e_cols[order], e_sims[order]
        row_of = np.searchsorted(changed, e_rows)
        counts = np.bincount(row_of, minlength=changed.size)
        slot = np.arange(e_rows.size) - np.repeat(np.cumsum(counts) - counts, counts)
        add_c = np.full((changed.size, int(counts.max())), -1, np.int64)
        add_s = np.full(add_c.shape, -np.inf, np.float32)
        add_c[row_of, slot], add_s[row_of, slot] = e_cols, e_sims
        old_l = nbr_old[changed]
        merged_c, merged_s = _sorted_topk(np.concatenate([old_l, add_c], axis=1),
                                          np.concatenate([sim_old[changed], add_s], axis=1), k)
        neighbors[changed], similarities[changed] = merged_c, merged_s
        rows_k = np.repeat(changed, k)
        # (row, prompt) keys of the changed rows' new lists, sorted: rows ascend, so sorting within rows suffices
        list_keys = (rows_k * total + np.sort(merged_c, axis=1).ravel())
        kept = _sorted_member(list_keys, rows_k * total + old_l.ravel())  # old entries still in the list
        dropped_r, dropped_c = rows_k[~kept], old_l.ravel()[~kept]
    # old-old edges: W minus those whose one end dropped the other
    w = sp.csr_matrix(w_old, dtype=np.float32)
    if dropped_r.size:
        d = sp.csr_matrix((np.ones(dropped_r.size, np.float32), (dropped_r, dropped_c)), shape=(n, n))
        w = (w - w.multiply(((d + d.T) > 0).astype(np.float32))).tocsr()
    w = sp.csr_matrix((w.data, w.indices, np.concatenate([w.indptr, np.full(m, w.indptr[-1])])),
                      shape=(total, total))
    # edges with a new end: the directed entries that involve a new prompt, kept where both directions exist
    f_rows = np.concatenate([np.repeat(np.arange(n, total), k), e_rows])
    f_cols = np.concatenate([new_nbr.ravel(), e_cols])
    f_sims = np.concatenate([new_sim.ravel(), e_sims])
    if changed.size:  # entering entries that did not survive the merge are not in the lists
        keep_e = _sorted_member(list_keys, e_rows * total + e_cols)
        f_keep = np.concatenate([np.ones(m * k, bool), keep_e])
        f_rows, f_cols, f_sims = f_rows[f_keep], f_cols[f_keep], f_sims[f_keep]
    f_new = mutual_knn_graph_from_entries(f_rows, f_cols, f_sims, total)
    w = (w + f_new).tocsr()
    w.eliminate_zeros()
    w.sort_indices()
    return GraphExtension(sp.csr_matrix(w, dtype=np.float32), neighbors, similarities, changed)


def rebuild_mutual_knn(x: np.ndarray, n_old: int, k_nn: int) -> GraphExtension:
    """The extension of a graph so small that its search was capped at k = N - 1 < k_nn: every list grows,
    so the lists and W are searched again from scratch over all N + M prompts (N <= k_nn: cheap)."""
    k = min(k_nn, x.shape[0] - 1)
    nbr, sim = exact_knn(x, k)
    return GraphExtension(mutual_knn_graph(nbr, sim), nbr, sim, np.arange(n_old, dtype=np.int64))


def mutual_knn_graph_from_entries(rows: np.ndarray, cols: np.ndarray, sims: np.ndarray, n: int) -> sp.csr_matrix:
    """The mutual rule of ``mutual_knn_graph`` over directed entries (row, col, c) given as lists."""
    ok = (cols >= 0) & (cols != rows) & (sims > 0)
    directed = sp.csr_matrix((sims[ok].astype(np.float32), (rows[ok], cols[ok])), shape=(n, n), dtype=np.float32)
    directed.sum_duplicates()
    pattern = directed.copy()
    pattern.data = np.ones_like(pattern.data)
    mutual = pattern.multiply(pattern.T)
    w = sp.csr_matrix((directed.multiply(mutual) + directed.T.multiply(mutual)) * 0.5, dtype=np.float32)
    w.eliminate_zeros()
    w.sort_indices()
    return w


# below this many stored entries a product with W is too short for threads to pay (measured: 11.3 M entries
# took 24-32 ms on one core, 12.5-13.4 ms over two)
PARALLEL_MIN_NNZ = 1 << 20
_POOL = None


def _forget_pool_after_fork() -> None:  # a forked child inherits the pool object but none of its threads
    global _POOL
    _POOL = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_after_fork)


def usable_cpus() -> int:
    """The CPUs this process may run on, capped by OMP_NUM_THREADS when set (a SLURM job that asks for one
    core sets it)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        cpus = min(cpus, int(env))
    return max(1, cpus)


_BLAS_LOCK = threading.RLock()  # re-entrant: a caller inside may call another


@contextmanager
def single_blas_thread():
    """BLAS limited to one thread while inside. Small dense work (a CG solve's dot products, the read-out's
    (d + 1) x (d + 1) Cholesky solve) gains nothing from BLAS threads, whose spinning then takes the cores that
    the threaded products with W need (22 instead of 13 ms a product on two cores; a 385 x 385 solve 9-17 ms
    in the resident step, 2.7 ms on one thread). The limit is process-wide, so callers in several threads
    take turns: entered and left by one thread at a time, the saved setting is always restored."""
    from threadpoolctl import threadpool_limits

    with _BLAS_LOCK, threadpool_limits(limits=1, user_api="blas"):
        yield


def matvec_threads() -> int:
    """Threads for products with W: ``usable_cpus``, at most 16."""
    return min(usable_cpus(), 16)


def row_sums(w: sp.csr_matrix) -> np.ndarray:
    """W's row sums (the degrees d_i), float64."""
    return np.asarray(w.sum(axis=1), dtype=np.float64).ravel()


def csr_with_data(w: sp.csr_matrix, data: np.ndarray) -> sp.csr_matrix:
    """A CSR matrix with W's structure and these values, sharing W's index arrays (scipy's constructor would
    copy or check them; W is valid, so they are set on an empty matrix, as ``row_parallel_matvec`` does)."""
    m = sp.csr_matrix(w.shape, dtype=data.dtype)
    m.indptr, m.indices, m.data = w.indptr, w.indices, data
    return m


def single_precision(w: sp.csr_matrix) -> sp.csr_matrix:
    """W with float32 values and W's own index arrays (4 bytes an entry more): for the float32 products of
    label propagation's solve (``harmonic.harmonic_solution``)."""
    return csr_with_data(w, w.data.astype(np.float32))


def row_parallel_matvec(w: sp.csr_matrix, threads: int | None = None):
    """A function x -> W @ x that splits W's rows into blocks of equal stored entries and multiplies them in
    threads (scipy's CSR kernel releases the GIL). Each block is a CSR matrix over views of W's arrays
    (``blocks`` on the function): scipy's constructor would copy a slice under half of its array (with two
    threads, one block: 0.53 s a solve at a million prompts), so the views are set on an empty matrix, which
    its product does not check again. W must not change while the function is in use. Same result as
    ``w @ x`` to the bit (each row's sum is formed in the same order); a plain product when W is small, not
    CSR, or one thread is available."""
    from concurrent.futures import ThreadPoolExecutor

    global _POOL
    threads = matvec_threads() if threads is None else int(threads)
    if threads <= 1 or w.nnz < PARALLEL_MIN_NNZ or w.format != "csr":
        return w.__matmul__
    n_rows = w.shape[0]
    cuts = np.searchsorted(w.indptr, np.linspace(0, w.nnz, threads + 1)[1:-1])
    bounds = np.unique(np.concatenate([[0], cuts, [n_rows]]))
    blocks = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        s, e = int(w.indptr[a]), int(w.indptr[b])
        m = sp.csr_matrix((int(b - a), w.shape[1]), dtype=w.dtype)
        m.indptr = (w.indptr[a:b + 1] - s).astype(w.indices.dtype, copy=False)
        m.indices, m.data = w.indices[s:e], w.data[s:e]
        blocks.append((int(a), int(b), m))
    if _POOL is None or _POOL._max_workers < len(blocks):
        _POOL = ThreadPoolExecutor(max_workers=len(blocks), thread_name_prefix="graphdiff-matvec")
    pool = _POOL

    def matvec(x):
        x = np.asarray(x)
        out = np.empty(n_rows, dtype=np.result_type(w.dtype, x.dtype))

        def part(block):
            a, b, m = block
            out[a:b] = m @ x

        for f in [pool.submit(part, blk) for blk in blocks]:
            f.result()
        return out

    matvec.blocks = blocks
    return matvec
