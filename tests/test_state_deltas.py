"""Delta steps: an update writes the rows of q that changed since the step before, q whole at every
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
from graphdiff_cli.io.estimator_store import compose_q, folder_bytes, step_chain
from graphdiff_cli.io.layout import step_relpath
from graphdiff_cli.state import State

N, K = 600, 40  # K large enough that a delta's rows weigh less than q whole


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("inputs"), n=N, k_states=K, k_nn=8)


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


def chain_facts(st, t):
    """(kind, base step, depth, snapshot bytes, chain bytes) of step t as its zarr.json says."""
    a = step_art(st, t)
    if a.attr("base") is None:
        return "whole", None, 0, None, None
    return "delta", a.attr("base"), a.attr("delta_depth"), a.attr("snapshot_bytes"), a.attr("chain_bytes")


def closure(st, versions):
    """``versions`` and every step their q is composed from, followed by hand from each zarr.json."""
    out, todo = set(), list(versions)
    while todo:
        t = todo.pop()
        if t not in out:
            out.add(t)
            kind, base, *_ = chain_facts(st, t)
            if kind == "delta":
                todo.append(int(base[3:11]))
    return out


def test_a_step_writes_the_rows_that_changed_and_reads_back_as_the_estimator_held_it(tmp_path, inputs):
    graph, clusters, ids = inputs
    st = State.init(graph, clusters, tmp_path / "S", device="cpu", keep=3, keep_every=0, snapshot_every=5,
                    durable=False)
    full = State.init(graph, clusters, tmp_path / "F", device="cpu", keep=3, keep_every=0, snapshot_every=1,
                      durable=False)
    kinds, sizes = {}, {}
    for t in range(1, 13):
        rows = rows_at(ids, t)
        before = st.estimator().q_.copy()
        st.update(t, rows)
        full.update(t, rows)
        art = step_art(st, t)
        sizes[t] = folder_bytes(art.path)
        kind, base, depth, snap_bytes, chain_bytes = chain_facts(st, t)
        kinds[t] = kind
        held = st.estimator().state_dict()
        read = Estimator.load(st.path, device="cpu").state_dict()
        assert_same_state(held, read)  # composed from the snapshot and every delta since: bit for bit
        assert_same_state(read, Estimator.load(full.path, device="cpu").state_dict())  # = q written whole
        # the chain before step t, measured here: its snapshot and the deltas after it
        prev = [u for u in range(1, t)]
        last_whole = max([u for u in prev if kinds[u] == "whole"], default=None)
        since = [u for u in prev if last_whole is not None and u > last_whole]
        if kind == "delta":
            rows_written = art.array(Q_ROWS)
            moved = np.flatnonzero((held["q"] != before).any(axis=1))
            assert np.isin(moved, rows_written).all() and rows_written.size < N // 2
            assert "q" not in art.names and art.array(Q_VALUES).shape == (rows_written.size, K)
            assert base == f"../{t - 1:08d}.zarr" and depth == len(since) + 1 < 5
            assert (snap_bytes, chain_bytes) == (sizes[last_whole], sum(sizes[u] for u in since))
            assert chain_bytes < snap_bytes
        else:  # step 1 follows init (every row may move), 5 and 10 are multiples of snapshot_every, else the
            # deltas since the last snapshot took as much room as it
            assert t in (1, 5, 10) or len(since) == 4 or sum(sizes[u] for u in since) >= sizes[last_whole]
        assert "q" in step_art(full, t).names and step_art(full, t).attr("base") is None  # --snapshot-every 1
    assert list(kinds.values()).count("delta") >= 5
    assert [kinds[t] for t in (1, 2, 5, 6, 10, 11)] == ["whole", "delta"] * 3  # a delta always follows a snapshot


def test_pruning_keeps_what_a_retained_delta_is_composed_from(tmp_path, inputs):
    graph, clusters, ids = inputs
    st = State.init(graph, clusters, tmp_path / "S", device="cpu", keep=3, keep_every=0, snapshot_every=5,
                    durable=False)
    beyond = 0
    for t in range(1, 13):
        st.update(t, rows_at(ids, t))
        kept = {0} | set(range(max(1, t - 2), t + 1))  # step 0 and the last three
        assert set(st.dir.retained_steps()) == closure(st, kept)  # and exactly what their q is composed from
        beyond += len(closure(st, kept) - kept)
    assert beyond > 0  # some step was kept only for a delta's sake
    assert st.verify()["intact"]
    # a kept step whose zarr.json cannot be read: which steps it needs is unknown, so nothing is pruned (warned)
    meta = st.path / step_relpath(11) / "zarr.json"
    good = meta.read_bytes()
    meta.write_text("{")
    before = st.dir.retained_steps()
    res = st.retention(keep=2)
    assert res["pruned"] == [] and "00000011.zarr: unreadable zarr.json" in res["warnings"][0]
    assert st.dir.retained_steps() == before
    meta.write_bytes(good)
    res = st.retention(keep=2, keep_every=3)
    assert res["snapshot_every"] == 5 and res["warnings"] == []
    assert set(st.dir.retained_steps()) == closure(st, {0, 11, 12} | {t for t in before if t % 3 == 0})


def test_rollback_to_a_delta_reads_it_and_the_next_update_builds_on_it(tmp_path, inputs):
    graph, clusters, ids = inputs
    st = State.init(graph, clusters, tmp_path / "S", device="cpu", keep=6, keep_every=0, snapshot_every=50,
                    durable=False)
    at = {}
    for t in range(1, 7):
        st.update(t, rows_at(ids, t))
        at[t] = st.estimator().state_dict()
    assert chain_facts(st, 2)[0] == "delta"
    st.rollback(2)
    assert_same_state(Estimator.load(st.path, device="cpu").state_dict(), at[2])
    st.update(3, rows_at(ids, 50))  # the estimator read again after the rollback: its rows count from step 2
    kind, base, _depth, snap_bytes, chain_bytes = chain_facts(st, 3)
    assert (kind, base) == ("delta", "../00000002.zarr") and chain_bytes < snap_bytes
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
    assert step_art(st, 4).attr("base") == "../00000003.1.zarr"  # a delta always follows a snapshot
    assert_same_state(Estimator.load(st.path, device="cpu").state_dict(), st.estimator().state_dict())


def test_a_delta_whose_base_is_missing_or_another_is_refused_in_one_line(tmp_path, inputs):
    graph, clusters, ids = inputs
    st = State.init(graph, clusters, tmp_path / "S", device="cpu", keep=5, keep_every=0, snapshot_every=50,
                    durable=False)
    for t in range(1, 4):
        st.update(t, rows_at(ids, t))
    st.retention(snapshot_every=2)  # 4 is a snapshot (a multiple of 2)
    st.update(4, rows_at(ids, 4))
    st.retention(snapshot_every=50)
    for t in (5, 6, 7):
        st.update(t, rows_at(ids, t))
    assert [a.attr("step") for a in step_chain(step_art(st, 6))] == [4, 5, 6]
    s2 = tmp_path / "S2"
    shutil.copytree(st.path, s2)
    shutil.rmtree(s2 / step_relpath(5))  # a base removed by hand
    before = tree_hash(s2)
    with pytest.raises(ArtifactError, match=r"00000006.zarr: holds the rows of q that changed since 00000005.zarr, "
                                            r"which cannot be read"):
        compose_q(step_art(State.open(s2), 6))
    report = State.open(s2).verify()
    assert not report["intact"] and any("00000005.zarr" in p for p in report["problems"])
    with pytest.raises(ArtifactError, match="cannot be read"):
        State.open(s2, durable=False).rollback(6)
    assert tree_hash(s2) == before
    # another step's folder put in the base's place: its content hash is not the one the delta was made from
    s3 = tmp_path / "S3"
    shutil.copytree(st.path, s3)
    shutil.rmtree(s3 / step_relpath(5))
    shutil.copytree(st.path / step_relpath(4), s3 / step_relpath(5))
    with pytest.raises(ArtifactError, match="was made from a 00000005.zarr with content hash"):
        compose_q(step_art(State.open(s3), 6))


def test_q_rows_changed_covers_every_row_a_step_moved(inputs):
    from graphdiff_cli.io.readers import read_graph

    graph, clusters, ids = inputs
    w = read_graph(graph).w
    labels = read_artifact(clusters, "clusters").array("labels")
    est = Estimator(w, labels, n_states=K, device="cpu")
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
    paper = Estimator(w, labels, n_states=K, device="cpu", preset="paper")
    paper.mark_saved()
    paper.update(np.arange(10), np.full(10, 8), np.arange(10) % 8)
    assert paper.q_rows_changed() is None  # a full sweep: any row


def test_rows_counted_from_another_step_than_the_current_one_write_q_whole(tmp_path, inputs):
    """The resident estimator's changed rows count from the step artifact it read or wrote; when the current step's
    folder is not that one (put back by hand under the same CURRENT), the update writes q whole."""
    graph, clusters, ids = inputs
    st = State.init(graph, clusters, tmp_path / "S", device="cpu", durable=False)
    st.update(1, rows_at(ids, 1))  # whole (init's first update): the next step would be a delta of it
    assert st._est_source == step_art(st, 1).content_hash
    st._est_source = "0" * 16  # as if steps/00000001.zarr had been replaced since the estimator wrote it
    st.update(2, rows_at(ids, 2))
    assert step_art(st, 2).attr("base") is None and "q" in step_art(st, 2).names
    assert_same_state(Estimator.load(st.path, device="cpu").state_dict(), st.estimator().state_dict())
    # a fresh object (what each CLI call is) counts its rows from the step it read: a delta of it
    State.open(st.path, durable=False).update(3, rows_at(ids, 3))
    assert step_art(st, 3).attr("base") == "../00000002.zarr"


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


def test_verify_names_a_snapshot_whose_q_cannot_be_opened(tmp_path, inputs):
    graph, clusters, ids = inputs
    st = State.init(graph, clusters, tmp_path / "S", device="cpu", durable=False)
    for t in range(1, 3):
        st.update(t, rows_at(ids, t))
    (st.path / step_relpath(1) / "q" / "zarr.json").unlink()
    report = State.open(st.path).verify()
    assert not report["intact"] and any("00000001.zarr: its q cannot be opened" in p for p in report["problems"])
