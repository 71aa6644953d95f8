"""Growing and retiring prompts mid-training: the graph extension against a rebuild from scratch,
the estimator's growth, and `graphdiff extend` / `graphdiff retire` end to end with the bundled encoder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
import scipy.sparse as sp

from graphdiff_cli.core import readout as ro
from graphdiff_cli.core.graph import exact_knn, extend_mutual_knn, mutual_knn_graph, normalize_rows
from graphdiff_cli.core.spectral import label_new_nodes
from graphdiff_cli.errors import DataError, InvalidArgumentError
from graphdiff_cli.estimator import Estimator

from _handoff_fixtures import GRAPHDIFF, tree_hash
from conftest import write_jsonl


def _clustered(n, d, topics, seed):
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(topics, d))
    return normalize_rows(c[rng.integers(0, topics, n)] + 0.6 * rng.normal(size=(n, d)))


def _same_graph(a: sp.csr_matrix, b: sp.csr_matrix) -> None:
    pattern = abs((a != 0).astype(np.int8) - (b != 0).astype(np.int8))
    assert pattern.nnz == 0, f"{pattern.nnz} edges differ"
    assert abs(a - b).max() <= 1e-6


# ------------------------------------------------------------------------------------------- core

@pytest.mark.parametrize("n,m,k,seed", [(120, 30, 5, 0), (200, 1, 8, 1), (60, 60, 6, 2), (40, 5, 39, 3),
                                        (300, 75, 12, 4)])
def test_extension_equals_the_graph_built_from_scratch(n, m, k, seed):
    x = _clustered(n + m, 12, 6, seed)
    nbr, sim = exact_knn(x[:n], k)
    ext = extend_mutual_knn(mutual_knn_graph(nbr, sim), nbr, sim, x[:n], x[n:])
    nbr_all, sim_all = exact_knn(x, k)
    _same_graph(ext.graph, mutual_knn_graph(nbr_all, sim_all))
    assert np.array_equal(np.sort(ext.neighbors, axis=1), np.sort(nbr_all, axis=1))
    assert np.allclose(ext.similarities, sim_all, atol=1e-6)  # most similar first, like the search
    # exactly the old prompts that a new prompt beats their k-th neighbour changed
    moved = [i for i in range(n) if set(nbr_all[i]) != set(nbr[i])]
    assert set(moved) <= set(ext.changed.tolist())


def test_two_extensions_equal_one_rebuild():
    x = _clustered(260, 10, 5, 7)
    nbr, sim = exact_knn(x[:200], 9)
    first = extend_mutual_knn(mutual_knn_graph(nbr, sim), nbr, sim, x[:200], x[200:230])
    second = extend_mutual_knn(first.graph, first.neighbors, first.similarities, x[:230], x[230:])
    _same_graph(second.graph, mutual_knn_graph(*exact_knn(x, 9)))


def test_extension_refuses_lists_with_holes():
    x = _clustered(10, 4, 2, 0)
    nbr, sim = exact_knn(x[:6], 3)
    w = mutual_knn_graph(nbr, sim)
    nbr[2, -1] = -1  # an approximate index's missing hit
    with pytest.raises(InvalidArgumentError, match="full kNN lists"):
        extend_mutual_knn(w, nbr, sim, x[:6], x[6:])


def test_extending_a_graph_whose_search_was_capped(tmp_path):
    """k = N - 1 < k_nn: a rebuild on more prompts uses a larger k, so every list is searched again."""
    from graphdiff_cli.io.readers import read_graph

    from conftest import PROMPT_ROWS

    write_jsonl(tmp_path / "old.jsonl", PROMPT_ROWS[:6])
    write_jsonl(tmp_path / "new.jsonl", PROMPT_ROWS[6:9])
    write_jsonl(tmp_path / "all.jsonl", PROMPT_ROWS[:9])
    for name in ("old", "all"):
        _gd("embed", tmp_path / f"{name}.jsonl", "--out", tmp_path / f"{name}.zarr", "-q")
        _gd("build-graph", tmp_path / f"{name}.zarr", "--k-nn", 10, "--out", tmp_path / f"{name}_g.zarr", "-q")
    _gd("cluster", tmp_path / "old_g.zarr", "--out", tmp_path / "c.zarr", "--states", 2, "-q")
    _gd("init", "--graph", tmp_path / "old_g.zarr", "--clusters", tmp_path / "c.zarr", "--out", tmp_path / "S", "-q")
    _gd("extend", "--state", tmp_path / "S", "--prompts", tmp_path / "new.jsonl")
    _same_graph(sp.csr_matrix(_model(tmp_path / "S")[2]), read_graph(tmp_path / "all_g.zarr").w)


def test_new_nodes_take_their_neighbours_state():
    # nodes 0-3 in state 0, 4-7 in state 1; node 8 is joined to 4-6, node 9 only to node 8 (placed second),
    # node 10 to nothing placed at all
    rows, cols = [8, 8, 8, 9], [4, 5, 6, 8]
    w = sp.coo_matrix((np.full(4, 0.5), (rows, cols)), shape=(11, 11))
    w = (w + w.T).tocsr()
    nbr = np.full((11, 2), -1)
    sims = np.zeros((11, 2), np.float32)
    labels = label_new_nodes(w, np.array([0, 0, 0, 0, 1, 1, 1, 1]), nbr, sims, 2)
    assert labels.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0]  # 10: the most common state (a tie: 0)
    # a node without mutual neighbours uses its directed list
    nbr[10] = [1, 2]
    sims[10] = [0.9, 0.8]
    assert label_new_nodes(w, np.array([0, 0, 0, 0, 1, 1, 1, 1]), nbr, sims, 2)[10] == 0


def _updated_and_grown(n_old, n_new, topics, k, steps, batch, seed, rng_seed):
    """An estimator on the first n_old of n_old + n_new clustered prompts after ``steps`` updates, with the
    graph that adds the other n_new: (estimator, W, labels, extension, labels of all prompts)."""
    x = _clustered(n_old + n_new, 8, topics, seed)
    nbr, sim = exact_knn(x[:n_old], k)
    w = mutual_knn_graph(nbr, sim)
    labels = np.arange(n_old) % topics
    est = Estimator(w, labels, topics)
    rng = np.random.default_rng(rng_seed)
    for _ in range(steps):
        ids = rng.choice(n_old, batch, replace=False)
        est.update(ids, np.full(batch, 8), rng.integers(0, 9, batch))
    ext = extend_mutual_knn(w, nbr, sim, x[:n_old], x[n_old:])
    return est, w, labels, ext, label_new_nodes(ext.graph, labels, ext.neighbors, ext.similarities, topics)


def test_estimator_grows_without_forgetting():
    est, _, labels, ext, new_labels = _updated_and_grown(80, 10, 3, 6, steps=3, batch=20, seed=5, rng_seed=0)
    before = est.state_dict()
    with pytest.raises(DataError, match="labels of the current prompts"):
        est.extend(ext.graph, np.r_[(labels + 1) % 3, new_labels[80:]])
    assert est.n_nodes == 80 and np.array_equal(est.q_, before["q"])  # a refused extend changes nothing
    changed = est.extend(ext.graph, new_labels)
    assert est.n_nodes == 90 and changed.size > 0
    after = est.state_dict()
    assert np.array_equal(after["q"][:80], before["q"]) and np.array_equal(after["a"], before["a"])
    assert np.array_equal(after["rollouts"][:80], before["rollouts"]) and not after["rollouts"][80:].any()
    assert np.isfinite(est.predict()).all()
    stats = est.update(np.array([85, 3]), np.array([8, 8]), np.array([2, 5]))
    assert stats["n_observed"] == 2 and est.rollouts_[85] == 8
    loaded = Estimator.from_state_dict(est.state_dict())
    assert np.allclose(loaded.predict(), est.predict())


def test_extend_solves_label_propagation_on_the_new_graph():
    """The default preset's label-propagation field is solved again at extend (warm from the old field, each
    new prompt at its neighbours' mean): it equals a cold solve on the grown graph and counts, so predictions
    before the next update read the new graph, and that update's solve starts warm."""
    from scipy.sparse.csgraph import connected_components

    from graphdiff_cli.core import belief as bl

    est, w, labels, ext, new_labels = _updated_and_grown(120, 30, 4, 7, steps=4, batch=25, seed=7, rng_seed=3)
    est.extend(ext.graph, new_labels)
    gs, gn = est.global_counts_
    cold = bl.harmonic_field(ext.graph, est.successes_decayed_, est.rollouts_decayed_, (gs + 1) / (gn + 2),
                             connected_components(ext.graph, directed=False)[1])
    assert est.lp_field_.shape == (150,)
    assert np.abs(est.lp_field_ - cold).max() <= 1e-4
    comps = est.mix.source("label_propagation")._components
    assert np.array_equal(comps, connected_components(ext.graph, directed=False)[1])
    # what predict reads now is what a STATE loaded from disk (field saved) reads
    assert np.allclose(Estimator.from_state_dict(est.state_dict()).predict(), est.predict())
    # before any update there is no field to carry: none is made, and the first update solves one
    fresh = Estimator(w, labels, 4)
    fresh.extend(ext.graph, new_labels)
    assert fresh.lp_field_ is None and np.isfinite(fresh.predict()).all()
    fresh.update(np.array([3, 130]), np.array([8, 8]), np.array([1, 7]))
    assert fresh.lp_field_.shape == (150,)
    # no new prompts: the field is carried over unchanged in size and still solves the (same) graph
    again = est.lp_field_.copy()
    est.extend(ext.graph, est.labels)
    assert np.abs(est.lp_field_ - again).max() <= 1e-4

