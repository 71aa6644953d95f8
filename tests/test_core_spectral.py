"""Spectral clustering of W (Section 3.4): planted communities, components, isolated nodes, refusals."""

import numpy as np
import pytest
import scipy.sparse as sp

from graphdiff_cli.core.spectral import allocate_states, kmeans, spectral_clustering
from graphdiff_cli.errors import InvalidArgumentError


def planted_graph(sizes, p_in, p_out, seed=0):
    """A stochastic block model with similarity-like weights in (0.5, 1]."""
    rng = np.random.default_rng(seed)
    truth = np.repeat(np.arange(len(sizes)), sizes)
    n = truth.size
    same = truth[:, None] == truth[None, :]
    prob = np.where(same, p_in, p_out)
    upper = np.triu(rng.random((n, n)) < prob, k=1)
    weights = np.triu(rng.uniform(0.5, 1.0, (n, n)), k=1) * upper
    w = weights + weights.T
    return sp.csr_matrix(w), truth


def same_partition(a, b) -> bool:
    """True iff the two labelings define the same partition (labels may be permuted)."""
    pairs = set(zip(a.tolist(), b.tolist()))
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recovers_planted_communities(seed):
    w, truth = planted_graph([40, 55, 30, 60, 45], 0.3, 0.01, seed=seed)
    labels = spectral_clustering(w, 5, seed=seed)
    assert same_partition(labels, truth)


def test_recovers_communities_with_arpack_path(monkeypatch):
    import graphdiff_cli.core.spectral as spectral

    monkeypatch.setattr(spectral, "DENSE_EIGEN_MAX", 10)  # force the sparse eigensolver
    w, truth = planted_graph([60, 80, 70], 0.2, 0.005, seed=4)
    assert same_partition(spectral_clustering(w, 3, seed=0), truth)


def test_seeded_and_deterministic():
    w, _ = planted_graph([30, 30, 30, 30], 0.15, 0.05, seed=5)
    a = spectral_clustering(w, 6, seed=7)
    b = spectral_clustering(w, 6, seed=7)
    assert np.array_equal(a, b)


def test_components_get_states_in_proportion():
    # two disconnected blocks of 100 and 50 nodes, each with 2 planted communities
    w1, t1 = planted_graph([50, 50], 0.3, 0.02, seed=1)
    w2, t2 = planted_graph([25, 25], 0.4, 0.04, seed=2)
    w = sp.block_diag([w1, w2]).tocsr()
    labels = spectral_clustering(w, 6, seed=0)
    assert set(labels[:100]).isdisjoint(set(labels[100:])), "states never span two components"
    assert len(set(labels[:100])) == 4 and len(set(labels[100:])) == 2
    assert labels.min() >= 0 and labels.max() < 6


def test_isolated_nodes_are_pooled_without_neighbours():
    w, _ = planted_graph([40, 40], 0.3, 0.02, seed=3)
    n = 83  # three isolated nodes appended
    w = sp.block_diag([w, sp.csr_matrix((3, 3))]).tocsr()
    labels = spectral_clustering(w, 3, seed=0)
    assert labels.shape == (n,)
    assert labels.min() >= 0 and labels.max() < 3
    iso = labels[80:]
    assert len(set(iso)) == 1, "isolated nodes share one pooled state"
    assert iso[0] not in set(labels[:80])
    assert len(set(labels[:80])) == 2


def test_isolated_nodes_attach_to_their_nearest_placed_neighbour():
    w, truth = planted_graph([40, 40], 0.3, 0.02, seed=3)
    w = sp.block_diag([w, sp.csr_matrix((2, 2))]).tocsr()
    knn = np.full((82, 3), -1)
    knn[80] = [81, 5, 50]  # its first neighbour is the other orphan; the first placed one is node 5
    knn[81] = [60, 1, -1]
    labels = spectral_clustering(w, 3, seed=0, fallback_neighbors=knn)
    assert labels[80] == labels[5]
    assert labels[81] == labels[60]
    assert labels.max() < 3


def test_k_larger_than_n_refused():
    w, _ = planted_graph([5, 5], 0.9, 0.1)
    with pytest.raises(InvalidArgumentError, match="more than the 10 prompts"):
        spectral_clustering(w, 11)
    with pytest.raises(InvalidArgumentError, match=">= 1"):
        spectral_clustering(w, 0)


def test_k_equal_n_and_k_one():
    w, _ = planted_graph([6, 6], 0.9, 0.2, seed=1)
    assert np.all(spectral_clustering(w, 1) == 0)
    assert sorted(spectral_clustering(w, 12)) == list(range(12))


def test_allocate_states_sums_and_caps():
    alloc = allocate_states(np.array([100, 50, 3, 1]), 10)
    assert alloc.sum() == 10 and alloc[0] >= alloc[1] >= alloc[2]
    assert allocate_states(np.array([2, 2]), 10).tolist() == [2, 2]


def test_kmeans_returns_k_nonempty_clusters():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(c, 0.1, (20, 2)) for c in (0, 5, 10)])
    labels = kmeans(x, 3, seed=0)
    assert sorted(np.bincount(labels).tolist()) == [20, 20, 20]
    assert len(np.unique(kmeans(x, 7, seed=1))) == 7
