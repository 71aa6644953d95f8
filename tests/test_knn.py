"""The faiss neighbour search (backends/knn.py) against the brute-force reference core.graph.exact_knn."""

from __future__ import annotations

import numpy as np
import pytest

from _tolerances import assert_same_neighbours, float32_dot_error
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
    # the same lists, in order, except among neighbours whose float32 similarities lie within rounding of each
    # other (faiss's and BLAS's sums of d products round differently): (57, 5, 56) has gaps of 1.7e-7
    assert_same_neighbours(nbr, ref_nbr, ref_sim, float32_dot_error(d))
    np.testing.assert_allclose(sim, ref_sim, atol=1e-5)
    # cosine values are the inner products of the rows named
    np.testing.assert_allclose(sim, np.einsum("id,ikd->ik", x, x[nbr]), atol=1e-5)


def test_mutual_graph_from_faiss_equals_brute_force():
    x = _unit(200, 8, seed=3)
    k = 7
    res = knn_search(x, k + 1, device="cpu", block=37)  # several query blocks
    w = mutual_knn_graph(*drop_self(res.neighbors, res.similarities, k))
    w_ref = mutual_knn_graph(*exact_knn(x, k))
    # the same edges: each k-th and (k+1)-th neighbour here differ by >= 5e-5 in similarity, far beyond float32
    # rounding of 8 products (float32_dot_error(8) = 1e-6), so no machine's sums pick another neighbour set
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


def _clustered(n, d, seed):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((max(2, n // 100), d))
    x = centers[rng.integers(0, centers.shape[0], n)] + 0.6 * rng.standard_normal((n, d))
    return normalize_rows(x.astype(np.float32))


def test_sampled_recall_is_exact_on_exact_hits_and_counts_misses():
    from graphdiff_cli.backends.knn import sampled_recall

    x = _unit(500, 12, seed=9)
    res = knn_search(x, 11, device="cpu")
    assert sampled_recall(x, res.neighbors, sample=200)["recall"] == 1.0
    # replace the last 5 of 11 hits of every row by rows that are certainly not among its top 11
    worst = np.argsort(x @ x.T, axis=1)[:, :5]
    damaged = res.neighbors.copy()
    damaged[:, 6:] = worst
    damaged[0, 6:] = -1  # padding counts as a miss
    got = sampled_recall(x, damaged, sample=500)
    assert got == {"recall": pytest.approx(6 / 11), "sample": 500, "k": 11}


@pytest.mark.parametrize("index", ["hnsw", "ivf"])
def test_approximate_indexes_reach_high_recall_and_report_it(index):
    from graphdiff_cli.backends.knn import sampled_recall

    x = _clustered(4000, 32, seed=4)
    k = 21
    res = knn_search(x, k, device="cpu", index=index)
    assert res.backend == f"faiss-{index}" and res.params
    ref, _ = exact_knn(x, k - 1)
    # recall against the brute-force reference, computed independently of sampled_recall
    hits = np.mean([len(set(a[a != i]) & set(b)) / (k - 1) for i, (a, b) in enumerate(zip(res.neighbors, ref))])
    assert hits >= 0.95
    est = sampled_recall(x, res.neighbors, sample=4000)["recall"]  # every row: the full figure
    assert est == pytest.approx(np.mean([len(set(a) & set(np.r_[i, b])) / k
                                         for i, (a, b) in enumerate(zip(res.neighbors, ref))]), abs=2e-3)
    if index == "ivf":
        assert res.params["nlist"] == min(round(4 * np.sqrt(4000)), 4000 // 39)


def test_unknown_index_refused():
    with pytest.raises(InvalidArgumentError, match="unknown index"):
        knn_search(_unit(20, 4, seed=1), 3, device="cpu", index="lsh")