def test_new_prompts_start_at_their_mean_field_fixed_point():
    """After a converged residual step, extend relaxes the new rows by Proposition 1 (old rows held): one more
    update of those rows moves nothing; under the synchronous schedule they start at A (the next step sweeps)."""
    import torch

    from graphdiff_cli.core import meanfield as mf

    rng = np.random.default_rng(9)
    topic = rng.integers(0, 4, 130)
    x = normalize_rows(rng.normal(size=(4, 8))[topic] + 0.6 * rng.normal(size=(130, 8)))
    nbr, sim = exact_knn(x[:120], 6)
    w = mutual_knn_graph(nbr, sim)
    labels = topic[:120]
    ext = extend_mutual_knn(w, nbr, sim, x[:120], x[120:])
    new_labels = label_new_nodes(ext.graph, labels, ext.neighbors, ext.similarities, 4)
    rng = np.random.default_rng(1)
    for schedule in ("residual", "synchronous"):
        est = Estimator(w, labels, 4, preset="paper", schedule=schedule, max_iters=500,
                        **({"residual_tol": 1e-6} if schedule == "residual" else {"tol": 1e-6}))
        for _ in range(3):
            ids = rng.choice(120, 15, replace=False)
            est.update(ids, np.full(15, 8), rng.integers(0, 9, 15))
        assert schedule != "residual" or est._dirty is not None  # the last step converged: q at a fixed point
        est.extend(ext.graph, new_labels)
        rows = np.arange(120, 130)
        q = est._q
        if schedule == "residual":
            none = np.full(130, -1)
            empty = mf.make_observations(np.zeros(0, int), np.zeros(0, int), np.zeros(0, int), 130)
            again = torch.softmax(mf._row_logits(est._spec, rows, q, None, None, empty, none), dim=1)
            assert float((again - q[120:]).abs().max()) <= 1e-5
            assert not np.allclose(q[120:].numpy(), mf.smoothed_prior(new_labels[120:], 4, est.settings.epsilon))
        else:
            assert np.allclose(q[120:].numpy(), mf.smoothed_prior(new_labels[120:], 4, est.settings.epsilon))


