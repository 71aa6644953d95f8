"""Delta steps (issue 32): an update writes the rows of q that changed since the step before, q whole at every
``snapshot_every``-th step; reading composes them, bit for bit what the estimator held, and pruning, rollback and
verify keep every step a retained delta is composed from."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from _handoff_fixtures import make_inputs, step_rows, tree_hash
from graphdiff_cli.errors import ArtifactError
from graphdiff_cli.estimator import Estimator
from graphdiff_cli.io.artifacts import read_artifact
from graphdiff_cli.io.estimator_layout import Q_ROWS, Q_VALUES
from graphdiff_cli.io.estimator_store import compose_q, step_chain
from graphdiff_cli.io.layout import step_relpath
from graphdiff_cli.state import State

N = 600


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("inputs"), n=N, k_states=6, k_nn=8)


def rows_at(ids, t, size=12):
    """A batch of ``size`` prompts of step t (the fixtures' rows for the whole pool are too many: every row of q
    would move)."""
    rng = np.random.default_rng(t)
    return [r for r in step_rows(ids, t) if r["id"] in set(rng.choice(ids, size, replace=False))] or \
        [{"id": ids[t], "n": 8, "s": 3}]


def step_art(st, t, r=0):
    return read_artifact(st.path / step_relpath(t, r), "estimator-step")


def assert_same_state(a: dict, b: dict):
    for k in a:
        if k in ("graph", "config", "embeddings", "version", "n_states", "labels"):
            continue
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def test_a_step_writes_the_rows_that_changed_and_reads_back_as_the_estimator_held_it(tmp_path, inputs):
    graph, clusters, ids = inputs
    st = State.init(graph, clusters, tmp_path / "S", device="cpu", keep=3, keep_every=0, snapshot_every=5,
                    durable=False)
    full = State.init(graph, clusters, tmp_path / "F", device="cpu", keep=3, keep_every=0, snapshot_every=1,
                      durable=False)
    kinds = []
    for t in range(1, 13):
        rows = rows_at(ids, t)
        before = st.estimator().q_.copy()
        st.update(t, rows)
        full.update(t, rows)
        art = step_art(st, t)
        kinds.append("delta" if art.attr("base") is not None else "whole")
        held = st.estimator().state_dict()
        read = Estimator.load(st.path, device="cpu").state_dict()
        assert_same_state(held, read)  # composed from the snapshot and every delta since: bit for bit
        assert_same_state(read, Estimator.load(full.path, device="cpu").state_dict())  # = q written whole
        if kinds[-1] == "delta":
            rows_written = art.array(Q_ROWS)
            moved = np.flatnonzero((held["q"] != before).any(axis=1))
            assert np.isin(moved, rows_written).all() and rows_written.size < N // 2
            assert art.attr("base") == f"../{t - 1:08d}.zarr" and art.attr("delta_depth") == t - (1 if t < 5 else t // 5 * 5)
            assert "q" not in art.names and art.array(Q_VALUES).shape == (rows_written.size, 6)
        assert "q" in step_art(full, t).names and step_art(full, t).attr("base") is None  # --snapshot-every 1
    # step 1 follows init (every row may move), 5 and 10 are multiples of snapshot_every
    assert kinds == ["whole", "delta", "delta", "delta", "whole", "delta", "delta", "delta", "delta", "whole",
                     "delta", "delta"]
    disk = st.status()["disk_bytes"]["steps"]
    assert disk < full.status()["disk_bytes"]["steps"]


def test_pruning_keeps_what_a_retained_delta_is_composed_from(tmp_path, inputs):
    graph, clusters, ids = inputs
    st = State.init(graph, clusters, tmp_path / "S", device="cpu", keep=3, keep_every=0, snapshot_every=5,
                    durable=False)
    retained = {}
    for t in range(1, 13):
        st.update(t, rows_at(ids, t))
        retained[t] = st.dir.retained_steps()
    assert retained[9] == [0, 5, 6, 7, 8, 9]  # the last three (7-9), and 5-6 their q is composed from
    assert retained[10] == [0, 5, 6, 7, 8, 9, 10]
    assert retained[11] == [0, 5, 6, 7, 8, 9, 10, 11]
    assert retained[12] == [0, 10, 11, 12]
    assert st.verify()["intact"]
    # a kept step whose zarr.json cannot be read: which steps it needs is unknown, so nothing is pruned (warned)
    meta = st.path / step_relpath(11) / "zarr.json"
    good = meta.read_bytes()
    meta.write_text("{")
    res = st.retention(keep=2)
    assert res["pruned"] == [] and "00000011.zarr: unreadable zarr.json" in res["warnings"][0]
    assert st.dir.retained_steps() == [0, 10, 11, 12]
    meta.write_bytes(good)
    res = st.retention(keep=2, keep_every=3)
    assert res["snapshot_every"] == 5 and res["warnings"] == [] and st.dir.retained_steps() == [0, 10, 11, 12]


def test_rollback_to_a_delta_reads_it_and_the_next_update_builds_on_it(tmp_path, inputs):
    graph, clusters, ids = inputs
    st = State.init(graph, clusters, tmp_path / "S", device="cpu", keep=6, keep_every=0, snapshot_every=50,
                    durable=False)
    at = {}
    for t in range(1, 7):
        st.update(t, rows_at(ids, t))
        at[t] = st.estimator().state_dict()
    st.rollback(4)
    assert_same_state(Estimator.load(st.path, device="cpu").state_dict(), at[4])
    st.update(5, rows_at(ids, 50))
    art = step_art(st, 5)
    assert art.attr("base") == "../00000004.zarr"
    assert_same_state(Estimator.load(st.path, device="cpu").state_dict(), st.estimator().state_dict())


def test_a_retire_writes_q_whole_and_updates_go_on_as_deltas_of_it(tmp_path, inputs):
    """(extend's revision is written whole too: it never hands the writer changed rows)"""
    graph, clusters, ids = inputs
    st = State.init(graph, clusters, tmp_path / "S", device="cpu", snapshot_every=50, durable=False)
    for t in range(1, 4):
        st.update(t, rows_at(ids, t))
    st.retire(ids[:5])
    assert step_art(st, 3, 1).attr("base") is None and "q" in step_art(st, 3, 1).names
    st.update(4, rows_at(ids, 4))
    assert step_art(st, 4).attr("base") == "../00000003.1.zarr"
    assert_same_state(Estimator.load(st.path, device="cpu").state_dict(), st.estimator().state_dict())


def test_a_delta_whose_base_is_missing_or_another_is_refused_in_one_line(tmp_path, inputs):
    graph, clusters, ids = inputs
    st = State.init(graph, clusters, tmp_path / "S", device="cpu", keep=5, keep_every=0, snapshot_every=50,
                    durable=False)
    for t in range(1, 5):
        st.update(t, rows_at(ids, t))
    assert [a.attr("step") for a in step_chain(step_art(st, 4))] == [1, 2, 3, 4]
    s2 = tmp_path / "S2"
    shutil.copytree(st.path, s2)
    shutil.rmtree(s2 / step_relpath(2))  # a base removed by hand
    before = tree_hash(s2)
    with pytest.raises(ArtifactError, match=r"00000003.zarr: holds the rows of q that changed since 00000002.zarr, "
                                            r"which cannot be read"):
        Estimator.load(s2, device="cpu")
    report = State.open(s2).verify()
    assert not report["intact"] and any("00000002.zarr" in p for p in report["problems"])
    with pytest.raises(ArtifactError, match="cannot be read"):
        State.open(s2, durable=False).rollback(3)
    assert tree_hash(s2) == before
    # another step's folder put in the base's place: its content hash is not the one the delta was made from
    s3 = tmp_path / "S3"
    shutil.copytree(st.path, s3)
    shutil.rmtree(s3 / step_relpath(2))
    shutil.copytree(st.path / step_relpath(1), s3 / step_relpath(2))
    with pytest.raises(ArtifactError, match="was made from a 00000002.zarr with content hash"):
        compose_q(step_art(State.open(s3), 4))


def test_q_rows_changed_covers_every_row_a_step_moved(inputs):
    from graphdiff_cli.io.readers import read_graph

    graph, clusters, ids = inputs
    w = read_graph(graph).w
    labels = read_artifact(clusters, "clusters").array("labels")
    est = Estimator(w, labels, n_states=6, device="cpu")
    assert est.q_rows_changed() is None  # built from a graph: nothing on disk to compare with
    est = Estimator.from_state_dict(est.state_dict())  # as read from step 0
    assert est.q_rows_changed().size == 0
    est.update(np.arange(10), np.full(10, 8), np.arange(10) % 8)
    assert est.q_rows_changed() is None  # the first step relaxes every row
    est.mark_saved()
    for t in range(2, 6):
        before = est.q_.copy()
        ids_t = np.random.default_rng(t).choice(N, 12, replace=False)
        est.update(ids_t, np.full(12, 8), np.arange(12) % 9)
        moved = np.flatnonzero((est.q_ != before).any(axis=1))
        assert np.isin(moved, est.q_rows_changed()).all() and est.q_rows_changed().size < N
    paper = Estimator(w, labels, n_states=6, device="cpu", preset="paper")
    paper.mark_saved()
    paper.update(np.arange(10), np.full(10, 8), np.arange(10) % 8)
    assert paper.q_rows_changed() is None  # a full sweep: any row


def test_rows_counted_from_another_step_than_the_current_one_write_q_whole(tmp_path, inputs):
    """The resident estimator's changed rows count from the step artifact it read or wrote; when the current step's
    folder is not that one (put back by hand under the same CURRENT), the update writes q whole."""
    graph, clusters, ids = inputs
    st = State.init(graph, clusters, tmp_path / "S", device="cpu", durable=False)
    for t in range(1, 4):
        st.update(t, rows_at(ids, t))
    assert step_art(st, 3).attr("base") is not None and st._est_source == step_art(st, 3).content_hash
    st._est_source = "0" * 16  # as if steps/00000003.zarr had been replaced since the estimator wrote it
    st.update(4, rows_at(ids, 4))
    assert step_art(st, 4).attr("base") is None and "q" in step_art(st, 4).names
    assert_same_state(Estimator.load(st.path, device="cpu").state_dict(), st.estimator().state_dict())
    st.update(5, rows_at(ids, 5))
    assert step_art(st, 5).attr("base") == "../00000004.zarr"


def test_verify_refuses_a_delta_whose_rows_do_not_fit(tmp_path, inputs):
    """A delta written with rows out of order (its checksums intact: a writer's bug, not damage) is named by verify
    and refused by every reader, as one whose rows lie outside q."""
    from graphdiff_cli.io.artifacts import write_artifact

    graph, clusters, ids = inputs
    st = State.init(graph, clusters, tmp_path / "S", device="cpu", durable=False)
    for t in range(1, 4):
        st.update(t, rows_at(ids, t))
    art = step_art(st, 3)
    arrays = {name: art.array(name) for name in art.names}
    arrays[Q_ROWS] = arrays[Q_ROWS][::-1].copy()
    attrs = {k: v for k, v in art.group.attrs.items() if k != "graphdiff"}
    stamp = art.stamp
    shutil.rmtree(art.path)
    write_artifact(art.path, "estimator-step", arrays, inputs=stamp["inputs"], attrs=attrs,
                   content_hash=stamp["content_hash"], durable=False)
    report = State.open(st.path).verify()
    assert not report["intact"] and any("do not fit" in p for p in report["problems"])
    with pytest.raises(ArtifactError, match="do not fit"):
        Estimator.load(st.path, device="cpu")
