"""Verified reads: a damaged artifact or STATE is refused in one line by every reader, never read as silently
wrong estimates (the tamper matrix of the integrity issue, on real Zarr files of a real STATE)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from _handoff_fixtures import make_inputs, step_rows, tree_hash, write_outcomes
from graphdiff_cli.errors import ArtifactError
from graphdiff_cli.estimator import Estimator
from graphdiff_cli.io.artifacts import read_artifact, write_artifact
from graphdiff_cli.io.readers import read_graph
from graphdiff_cli.io.state_dir import StateDir
from graphdiff_cli.state import State


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("integrity-inputs")
    graph, clusters, ids = make_inputs(folder, n=40)
    return graph, clusters, ids


def _fed_state(tmp_path, inputs, name: str, seed: int = 0):
    """A STATE of the shared inputs (keep 3) fed steps 1 and 2 of ``step_rows(..., seed=seed)``."""
    graph, clusters, ids = inputs
    out = tmp_path / name
    State.init(graph, clusters, out, device="cpu", keep=3, durable=False)
    for t in (1, 2):
        rows = step_rows(ids, t, seed=seed)
        State.open(out, durable=False).update(t, write_outcomes(tmp_path / f"{name}_o{t}.jsonl", rows))
    return out


@pytest.fixture
def state(tmp_path, inputs):
    return _fed_state(tmp_path, inputs, "STATE")


def _chunks(array_dir: Path) -> list[Path]:
    """The chunk files of an array: c.0.0 beside its zarr.json (c/0/0 in artifacts written before 2026-11-29)."""
    return sorted(p for p in array_dir.rglob("*") if p.is_file() and p.name != "zarr.json")


def _delete_chunk(rel):
    return lambda st: _chunks(st / rel)[0].unlink()


def _flip_byte(rel):
    def tamper(st):
        p = _chunks(st / rel)[0]
        b = bytearray(p.read_bytes())
        b[len(b) // 2] ^= 0x10
        p.write_bytes(bytes(b))
    return tamper


def _edit_beta(st):
    meta = st / "model.zarr" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["config"]["beta"] = 3.0
    meta.write_text(json.dumps(doc))


def _swap_step_chunk(array):
    def tamper(st):  # the previous step's chunk copied over the current one's: a valid chunk, wrong content
        src, dst = _chunks(st / "steps/00000001.zarr" / array)[0], _chunks(st / "steps/00000002.zarr" / array)[0]
        shutil.copyfile(src, dst)
    return tamper


def _strip_stamp(rel):
    def strip(st):  # what an attacker who knows the format removes first: the checks themselves
        meta = st / rel / "zarr.json"
        doc = json.loads(meta.read_text())
        del doc["attributes"]["graphdiff"]["checksums"], doc["attributes"]["graphdiff"]["attrs_hash"]
        meta.write_text(json.dumps(doc))
    return strip


def _both(*tampers):
    def tamper(st):
        for t in tampers:
            t(st)
    return tamper


TAMPERS = {
    "step stamp stripped, then its q chunk from the previous step": _both(_strip_stamp("steps/00000002.zarr"),
                                                                         _swap_step_chunk("q")),
    "model stamp stripped, then config.beta edited": _both(_strip_stamp("model.zarr"), _edit_beta),
    "step q chunk deleted": _delete_chunk("steps/00000002.zarr/q"),
    "step successes chunk deleted": _delete_chunk("steps/00000002.zarr/successes"),
    "step q chunk from the previous step": _swap_step_chunk("q"),
    "step q byte flipped": _flip_byte("steps/00000002.zarr/q"),
    "model graph_data chunk deleted": _delete_chunk("model.zarr/graph_data"),
    "model labels chunk deleted": _delete_chunk("model.zarr/labels"),
    "model labels byte flipped": _flip_byte("model.zarr/labels"),
    "model config.beta edited": _edit_beta,
}


@pytest.mark.parametrize("name", list(TAMPERS))
def test_a_damaged_state_is_refused_by_every_reader_and_update(state, inputs, tmp_path, name):
    ids = inputs[2]
    TAMPERS[name](state)
    before = tree_hash(state)
    readers = {"Estimator.load": lambda: Estimator.load(state),
               "predict/select/allocate": lambda: State.open(state, device="cpu").estimator(),
               "update": lambda: State.open(state, durable=False).update(
                   3, write_outcomes(tmp_path / "o3.jsonl", step_rows(ids, 3)))}
    for reader, read in readers.items():
        with pytest.raises(ArtifactError) as err:
            read()
        msg = str(err.value)
        assert "\n" not in msg and ("damaged" in msg or "altered" in msg), (reader, msg)
        assert "rollback" in msg or "re-create" in msg, msg  # the line says how to fix it
    assert tree_hash(state) == before  # nothing written on top of a damaged state


@pytest.fixture
def sibling(tmp_path, inputs):
    """A STATE of the same model (same graph, clusters, settings) fed other outcomes at steps 1 and 2."""
    return _fed_state(tmp_path, inputs, "SIBLING", seed=7)


@pytest.mark.parametrize("step", [1, 2])
def test_a_step_folder_copied_from_a_sibling_state_is_refused(state, sibling, inputs, tmp_path, step):
    """The sibling's step folder passes every other check (same model, its own checksums, the right step): only
    the log's outcomes hash for that step, compared with the folder's recorded outcomes, tells it apart."""
    ids = inputs[2]
    folder = f"steps/{step:08d}.zarr"
    shutil.rmtree(state / folder)
    shutil.copytree(sibling / folder, state / folder)
    before = tree_hash(state)
    checks = {"verify": lambda: _verify(state, 1)["problems"]}
    if step == 2:  # the current step: every reader
        checks.update({
            "Estimator.load": lambda: Estimator.load(state),
            "predict/select/allocate": lambda: State.open(state, device="cpu").estimator(),
            "status": lambda: State.open(state).status(),
            "update": lambda: State.open(state, durable=False).update(
                3, write_outcomes(tmp_path / "o3.jsonl", step_rows(ids, 3)))})
    else:  # a retained older step: rollback must not make it current
        checks["rollback"] = lambda: State.open(state).rollback(1)
    for name, check in checks.items():
        if name == "verify":
            problems = check()
            assert len(problems) == 1 and folder in problems[0] and "the log's line" in problems[0], problems
            continue
        with pytest.raises(ArtifactError, match="was made from outcomes .* but the log's line of its version records "
                                                "outcomes") as err:
            check()
        assert "\n" not in str(err.value), name
    assert tree_hash(state) == before


def test_revisions_are_held_to_their_log_lines_too(state, inputs, tmp_path):
    """A retire writes revision 2.1 from an ids file: its folder records that file's hash as its log line does."""
    ids = inputs[2]
    (tmp_path / "bad.txt").write_text(ids[5] + "\n")
    st = State.open(state, durable=False)
    st.retire(tmp_path / "bad.txt")
    assert _verify(state, 0)["intact"] and st.estimator() is not None
    other = tmp_path / "other.txt"
    other.write_text(ids[6] + "\n")
    copy = tmp_path / "COPY"
    shutil.copytree(state, copy)
    State.open(copy, durable=False).rollback("2.0")
    State.open(copy, durable=False).retire(other)  # the same version 2.1, from another ids file
    shutil.rmtree(state / "steps/00000002.1.zarr")
    shutil.copytree(copy / "steps/00000002.1.zarr", state / "steps/00000002.1.zarr")
    with pytest.raises(ArtifactError, match="was made from ids .* records ids"):
        State.open(state, device="cpu").estimator()