# ----------------------------------------------------------------------------------------- the CLI

def _gd(*args, ok=True, env=None):
    res = subprocess.run([str(GRAPHDIFF), *map(str, args)], capture_output=True, text=True, env=env)
    if ok:
        assert res.returncode == 0, res.stderr
    return res


@pytest.fixture(scope="module")
def split_state(tmp_path_factory):
    """The 40 hand-written prompts: a STATE built from 32 of them (real encoder, build-graph, cluster, init)
    and the other 8 as a prompts file; also the graph of all 40 built from scratch."""
    from conftest import PROMPT_ROWS

    root = tmp_path_factory.mktemp("extend")
    rng = np.random.default_rng(0)
    new = set(rng.choice(len(PROMPT_ROWS), 8, replace=False).tolist())
    old_rows = [r for i, r in enumerate(PROMPT_ROWS) if i not in new]
    new_rows = [r for i, r in enumerate(PROMPT_ROWS) if i in new]
    write_jsonl(root / "old.jsonl", old_rows)
    write_jsonl(root / "new.jsonl", new_rows)
    write_jsonl(root / "all.jsonl", old_rows + new_rows)
    for name in ("old", "all"):
        _gd("embed", root / f"{name}.jsonl", "--out", root / f"{name}_emb.zarr", "-q")
        _gd("build-graph", root / f"{name}_emb.zarr", "--k-nn", 5, "--out", root / f"{name}_g.zarr", "-q")
    _gd("cluster", root / "old_g.zarr", "--out", root / "old_c.zarr", "--states", 4, "-q")
    _gd("init", "--graph", root / "old_g.zarr", "--clusters", root / "old_c.zarr", "--out", root / "S0", "-q")
    return root, old_rows, new_rows


