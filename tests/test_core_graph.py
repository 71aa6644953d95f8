"""The mutual-kNN graph of Section 3.3 against its definition, computed by brute force."""

import numpy as np
import pytest
import scipy.sparse as sp

from graphdiff_cli.core.graph import (
    drop_self,
    exact_knn,
    mutual_knn_graph,
    normalize_rows,
    summarize_graph,
    truncate_matryoshka,
    validate_graph,
)
from graphdiff_cli.errors import DataError


def brute_force_w(x: np.ndarray, k: int) -> np.ndarray:
    """W_ij = c_ij if i, j are mutual k-nearest neighbours and c_ij > 0, else 0 (dense, by definition)."""
    phi = x / np.linalg.norm(x, axis=1, keepdims=True)
    c = phi @ phi.T
    n = len(x)
    knn = []
    for i in range(n):
        order = [j for j in np.argsort(-c[i], kind="stable") if j != i][:k]
        knn.append(set(order))
    w = np.zeros((n, n))
    for i in range(n):
        for j in knn[i]:
            if i in knn[j] and c[i, j] > 0:
                w[i, j] = c[i, j]
    return w


@pytest.mark.parametrize("seed,k", [(0, 3), (1, 5), (2, 10)])
def test_mutual_knn_matches_definition(seed, k):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((60, 8))
    nbr, sim = exact_knn(x, k)
    w = mutual_knn_graph(nbr, sim)
    assert isinstance(w, sp.csr_matrix)
    np.testing.assert_allclose(w.toarray(), brute_force_w(x, k), atol=1e-5)


def test_graph_properties():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((200, 16))
    w = mutual_knn_graph(*exact_knn(x, 12))
    dense = w.toarray()
    assert np.array_equal(dense, dense.T), "W must be exactly symmetric"
    assert not dense.diagonal().any(), "W must have a zero diagonal"
    assert w.data.min() > 0, "only positive similarities are kept"
    assert w.has_sorted_indices
    deg = np.diff(w.indptr)
    assert deg.max() <= 12, "a node has at most k mutual neighbours"
    s = summarize_graph(w)
    assert s.n_nodes == 200 and s.n_edges == w.nnz // 2
    validate_graph(w)  # the estimator accepts it


def test_negative_similarities_are_dropped():
    # two opposite directions: every cosine across the groups is negative
    x = np.array([[1, 0.01], [1, -0.01], [-1, 0.02], [-1, -0.02]], dtype=float)
    w = mutual_knn_graph(*exact_knn(x, 3)).toarray()
    assert w[0, 1] > 0 and w[2, 3] > 0
    assert w[0, 2] == 0 and w[1, 3] == 0


def test_drop_self_handles_duplicates_and_padding():
    # row 0's self appears second (a duplicate tied with it); row 1 has -1 padding
    nbr = np.array([[5, 0, 3, 4], [1, 2, -1, -1]])
    sim = np.array([[1.0, 1.0, 0.5, 0.4], [1.0, 0.9, 0, 0]], dtype=np.float32)
    out_n, out_s = drop_self(nbr, sim, 3)
    assert out_n[0].tolist() == [5, 3, 4]
    np.testing.assert_allclose(out_s[0], [1.0, 0.5, 0.4])
    assert out_n[1].tolist() == [2, -1, -1]


def test_exact_knn_excludes_self_and_sorts():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 4))
    nbr, sim = exact_knn(x, 5, block=7)  # several blocks
    assert not (nbr == np.arange(50)[:, None]).any()
    assert np.all(np.diff(sim, axis=1) <= 1e-7)
    phi = normalize_rows(x)
    np.testing.assert_allclose(sim, np.take_along_axis(phi @ phi.T, nbr, axis=1), atol=1e-6)