def test_rollback_to_an_intact_step_recovers(state, inputs, tmp_path):
    _delete_chunk("steps/00000002.zarr/q")(state)
    with pytest.raises(ArtifactError):
        Estimator.load(state)
    State.open(state).rollback(1)
    assert Estimator.load(state).step_ == 1


def test_a_graph_artifact_with_a_deleted_data_chunk_is_refused_by_init(inputs, tmp_path):
    graph, clusters, _ = inputs
    g = tmp_path / "graph.zarr"
    shutil.copytree(graph, g)
    _chunks(g / "data")[0].unlink()
    with pytest.raises(ArtifactError, match=r"array 'data' is damaged"):
        read_graph(g)
    with pytest.raises(ArtifactError):
        State.init(g, clusters, tmp_path / "S", device="cpu", durable=False)
    assert not (tmp_path / "S").exists()


def test_checksums_cover_every_chunk_row_and_text_and_scalars(tmp_path):
    q = np.arange(5_000_000, dtype=np.float32).reshape(-1, 10)  # 20 MB: two chunk rows
    ids = np.array([f"p{i}" for i in range(7)], dtype=object)
    write_artifact(tmp_path / "a.zarr", "test", {"q": q, "ids": ids, "x": np.float64(2.5)}, attrs={"config": {"k": 1}})
    art = read_artifact(tmp_path / "a.zarr", "test")
    assert len(art.stamp["checksums"]["arrays"]["q"]["crc"]) == 2
    assert np.array_equal(art.array("q"), q) and list(art.array("ids")) == list(ids) and art.array("x") == 2.5
    second = _chunks(tmp_path / "a.zarr" / "q")[1]
    second.unlink()  # the second chunk row only: the error names its rows
    with pytest.raises(ArtifactError, match=r"array 'q' is damaged \(rows 419430\.\.838859"):
        read_artifact(tmp_path / "a.zarr", "test").array("q")
    meta = tmp_path / "a.zarr" / "ids" / "zarr.json"
    assert meta.is_file()
    (_chunks(tmp_path / "a.zarr" / "ids")[0]).unlink()
    with pytest.raises(ArtifactError, match="array 'ids' is damaged"):
        read_artifact(tmp_path / "a.zarr", "test").array("ids")