@pytest.fixture
def state(split_state, tmp_path):
    import shutil

    root, old_rows, new_rows = split_state
    shutil.copytree(root / "S0", tmp_path / "S")
    return tmp_path / "S", root, old_rows, new_rows


def _model(state):
    from graphdiff_cli.io.state_dir import StateDir

    return StateDir.open(state).model()


def test_extend_gives_the_graph_of_a_rebuild(state):
    from graphdiff_cli.io.readers import read_graph

    s, root, old_rows, new_rows = state
    res = json.loads(_gd("extend", "--state", s, "--prompts", root / "new.jsonl", "--json").stdout)
    assert (res["step"], res["revision"], res["added"], res["n_prompts"]) == (0, 1, 8, 40)
    _art, ids, w, labels, _config = _model(s)
    assert ids == [r["id"] for r in old_rows + new_rows]
    scratch = read_graph(root / "all_g.zarr")
    assert scratch.ids == ids
    _same_graph(sp.csr_matrix(w), scratch.w)
    assert labels.shape == (40,) and labels.max() < 4
    # the next update may name the new prompts, predict serves them
    write_jsonl(root / "o1.jsonl", [{"id": new_rows[0]["id"], "n": 8, "s": 2}, {"id": old_rows[0]["id"], "n": 8, "s": 8}])
    _gd("update", "--state", s, "--step", 1, "--outcomes", root / "o1.jsonl")
    _gd("predict", "--state", s, "--out", root / "p.jsonl")
    rows = [json.loads(line) for line in open(root / "p.jsonl")]
    assert len(rows) == 40 and rows[-8]["n_seen"] == 8 and rows[-8]["id"] == new_rows[0]["id"]
    status = json.loads(_gd("status", "--state", s, "--json").stdout)
    assert status["joined"] == {"0": 40} and status["n_prompts"] == 40 and status["n_applied"] == 1