def test_matryoshka_truncation_renormalizes():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((10, 32))
    t = truncate_matryoshka(x, 8)
    assert t.shape == (10, 8)
    np.testing.assert_allclose(np.linalg.norm(t, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(t, normalize_rows(x[:, :8]), atol=1e-6)


def test_bad_embeddings_refused():
    with pytest.raises(DataError, match="row 1 is all zeros"):
        normalize_rows(np.array([[1.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(DataError, match="NaN"):
        normalize_rows(np.array([[np.nan, 1.0]]))


@pytest.mark.parametrize("graph,match", [
    (sp.csr_matrix(np.array([[0, 1.0], [0.5, 0]])), "not symmetric"),
    (sp.csr_matrix(np.array([[1.0, 0], [0, 0]])), "self-loops"),
    (sp.csr_matrix(np.array([[0, -1.0], [-1.0, 0]])), "non-negative"),
    (sp.csr_matrix(np.ones((2, 3))), "square"),
    (np.zeros((2, 2)), "scipy.sparse"),
])
def test_validate_graph_refusals(graph, match):
    with pytest.raises(DataError, match=match):
        validate_graph(graph)


@pytest.mark.parametrize("asymmetric", [False, True])
def test_validate_graph_leaves_a_float32_graph_as_it_was(asymmetric):
    # explicit zeros and duplicates are removed from a float64 copy; the caller's float32 W keeps its values
    # (a dtype change copied the values but shared the indices that the canonicalisation rewrote)
    data = np.array([0, 1, 0, 2, 1, 2.5 if asymmetric else 2], np.float32)
    g = sp.csr_matrix((data, [1, 2, 0, 2, 0, 1], [0, 2, 4, 6]), shape=(3, 3))
    before = g.toarray().copy()
    if asymmetric:
        with pytest.raises(DataError, match="not symmetric"):
            validate_graph(g)
    else:
        w = validate_graph(g)
        assert w.nnz == 4 and np.array_equal(w.toarray(), before)
    assert np.array_equal(g.toarray(), before)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_symmetry_check_agrees_with_the_dense_comparison(seed):
    from graphdiff_cli.core.graph import _is_symmetric

    rng = np.random.default_rng(seed)
    a = sp.random(300, 300, density=0.05, random_state=seed, format="csr")
    w = (a + a.T).tocsr()
    w.setdiag(0)
    w.eliminate_zeros()
    w.sort_indices()

    def canonical(m):
        m = sp.csr_matrix(m)
        m.sum_duplicates()
        m.eliminate_zeros()
        m.sort_indices()
        return m

    def dense_says(m, atol):
        d = m.toarray()
        return bool(np.abs(d - d.T).max() <= atol)

    cases = [w]
    for _ in range(5):  # one perturbed entry anywhere
        bad = w.copy()
        bad.data[rng.integers(bad.nnz)] += 1e-3
        cases.append(bad)
    for value in (0.5, 1e-12):  # an entry on one side only: beyond atol, and within it (accepted, as before)
        one_sided = w.tolil()
        i, j = next((i, j) for i, j in zip(rng.integers(0, 300, 1000), rng.integers(0, 300, 1000))
                    if i != j and w[i, j] == 0)
        one_sided[i, j] = value
        cases.append(one_sided)
    for m in cases:
        m = canonical(m)
        assert _is_symmetric(m, 1e-9) == dense_says(m, 1e-9)
    assert _is_symmetric(w, 1e-9) and not _is_symmetric(canonical(cases[1]), 1e-9)
    assert _is_symmetric(canonical(cases[-1]), 1e-9) and not _is_symmetric(canonical(cases[-2]), 1e-9)


@pytest.mark.parametrize("threads", [2, 3, 7])
def test_row_parallel_matvec_equals_the_plain_product_to_the_bit(threads):
    from graphdiff_cli.core.graph import PARALLEL_MIN_NNZ, row_parallel_matvec

    rng = np.random.default_rng(threads)
    n = 20_000
    per_row = rng.integers(0, 110, n)  # uneven rows, some empty
    per_row[:500] = 0
    rows = np.repeat(np.arange(n), per_row)
    w = sp.csr_matrix((rng.random(rows.size), (rows, rng.integers(0, n, rows.size))), shape=(n, n))
    assert w.nnz >= PARALLEL_MIN_NNZ  # the threaded path, not the plain one
    product = row_parallel_matvec(w, threads=threads)
    assert product != w.__matmul__
    # exact on any machine: both sum each row with scipy's CSR kernel, in the row's order (no BLAS)
    for x in (rng.random(n), rng.random(n).astype(np.float32)):
        assert np.array_equal(product(x), w @ x)
    # the blocks are views of W's arrays, never copies (a copy cost 0.53 s a solve at a million prompts)
    assert len(product.blocks) == threads
    for _a, _b, m in product.blocks:
        assert np.shares_memory(m.data, w.data) and np.shares_memory(m.indices, w.indices)
    w32 = w.astype(np.float32)  # the kind of W the pipeline builds (float32 data, int32 indices)
    x = rng.random(n)
    assert np.array_equal(row_parallel_matvec(w32, threads=threads)(x), w32 @ x)
    small = w[:100, :100]
    assert row_parallel_matvec(small, threads=threads) == small.__matmul__


def test_single_blas_thread_limits_blas_inside_and_restores_it_after_also_on_error():
    from threadpoolctl import threadpool_info

    from graphdiff_cli.core.graph import single_blas_thread

    def blas_threads():
        return sorted(lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas")

    before = blas_threads()
    assert before, "numpy's BLAS should be visible to threadpoolctl"
    with single_blas_thread():
        assert set(blas_threads()) == {1}
    assert blas_threads() == before
    with pytest.raises(RuntimeError), single_blas_thread():
        raise RuntimeError("boom")
    assert blas_threads() == before
    with single_blas_thread():  # the lock was released on the error: entering again does not deadlock
        pass


def test_single_blas_thread_nests_in_one_thread():
    from threadpoolctl import threadpool_info

    from graphdiff_cli.core.graph import single_blas_thread

    with single_blas_thread(), single_blas_thread():  # a solve inside a solve would otherwise hang
        assert {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"} == {1}