@pytest.mark.parametrize("drop", [("checksums",), ("attrs_hash",), ("checksums", "attrs_hash")])
def test_a_stamp_without_its_checksums_is_refused_not_read_unverified(tmp_path, drop):
    """Removing the checks must not turn them off: a stamp that lacks them is refused like any damage (every
    release wrote them; the previous one's artifacts, tests/data/legacy_79a4679, carry them)."""
    write_artifact(tmp_path / "a.zarr", "test", {"q": np.ones((4, 3), np.float32)}, attrs={"config": {"k": 1}})
    meta = tmp_path / "a.zarr" / "zarr.json"
    doc = json.loads(meta.read_text())
    for key in drop:
        del doc["attributes"]["graphdiff"][key]
    meta.write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="lacks its checksums or attributes hash") as err:
        read_artifact(tmp_path / "a.zarr", "test")
    assert "\n" not in str(err.value)
    legacy = Path(__file__).parent / "data" / "legacy_79a4679"
    for stamp in legacy.rglob("zarr.json"):
        attrs = json.loads(stamp.read_text()).get("attributes", {})
        if "graphdiff" in attrs:
            assert {"checksums", "attrs_hash"} <= set(attrs["graphdiff"]), stamp


def test_an_array_the_stamp_does_not_list_is_not_read_and_a_listed_one_deleted_is_missing(tmp_path):
    from graphdiff_cli.io.artifacts import has_array

    write_artifact(tmp_path / "a.zarr", "test", {"q": np.ones((4, 3)), "r": np.arange(3)})
    write_artifact(tmp_path / "b.zarr", "test", {"extra": np.arange(3)})
    shutil.copytree(tmp_path / "b.zarr" / "extra", tmp_path / "a.zarr" / "extra")  # added after it was written
    art = read_artifact(tmp_path / "a.zarr", "test")
    assert art.names == ("q", "r") and not has_array(art, "extra")
    with pytest.raises(ArtifactError, match="has no array 'extra'"):
        art.array("extra")
    shutil.rmtree(tmp_path / "a.zarr" / "r")  # an array's folder removed: it was written, so it is missing
    art = read_artifact(tmp_path / "a.zarr", "test")
    assert has_array(art, "r")
    with pytest.raises(ArtifactError, match="array 'r' is missing or damaged"):
        art.array("r")


# ------------------------------------------------------------------------------ graphdiff verify