class _Phases:
    """A listener that draws phases, as the CLI's does: the calls under each label."""

    def __init__(self):
        self.lines = [["start"]]

    def phase(self, label, unit=None):
        self.lines.append([label])

    def __call__(self, done, total=None):
        self.lines[-1].append((done, total))


@pytest.mark.parametrize("labelled", [True, False])
def test_extend_shows_the_encoding_as_its_own_phase_with_a_count_of_prompts(state, labelled):
    """A listener that draws phases (the CLI's) gets the encoding as a labelled line counting the new prompts (its
    ETA from the first batch), then the extension's steps; a plain function gets the four steps alone."""
    from graphdiff_cli import State

    s, root, _old_rows, new_rows = state
    listener = _Phases()
    plain = []
    State.open(s).extend(root / "new.jsonl",
                         progress=listener if labelled else lambda done, total=None: plain.append((done, total)))
    if labelled:
        assert [line[0] for line in listener.lines] == ["start", f"embedding {len(new_rows)} new prompts",
                                                         "extending the prompt set"]
        assert listener.lines[1][-1] == (len(new_rows), len(new_rows))
        assert listener.lines[2][-1] == (4, 4)
    else:
        assert all(total == 4 for _done, total in plain) and plain[-1] == (4, 4)


def test_the_readout_lives_in_the_state_and_grows_with_extend(split_state, tmp_path):
    """init keeps the embeddings the graph was built from when the read-out is on (and says so); extend adds the
    new prompts' rows, so the read-out predicts them at once; the paper preset keeps none."""
    from graphdiff_cli import State
    from graphdiff_cli.io.readers import embedding_matrix, read_graph

    root, old_rows, new_rows = split_state
    s = tmp_path / "R"
    res = json.loads(_gd("init", "--graph", root / "old_g.zarr", "--clusters", root / "old_c.zarr", "--out", s,
                         "--readout", "1", "--readout-ridge", "10", "--no-covariates", "--json").stdout)
    assert res["readout"]["on"] and res["readout"]["dim"] == 384 and res["readout"]["bytes"] == 32 * 384 * 4
    want = embedding_matrix(root / "old_emb.zarr", read_graph(root / "old_g.zarr")).astype(np.float32)
    np.testing.assert_array_equal(State.open(s).estimator().embeddings, want)
    assert json.loads(_gd("status", "--state", s, "--json").stdout)["readout_on"] is True
    write_jsonl(tmp_path / "o1.jsonl", [{"id": r["id"], "n": 8, "s": i % 9} for i, r in enumerate(old_rows[:12])])
    _gd("update", "--state", s, "--step", 1, "--outcomes", tmp_path / "o1.jsonl")
    _gd("extend", "--state", s, "--prompts", root / "new.jsonl")
    est = State.open(s).estimator()
    assert est.n_nodes == 40 and est.embeddings.shape == (40, 384) and est.readout_ == 1.0
    everything = embedding_matrix(root / "all_emb.zarr", read_graph(root / "all_g.zarr"))
    np.testing.assert_allclose(est.embeddings[32:], everything[32:], atol=1e-6)  # all.jsonl: old rows, then new
    theta = ro.solve(est.readout_gram_, est.readout_moment_, 10.0)
    np.testing.assert_allclose(est.predict(np.arange(32, 40)), ro.predict(theta, ro.features(est.embeddings[32:]), 0.5),
                               atol=1e-9)
    paper = json.loads(_gd("init", "--graph", root / "old_g.zarr", "--clusters", root / "old_c.zarr", "--out",
                           tmp_path / "P", "--preset", "paper", "--json").stdout)
    assert not paper["readout"]["on"] and State.open(tmp_path / "P").estimator().embeddings is None


