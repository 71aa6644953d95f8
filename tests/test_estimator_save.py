"""``Estimator.save`` replaces only what it may: a new path, an empty folder, or an estimator it saved.

Saving writes a whole artifact in place of ``path`` (staging folder + rename), so anything else there
(a STATE directory, the user's files, another artifact, a file) is refused in one line and left byte for
byte as it was; a STATE directory so refused still opens.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from _handoff_fixtures import make_inputs, step_rows, tree_hash, write_outcomes
from graphdiff_cli.errors import InvalidArgumentError, StateError
from graphdiff_cli.estimator import Estimator
from graphdiff_cli.io import artifacts
from graphdiff_cli.io.artifacts import read_artifact
from graphdiff_cli.io.readers import read_graph
from graphdiff_cli.io.state_dir import StateDir
from graphdiff_cli.state import State


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("inputs"))


@pytest.fixture
def est(inputs):
    graph, clusters, ids = inputs
    e = Estimator(read_graph(graph).w, read_artifact(clusters, "clusters").array("labels"), n_states=4, device="cpu")
    rows = step_rows(ids, 1)
    index = {p: i for i, p in enumerate(ids)}
    e.update([index[r["id"]] for r in rows], [r["n"] for r in rows], [r["s"] for r in rows])
    return e


def test_a_state_directory_is_refused_and_still_opens(tmp_path, inputs, est):
    graph, clusters, ids = inputs
    state = tmp_path / "STATE"
    State.init(graph, clusters, state, device="cpu", durable=False)
    State.open(state, durable=False).update(1, write_outcomes(tmp_path / "o1.jsonl", step_rows(ids, 1)))
    before = tree_hash(state)
    with pytest.raises(StateError, match=r"is a STATE directory.*State\.open\(.*new path"):
        est.save(state)
    assert tree_hash(state) == before
    assert StateDir.open(state).read_state()["step"] == 1
    assert Estimator.load(state).step_ == 1


def test_a_folder_of_other_files_is_refused(tmp_path, est):
    folder = tmp_path / "runs" / "copy"
    (folder / "notes").mkdir(parents=True)
    (folder / "results.csv").write_bytes(b"step,p\n1,0.5\n")
    (folder / "notes" / "todo.txt").write_bytes(b"keep me")
    before = tree_hash(folder)
    with pytest.raises(InvalidArgumentError, match="folder holding other files.*new path"):
        est.save(folder)
    assert tree_hash(folder) == before


def test_another_kind_of_artifact_is_refused(inputs, est):
    graph = inputs[0]
    before = tree_hash(graph)
    with pytest.raises(InvalidArgumentError, match="is a graph artifact.*new path"):
        est.save(graph)
    assert tree_hash(graph) == before
    assert read_graph(graph).w.shape == est.graph.shape


def test_a_file_and_a_link_are_refused(tmp_path, est):
    f = tmp_path / "model.zarr"
    f.write_bytes(b"not a folder")
    with pytest.raises(InvalidArgumentError, match="is a file"):
        est.save(f)
    assert f.read_bytes() == b"not a folder"
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "link.zarr"
    os.symlink(target, link)
    with pytest.raises(InvalidArgumentError, match="is a symbolic link"):
        est.save(link)
    assert link.is_symlink() and os.readlink(link) == str(target) and not any(target.iterdir())


def test_a_new_path_an_empty_folder_and_an_earlier_save_are_written(tmp_path, est, inputs):
    new = tmp_path / "a" / "new.zarr"
    est.save(new)
    assert Estimator.load(new).step_ == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    est.save(empty)
    assert Estimator.load(empty).step_ == 1
    ids = inputs[2]
    rows = step_rows(ids, 2)
    index = {p: i for i, p in enumerate(ids)}
    est.update([index[r["id"]] for r in rows], [r["n"] for r in rows], [r["s"] for r in rows])
    est.save(new)  # re-saving replaces the earlier save
    back = Estimator.load(new)
    assert back.step_ == 2 and np.array_equal(back.predict(), est.predict())


def test_what_appears_at_the_path_while_saving_is_seen_before_the_rename(tmp_path, est, monkeypatch):
    """The check runs again just before the rename: a STATE made at the path while the artifact was being
    written (here: its CURRENT appears as the stamp is computed) is refused and kept."""
    dest = tmp_path / "e.zarr"
    dest.mkdir()
    real = artifacts.attrs_hash

    def racing(attrs):
        (dest / "CURRENT").write_text('{"step": 0, "path": "steps/00000000.zarr"}\n')
        return real(attrs)

    monkeypatch.setattr(artifacts, "attrs_hash", racing)
    with pytest.raises(StateError, match="is a STATE directory"):
        est.save(dest)
    assert sorted(p.name for p in dest.iterdir()) == ["CURRENT"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left


def _refuse_the_symmetry_test(monkeypatch):
    """Make any test of W's symmetry fail loudly from here on."""
    import graphdiff_cli.core.graph as graph_mod

    def refuse(*_args, **_kwargs):
        raise AssertionError("the symmetry of a verified W was tested again")

    monkeypatch.setattr(graph_mod, "_is_symmetric", refuse)


def test_a_verified_load_skips_only_the_symmetry_test(tmp_path, est, monkeypatch):
    # a W read back from graphdiff's own artifact (checksums verified) was checked when written: loading it
    # does not test its symmetry again (a copy of W: 2-4 s of a million-prompt load), while a state dict
    # handed in by a caller still gets every check
    from graphdiff_cli.errors import DataError

    est.save(tmp_path / "saved")
    state = est.state_dict()
    w = state["graph"].tolil()
    i, j = w.nonzero()[0][0], w.nonzero()[1][0]
    w[i, j] = w[i, j] * 2  # W_ij != W_ji
    with pytest.raises(DataError, match="not symmetric"):
        Estimator.from_state_dict({**state, "graph": w.tocsr()})

    _refuse_the_symmetry_test(monkeypatch)
    loaded = Estimator.load(tmp_path / "saved")
    assert np.array_equal(loaded.predict(), est.predict())
    with pytest.raises(AssertionError, match="tested again"):
        Estimator.from_state_dict(est.state_dict())  # not verified: the test is made
    looped = state["graph"].tolil()
    looped[0, 0] = 1.0
    with pytest.raises(DataError, match="self-loops"):  # a verified load still makes every other check
        Estimator.from_state_dict({**est.state_dict(), "graph": looped.tocsr()}, verified=True)


def test_a_state_directory_loads_without_testing_w_again(tmp_path, inputs, monkeypatch):
    graph, clusters, _ids = inputs
    st = State.init(graph, clusters, tmp_path / "STATE", device="cpu")
    before = st.estimator().predict()
    _refuse_the_symmetry_test(monkeypatch)
    assert np.array_equal(State.open(tmp_path / "STATE", device="cpu").estimator().predict(), before)