def _verify(path, code):
    from typer.testing import CliRunner

    from graphdiff_cli.cli.app import app

    res = CliRunner().invoke(app, ["verify", str(path), "--json"])
    assert res.exit_code == code, (res.exit_code, res.stdout, res.stderr)
    return json.loads(res.stdout)


def test_verify_says_intact_or_lists_every_problem_one_line_each(state, inputs, tmp_path):
    graph = inputs[0]
    ok = _verify(state, 0)
    assert ok["intact"] and ok["kind"] == "STATE" and ok["problems"] == []
    assert {"model.zarr", "log.jsonl", "steps/00000000.zarr", "steps/00000002.zarr"} <= set(ok["checked"])
    assert _verify(graph, 0)["kind"] == "graph"
    before = tree_hash(state)
    # two damages at once: both reported, each on one line, and verify writes nothing
    _delete_chunk("steps/00000001.zarr/q")(state)
    _edit_beta(state)
    bad = _verify(state, 1)
    assert not bad["intact"] and len(bad["problems"]) == 2, bad["problems"]
    assert any("model.zarr" in p and "altered" in p for p in bad["problems"])
    assert any("00000001.zarr" in p and "'q' is damaged" in p for p in bad["problems"])
    assert all("\n" not in p for p in bad["problems"])
    assert tree_hash(state) != before  # (the tampering) ...
    after = tree_hash(state)
    _verify(state, 1)
    assert tree_hash(state) == after  # ... but verify itself changed nothing


def test_verify_lists_every_array_whose_metadata_was_edited(state):
    """Four arrays' zarr.json damaged four ways: verify names each (it used to stop at the first, in a traceback)."""
    step = state / "steps/00000002.zarr"

    def edit(name, change):
        meta = step / name / "zarr.json"
        doc = json.loads(meta.read_text())
        change(doc)
        meta.write_text(json.dumps(doc))

    (step / "a" / "zarr.json").write_text((step / "a" / "zarr.json").read_text()[:40])  # truncated JSON
    edit("b", lambda d: d["chunk_key_encoding"]["configuration"].update(separator="/../"))
    edit("q", lambda d: d.update(node_type="group"))
    edit("successes", lambda d: d["codecs"][1].update(name="no-such-codec"))
    before = tree_hash(state)
    bad = _verify(state, 1)
    assert len(bad["problems"]) == 4, bad["problems"]
    for name in ("a", "b", "q", "successes"):
        assert sum(f"array {name!r} is missing or damaged" in p for p in bad["problems"]) == 1, (name, bad["problems"])
    assert all("\n" not in p for p in bad["problems"]) and tree_hash(state) == before


def test_verify_reports_a_stripped_stamp(state):
    _strip_stamp("steps/00000001.zarr")(state)
    bad = _verify(state, 1)
    assert len(bad["problems"]) == 1 and "00000001.zarr" in bad["problems"][0]
    assert "lacks its checksums" in bad["problems"][0] and bad["notices"] == []


def test_verify_refuses_a_path_that_is_nothing(tmp_path):
    from typer.testing import CliRunner

    from graphdiff_cli.cli.app import app

    res = CliRunner().invoke(app, ["verify", str(tmp_path / "nope")])
    assert res.exit_code == 6 and "no such STATE directory or artifact" in res.stderr


def test_public_helpers_map_ids_and_load_the_graph(state, inputs):
    """graphdiff_cli.prompt_index / load_graph: the in-process API for ids <-> nodes and the graph as CSR."""
    import scipy.sparse as sp

    import graphdiff_cli as gd
    from graphdiff_cli.errors import DataError

    graph, clusters, ids = inputs
    for where in (state, graph, clusters):
        index = gd.prompt_index(where)
        assert index.ids == ids and list(index.nodes([ids[3], ids[0]])) == [3, 0] and index.get("nope") is None
        with pytest.raises(DataError, match="unknown prompt id 'nope'"):
            index.nodes(["nope"])
    w, gids = gd.load_graph(graph)
    w2, sids = gd.load_graph(state)
    assert sp.issparse(w) and w.format == "csr" and gids == sids == ids
    assert (w != w.T).nnz == 0 and (w != w2).nnz == 0 and w.shape == (len(ids), len(ids))