def test_extend_refusals_change_nothing(state, tmp_path):
    s, root, old_rows, new_rows = state
    before = tree_hash(s)
    cases = [
        (write_jsonl(tmp_path / "dup.jsonl", [new_rows[0], new_rows[0]]), "duplicate id"),
        (write_jsonl(tmp_path / "have.jsonl", [old_rows[3]]), "already in the STATE"),
        (write_jsonl(tmp_path / "text.jsonl", [{**old_rows[3], "id": "fresh"}]), "same text as"),
        (write_jsonl(tmp_path / "twice.jsonl", [new_rows[0], {**new_rows[0], "id": "fresh"}]), "same text as"),
        (write_jsonl(tmp_path / "empty.jsonl", []), "no prompts"),
    ]
    for path, message in cases:
        res = _gd("extend", "--state", s, "--prompts", path, ok=False)
        assert res.returncode != 0 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    _gd("embed", root / "new.jsonl", "--out", tmp_path / "raw.zarr", "--no-instruction", "-q")
    res = _gd("extend", "--state", s, "--embedded", tmp_path / "raw.zarr", ok=False)
    assert "made with instruction None" in res.stderr
    res = _gd("extend", "--state", s, ok=False)
    assert "one of the two" in res.stderr
    assert tree_hash(s) == before


def test_extend_with_embeddings_made_elsewhere_and_rollback(state, tmp_path):
    s, root, old_rows, new_rows = state
    _gd("embed", root / "new.jsonl", "--out", tmp_path / "new_emb.zarr", "-q")
    write_jsonl(tmp_path / "o1.jsonl", [{"id": old_rows[1]["id"], "n": 4, "s": 1}])
    _gd("update", "--state", s, "--step", 1, "--outcomes", tmp_path / "o1.jsonl")
    res = json.loads(_gd("extend", "--state", s, "--embedded", tmp_path / "new_emb.zarr", "--json").stdout)
    assert res["version"] == "1.1" and res["undo"].endswith("--to 1.0")
    assert json.loads(_gd("status", "--state", s, "--json").stdout)["joined"] == {"0": 32, "1": 8}
    assert (s / "models" / "1.1.zarr").is_dir()
    _gd("rollback", "--state", s, "--to", "1.0")
    _art, ids, _w, _labels, _config = _model(s)
    assert len(ids) == 32 and not any((s / "models").iterdir())  # the model went with its version
    res = _gd("update", "--state", s, "--step", 2, "--outcomes",
              write_jsonl(tmp_path / "o2.jsonl", [{"id": new_rows[0]["id"], "n": 4, "s": 1}]), ok=False)
    assert "unknown" in res.stderr or "not in" in res.stderr, res.stderr
    # --to T: the newest retained revision of T (what the trainer's step T + 1 saw)
    _gd("extend", "--state", s, "--embedded", tmp_path / "new_emb.zarr")
    _gd("rollback", "--state", s, "--to", 1)
    assert len(_model(s)[1]) == 40
    res = _gd("rollback", "--state", s, "--to", "1.x", ok=False)
    assert "T.R" in res.stderr


