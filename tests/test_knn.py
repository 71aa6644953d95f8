"""The faiss neighbour search (backends/knn.py) against the brute-force reference core.graph.exact_knn."""

from __future__ import annotations

import numpy as np
import pytest

from graphdiff_cli.backends.device import cuda_works
from graphdiff_cli.backends.knn import FaissCpuSearch, knn_search, make_search
from graphdiff_cli.core.graph import drop_self, exact_knn, mutual_knn_graph, normalize_rows
from graphdiff_cli.errors import BackendError, InvalidArgumentError


def _unit(n, d, seed):
    return normalize_rows(np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32))


@pytest.mark.parametrize("n,d,k", [(300, 16, 10), (57, 5, 56), (2, 3, 1)])
def test_faiss_cpu_matches_brute_force(n, d, k):
    x = _unit(n, d, seed=n)
    res = knn_search(x, k + 1, device="cpu")
    assert res.backend == "faiss-cpu" and res.device == "cpu"
    nbr, sim = drop_self(res.neighbors, res.similarities, k)
    ref_nbr, ref_sim = exact_knn(x, k)
    # continuous random data has no ties, so the lists agree exactly, in order
    np.testing.assert_array_equal(nbr, ref_nbr)
    np.testing.assert_allclose(sim, ref_sim, atol=1e-5)
    # cosine values are the inner products of the rows named
    np.testing.assert_allclose(sim, np.einsum("id,ikd->ik", x, x[nbr]), atol=1e-5)


def test_mutual_graph_from_faiss_equals_brute_force():
    x = _unit(200, 8, seed=3)
    k = 7
    res = knn_search(x, k + 1, device="cpu", block=37)  # several query blocks
    w = mutual_knn_graph(*drop_self(res.neighbors, res.similarities, k))
    w_ref = mutual_knn_graph(*exact_knn(x, k))
    np.testing.assert_array_equal(w.indptr, w_ref.indptr)
    np.testing.assert_array_equal(w.indices, w_ref.indices)
    np.testing.assert_allclose(w.data, w_ref.data, atol=1e-5)


def test_duplicates_never_list_self():
    """Exact duplicates tie with self; drop_self must remove self wherever the index put it."""
    base = _unit(20, 4, seed=1)
    x = np.concatenate([base, base, base])  # every row has two exact copies
    k = 5
    res = knn_search(x, k + 1, device="cpu")
    nbr, sim = drop_self(res.neighbors, res.similarities, k)
    assert not np.any(nbr == np.arange(len(x))[:, None])
    # the two copies of each row are its two best neighbours (similarity 1)
    for i in range(60):
        assert set(nbr[i, :2]) == {(i + 20) % 60, (i + 40) % 60}
        np.testing.assert_allclose(sim[i, :2], 1.0, atol=1e-5)


def test_progress_reports_every_block():
    x = _unit(50, 4, seed=2)
    seen = []
    knn_search(x, 3, device="cpu", progress=lambda done, total: seen.append((done, total)), block=20)
    assert seen == [(0, 50), (20, 50), (40, 50), (50, 50)]


def test_bad_k_and_device():
    x = _unit(5, 3, seed=0)
    with pytest.raises(InvalidArgumentError):
        knn_search(x, 6, device="cpu")
    with pytest.raises(InvalidArgumentError):
        knn_search(x, 2, device="tpu")
    assert isinstance(make_search(x, 2, "cpu"), FaissCpuSearch)


@pytest.mark.skipif(cuda_works(), reason="this machine has a working CUDA GPU")
def test_cuda_refused_without_gpu():
    with pytest.raises(BackendError, match="no working CUDA GPU"):
        knn_search(_unit(5, 3, seed=0), 2, device="cuda")


@pytest.mark.gpu
def test_gpu_search_matches_brute_force():
    if not cuda_works():
        pytest.skip("no working CUDA GPU")
    x = _unit(3000, 64, seed=7)
    k = 20
    res = knn_search(x, k + 1, device="cuda")
    assert res.device == "cuda" and res.backend in ("faiss-gpu", "torch-cuda")
    nbr, sim = drop_self(res.neighbors, res.similarities, k)
    ref_nbr, ref_sim = exact_knn(x, k)
    np.testing.assert_allclose(sim, ref_sim, atol=1e-5)
    # GPU float sums may swap near-ties; the neighbour sets agree on (almost) every row
    agree = np.mean([set(a) == set(b) for a, b in zip(nbr, ref_nbr)])
    assert agree > 0.99
