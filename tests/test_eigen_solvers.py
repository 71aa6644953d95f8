"""``cluster``'s eigen-solvers and k-means: ARPACK (the paper's) against LOBPCG (with and without the AMG
preconditioner) on planted graphs, the stamped eigen-residual and inertia, faiss's k-means, pyamg's absence.

Tolerances. For a symmetric M and orthonormal vectors V with Ritz values theta (Rayleigh-Ritz: ARPACK's and
LOBPCG's output both are) and residual R = M V - V diag(theta), the sorted theta lie within ||R||_2 <=
sqrt(k) max_i ||r_i|| of k of M's eigenvalues (Kahan's theorem); on a planted graph with a clear gap after the
k-th eigenvalue those are the top k. So two solvers' sorted eigenvalues agree within sqrt(k) (r_a + r_b), r
the stamped residual of each; LOBPCG stops at ||r_i|| <= core.spectral.LOBPCG_TOL (1e-4) and ARPACK at
~1e-6 |lambda|. A wrong solve (a missed eigenvalue, the Laplacian's eigenvalue returned for M's) is off by
the spectral gap, > 0.1 here.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import scipy.sparse as sp
from typer.testing import CliRunner

import graphdiff_cli.core.spectral as spectral
from graphdiff_cli.backends.cluster import amg_available, faiss_kmeans
from graphdiff_cli.cli.app import app
from graphdiff_cli.core.spectral import (
    inertia, kmeans, leading_eigenpairs, normalized_affinity, spectral_clustering, spectral_states,
)
from graphdiff_cli.io.artifacts import hash_arrays, read_artifact, write_artifact
from graphdiff_cli.stages.prepare import eigen_solver_for
from _tolerances import FLOAT64

runner = CliRunner()


def planted(n=1200, k=6, deg=24, p_in=0.9, seed=0):
    """A connected sparse graph of k planted communities: each node proposes deg/2 edges, a share p_in of them
    inside its community, weights in [0.3, 0.9]."""
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, k, n)
    members = [np.flatnonzero(truth == c) for c in range(k)]
    rows = np.repeat(np.arange(n), deg // 2)
    inside = rng.random(rows.size) < p_in
    cols = np.where(inside, [members[truth[r]][rng.integers(members[truth[r]].size)] for r in rows],
                    rng.integers(0, n, rows.size))
    keep = rows != cols
    w = sp.csr_matrix((rng.uniform(0.3, 0.9, keep.sum()), (rows[keep], cols[keep])), shape=(n, n))
    return w.maximum(w.T).tocsr(), truth


def same_partition(a, b) -> bool:
    pairs = set(zip(np.asarray(a).tolist(), np.asarray(b).tolist()))
    return len(pairs) == len(set(np.asarray(a).tolist())) == len(set(np.asarray(b).tolist()))


@pytest.fixture
def sparse_solvers(monkeypatch):
    """Graphs of a thousand nodes take the solvers' path, not the dense eigh's."""
    monkeypatch.setattr(spectral, "DENSE_EIGEN_MAX", 50)


def amg():
    pytest.importorskip("pyamg")
    from graphdiff_cli.backends.cluster import amg_preconditioner

    return amg_preconditioner


@pytest.mark.parametrize("preconditioned", [False, True])
def test_lobpcg_and_arpack_agree_on_a_planted_graph(sparse_solvers, preconditioned):
    w, truth = planted()
    k = 6
    m, sqrt_deg = normalized_affinity(w)
    va, xa, used_a = leading_eigenpairs(m, k, seed=0)
    vl, xl, used_l = leading_eigenpairs(m, k, seed=0, eigen_solver="lobpcg", sqrt_deg=sqrt_deg,
                                        preconditioner=amg() if preconditioned else None)
    assert (used_a, used_l) == ("arpack", "lobpcg")
    ra, rl = spectral.eigen_residual(m, va, xa), spectral.eigen_residual(m, vl, xl)
    assert ra <= 1e-5 and rl <= spectral.LOBPCG_TOL * 1.01
    assert np.all(np.abs(vl - va) <= np.sqrt(k) * (ra + rl))
    assert va[0] == pytest.approx(1.0, abs=np.sqrt(k) * ra)  # a connected graph's top eigenvalue of M is 1
    la = spectral_clustering(w, k, seed=0)
    ll = spectral_clustering(w, k, seed=0, eigen_solver="lobpcg", preconditioner=amg() if preconditioned else None)
    assert same_partition(la, truth) and same_partition(ll, truth)


def test_stamped_residual_and_inertia_are_what_recomputing_gives(sparse_solvers):
    w, _ = planted(seed=1)
    res = spectral_states(w, 6, seed=2, eigen_solver="lobpcg")
    assert res.solvers == {"lobpcg": 1}
    # recomputed independently: the dense normalized affinity and the vectors the solver returns
    wd = w.toarray()
    d = 1 / np.sqrt(wd.sum(axis=1))
    md = d[:, None] * wd * d[None, :]
    vals, vecs, _ = leading_eigenpairs(normalized_affinity(w)[0], 6, seed=2, eigen_solver="lobpcg",
                                       sqrt_deg=normalized_affinity(w)[1])
    direct = max(np.linalg.norm(md @ vecs[:, i] - vals[i] * vecs[:, i]) for i in range(6))
    np.testing.assert_allclose(res.eigen_residual, direct, rtol=1e-6, atol=FLOAT64["atol"])
    emb = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
    lab = kmeans(emb, 6, seed=2)
    np.testing.assert_array_equal(res.labels, lab)
    centres = np.stack([emb[lab == c].mean(axis=0) for c in range(6)])
    np.testing.assert_allclose(res.inertia, np.sum((emb - centres[lab]) ** 2), rtol=1e-9)
    np.testing.assert_allclose(inertia(emb, lab), res.inertia, rtol=1e-12)


def test_arpack_is_the_default_and_the_labels_are_unchanged(sparse_solvers):
    w, _ = planted(seed=3)
    res = spectral_states(w, 6, seed=0)
    np.testing.assert_array_equal(res.labels, spectral_clustering(w, 6, seed=0))
    assert res.solvers == {"arpack": 1} and 0 <= res.eigen_residual <= 1e-5


def test_faiss_kmeans_separates_clear_blobs_and_fills_every_cluster():
    rng = np.random.default_rng(0)
    centres = 10 * rng.standard_normal((7, 5))
    truth = rng.integers(0, 7, 700)
    x = centres[truth] + 0.1 * rng.standard_normal((700, 5))
    lab = faiss_kmeans(x, 7, seed=0)
    assert same_partition(lab, truth)
    assert set(faiss_kmeans(x[:20], 20).tolist()) == set(range(20))  # k = n: one row each
    assert np.bincount(faiss_kmeans(x, 40, seed=1), minlength=40).min() >= 1


# --------------------------------------------------------------------------------------------- the command

@pytest.fixture
def graph_file(tmp_path):
    w, truth = planted(n=900, seed=4)
    n = w.shape[0]
    ids = np.asarray([f"p{i:04d}" for i in range(n)], dtype=str)
    knn = np.zeros((n, 1), dtype=np.int64)
    arrays = {"ids": ids.astype(object), "indptr": w.indptr.astype(np.int64), "indices": w.indices.astype(np.int64),
              "data": w.data.astype(np.float32), "knn_indices": knn}
    h = hash_arrays(ids, arrays["indptr"], arrays["indices"], arrays["data"], knn, extra="graph")
    path = tmp_path / "graph.zarr"
    write_artifact(path, "graph", arrays, params={"k_nn": 24}, inputs={"embeddings": "planted"}, content_hash=h)
    return path, truth


def cluster(*args):
    return runner.invoke(app, ["cluster", *map(str, args)], catch_exceptions=False)


def test_cluster_stamps_solver_residual_and_inertia(sparse_solvers, graph_file, tmp_path):
    path, truth = graph_file
    stamps = {}
    for solver, km in [("arpack", "lloyd"), ("lobpcg-amg", "faiss")]:
        if solver == "lobpcg-amg":
            amg()
        out = tmp_path / f"{solver}.zarr"
        res = cluster(path, "--out", out, "--states", 6, "--eigen-solver", solver, "--kmeans", km, "--json")
        assert res.exit_code == 0, res.stderr
        c = read_artifact(out, "clusters")
        sp_ = c.attr("spectral")
        assert json.loads(res.stdout)["spectral"] == sp_
        assert c.params["eigen_solver"] == solver and c.params["kmeans"] == km
        assert sp_["eigen_solver"] == solver and sp_["kmeans"] == km and sp_["kmeans_inertia"] > 0
        assert same_partition(c.array("labels"), truth)
        stamps[solver] = sp_
    assert stamps["arpack"]["solvers"] == {"arpack": 1} and stamps["lobpcg-amg"]["solvers"] == {"lobpcg": 1}
    assert stamps["arpack"]["eigen_residual"] <= 1e-5 <= spectral.LOBPCG_TOL
    assert stamps["lobpcg-amg"]["eigen_residual"] <= spectral.LOBPCG_TOL * 1.01
    # the same partition: the same k-means objective up to the eigenvectors' accuracy
    np.testing.assert_allclose(stamps["lobpcg-amg"]["kmeans_inertia"], stamps["arpack"]["kmeans_inertia"], rtol=1e-2)


def test_without_pyamg_lobpcg_amg_falls_back_to_arpack_with_one_line(sparse_solvers, graph_file, tmp_path,
                                                                     monkeypatch):
    monkeypatch.setitem(sys.modules, "pyamg", None)  # `import pyamg` raises ImportError, as when absent
    assert not amg_available()
    assert eigen_solver_for("lobpcg-amg")[0] == "arpack"
    out = tmp_path / "c.zarr"
    res = cluster(path := graph_file[0], "--out", out, "--states", 6, "--eigen-solver", "lobpcg-amg")
    assert res.exit_code == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if "warning" in ln]
    assert len(lines) == 1 and "pyamg is not installed" in lines[0] and "falls back to arpack" in lines[0]
    c = read_artifact(out, "clusters")
    assert c.attr("spectral")["eigen_solver"] == "arpack" and c.params["eigen_solver"] == "lobpcg-amg"
    ref = tmp_path / "ref.zarr"
    assert cluster(path, "--out", ref, "--states", 6).exit_code == 0
    np.testing.assert_array_equal(c.array("labels"), read_artifact(ref, "clusters").array("labels"))


def test_each_solver_runs_as_asked():
    if not amg_available():
        pytest.skip("pyamg not installed")
    assert eigen_solver_for("lobpcg-amg") == ("lobpcg-amg", None)
    assert eigen_solver_for("arpack") == ("arpack", None)


@pytest.mark.parametrize("flag,value,needle", [("--eigen-solver", "auto", "--eigen-solver must be one of"),
                                               ("--kmeans", "minibatch", "--kmeans must be one of")])
def test_bad_choice_is_one_line(graph_file, tmp_path, flag, value, needle):
    out = tmp_path / "c.zarr"
    res = cluster(graph_file[0], "--out", out, flag, value)
    assert res.exit_code != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("graphdiff: error:") and needle in lines[0], res.stderr
    assert not out.exists()


def test_core_refuses_an_unknown_solver():
    w, _ = planted(n=100, seed=5)
    with pytest.raises(spectral.InvalidArgumentError, match="eigen_solver must be one of"):
        spectral_states(w, 3, eigen_solver="lanczos")