def test_retire_and_restore(state, tmp_path):
    s, root, old_rows, _new = state
    gone = [old_rows[i]["id"] for i in (0, 5, 9)]
    (tmp_path / "gone.txt").write_text("\n".join(gone) + "\n")
    res = json.loads(_gd("retire", "--state", s, "--ids", tmp_path / "gone.txt", "--json").stdout)
    assert (res["version"], res["n_retired"], res["active"]) == ("0.1", 3, 29)
    before = tree_hash(s)
    assert "already retired" in _gd("retire", "--state", s, "--ids", tmp_path / "gone.txt", ok=False).stderr
    assert tree_hash(s) == before
    _gd("predict", "--state", s, "--out", tmp_path / "p.jsonl")
    served = [json.loads(line)["id"] for line in open(tmp_path / "p.jsonl")]
    assert len(served) == 29 and not set(served) & set(gone)
    # outcomes of a retired prompt still count (a batch in flight), and the retirement survives the update
    write_jsonl(tmp_path / "o1.jsonl", [{"id": gone[0], "n": 8, "s": 3}])
    _gd("update", "--state", s, "--step", 1, "--outcomes", tmp_path / "o1.jsonl")
    (tmp_path / "pool.txt").write_text("\n".join(r["id"] for r in old_rows) + "\n")
    sel = json.loads(_gd("select", "--state", s, "--candidates", tmp_path / "pool.txt", "--batch-size", 29,
                         "--strategy", "uniform", "--out", tmp_path / "sel.txt", "--json").stdout)
    assert sel["pool"] == 29 and sel["retired_skipped"] == 3 and not set(sel["ids"]) & set(gone)
    (tmp_path / "back.txt").write_text(gone[1] + "\n")
    _gd("retire", "--state", s, "--ids", tmp_path / "back.txt", "--restore")
    assert json.loads(_gd("status", "--state", s, "--json").stdout)["retired"] == 2
    (tmp_path / "fresh.txt").write_text(old_rows[2]["id"] + "\n")
    assert "not retired" in _gd("retire", "--state", s, "--ids", tmp_path / "fresh.txt", "--restore",
                                ok=False).stderr


@pytest.mark.parametrize("point", ["model", "artifact", "log", "current"])
def test_extend_killed_midway_leaves_a_whole_version(state, tmp_path, point):
    s, root, _old, _new = state
    env = {**os.environ, "GRAPHDIFF_TEST_PAUSE_AFTER": point, "GRAPHDIFF_TEST_PAUSE_FILE": str(tmp_path / "go")}
    proc = subprocess.Popen([str(GRAPHDIFF), "extend", "--state", str(s), "--prompts", str(root / "new.jsonl")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (tmp_path / "go.reached").exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n = len(_model(s)[1])
    assert n == (40 if point == "current" else 32)  # CURRENT moves last: before it, the old version stands
    _gd("predict", "--state", s, "--out", tmp_path / "p.jsonl")
    if point != "current":
        _gd("extend", "--state", s, "--prompts", root / "new.jsonl")  # re-running completes, debris goes
        assert sorted(p.name for p in (s / "models").iterdir()) == ["0.1.zarr"]
    _gd("verify", s)
    assert len(_model(s)[1]) == 40


def test_watch_applies_prompt_files_before_their_step_exactly_once(state, tmp_path):
    s, root, old_rows, new_rows = state
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    write_jsonl(inbox / "step-000001.jsonl", [{"id": old_rows[0]["id"], "n": 8, "s": 4}])
    write_jsonl(inbox / "prompts-000002.jsonl", new_rows)
    write_jsonl(inbox / "step-000002.jsonl", [{"id": new_rows[0]["id"], "n": 8, "s": 1}])  # a new prompt at once
    (inbox / "retire-000003.txt").write_text(new_rows[1]["id"] + "\n")
    write_jsonl(inbox / "step-000003.jsonl", [{"id": old_rows[1]["id"], "n": 8, "s": 8}])
    res = json.loads(_gd("watch", "--state", s, "--inbox", inbox, "--once", "--predictions",
                         tmp_path / "p.jsonl", "--json").stdout)
    assert res["step"] == 3 and res["n_applied"] == 3
    assert [(c["kind"], c["version"]) for c in res["prompt_set_changes"]] == [("prompts", "1.1"), ("retire", "2.1")]
    status = json.loads(_gd("status", "--state", s, "--json").stdout)
    assert (status["n_prompts"], status["retired"], status["joined"]) == (40, 1, {"0": 32, "1": 8})
    served = {json.loads(line)["id"] for line in open(tmp_path / "p.jsonl")}
    assert len(served) == 39 and new_rows[1]["id"] not in served
    again = json.loads(_gd("watch", "--state", s, "--inbox", inbox, "--once", "--json").stdout)
    assert again["n_applied"] == 0 and again["prompt_set_changes"] == [] and again["conflicts"] == []
    # a prompts file for a step already applied came late: reported, left alone
    write_jsonl(inbox / "prompts-000002.jsonl", [{"id": "late", "prompt": "What is 40 + 2?"}])
    late = json.loads(_gd("watch", "--state", s, "--inbox", inbox, "--once", "--json").stdout)
    assert late["conflicts"] and late["conflicts"][0]["late"] and len(_model(s)[1]) == 40


def test_trainer_target_follows_extend_and_retire(state, tmp_path):
    from graphdiff_cli.integrations.tracking import BatchChooser, StateTarget
    from graphdiff_cli.integrations.trl import GraphdiffTRL

    s, root, old_rows, new_rows = state
    trl = GraphdiffTRL(str(s), durable=False)
    target = trl.target
    assert isinstance(target, StateTarget) and len(target.ids) == 32
    trl.extend(root / "new.jsonl")
    nodes = target.nodes([r["id"] for r in old_rows + new_rows])
    assert nodes.tolist() == list(range(40))
    (tmp_path / "gone.txt").write_text("\n".join(r["id"] for r in old_rows[:30]) + "\n")
    trl.retire(tmp_path / "gone.txt")
    chooser = BatchChooser(target, nodes, batch_size=5, strategy="uniform", pool_factor=2)
    for b in range(6):
        assert set(chooser.choose(0, b).tolist()) <= set(range(30, 40))  # rows of the retired never drawn
    with pytest.raises(Exception, match="not retired"):
        BatchChooser(target, nodes, batch_size=11, strategy="uniform").choose(0, 0)
    stats = target.apply(1, [new_rows[2]["id"]], np.array([8]), np.array([3]))
    assert stats["step"] == 1 and target.estimates(nodes[-8:])["n_seen"][2] == 8


def test_resident_handoff_follows_a_rollback_and_another_extend_under_the_same_model_name(state, tmp_path):
    from graphdiff_cli import State

    s, root, old_rows, new_rows = state
    write_jsonl(tmp_path / "a.jsonl", new_rows[:4])
    write_jsonl(tmp_path / "b.jsonl", new_rows[4:])
    h = State.open(s, durable=False)
    h.extend(tmp_path / "a.jsonl")
    _gd("rollback", "--state", s, "--to", "0.0")
    _gd("extend", "--state", s, "--prompts", tmp_path / "b.jsonl")  # models/0.1.zarr again, other prompts
    write_jsonl(tmp_path / "o1.jsonl", [{"id": new_rows[5]["id"], "n": 8, "s": 2}])
    res = h.update(1, tmp_path / "o1.jsonl")
    assert res["step"] == 1 and h.estimator().n_nodes == 36 and h.loads == 2
    assert h.index.ids[-4:] == [r["id"] for r in new_rows[4:]]
    _gd("verify", s)
    assert json.loads(_gd("status", "--state", s, "--json").stdout)["n_prompts"] == 36


def test_keep_counts_steps_not_revisions(state, tmp_path):
    s, root, old_rows, _new = state
    for t in (1, 2, 3):
        write_jsonl(tmp_path / f"o{t}.jsonl", [{"id": old_rows[t]["id"], "n": 4, "s": 1}])
        _gd("update", "--state", s, "--step", t, "--outcomes", tmp_path / f"o{t}.jsonl")
        for j in range(3):  # three revisions per step
            (tmp_path / "x.txt").write_text(old_rows[10 + 3 * t + j]["id"] + "\n")
            _gd("retire", "--state", s, "--ids", tmp_path / "x.txt")
    status = json.loads(_gd("status", "--state", s, "--json").stdout)
    assert status["retained"] == [0, 1, 2, 3] and status["retired"] == 9  # keep 5: no step is pruned
    _gd("rollback", "--state", s, "--to", 1)
    assert json.loads(_gd("status", "--state", s, "--json").stdout)["retired"] == 3  # step 1's newest revision
