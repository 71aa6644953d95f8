"""graphdiff verify on what graphdiff did not write (exit 6, as docs/reference/handoff.md's table says) and on what a
killed writer left behind (staging folders, trash, temporary files): notices, never damage."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from _handoff_fixtures import make_inputs, step_rows, tree_hash, write_outcomes
from graphdiff_cli.cli.app import app
from graphdiff_cli.io import debris
from graphdiff_cli.state import State


def _verify(*args):
    return CliRunner().invoke(app, ["verify", *map(str, args)])


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("verify-inputs")
    return make_inputs(folder, n=24, k_states=2, k_nn=4)


@pytest.fixture
def state(tmp_path, inputs):
    graph, clusters, ids = inputs
    out = tmp_path / "STATE"
    State.init(graph, clusters, out, device="cpu", durable=False)
    State.open(out, durable=False).update(1, write_outcomes(tmp_path / "o1.jsonl", step_rows(ids, 1)))
    return out


def _dead_pid() -> int:
    """The pid of a process that has exited (what a kill -9 leaves in a temporary's name)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_verify_of_what_graphdiff_did_not_write_exits_6(tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "notes.txt").write_text("x")
    text = tmp_path / "file.txt"
    text.write_text("x")
    zarr_group = tmp_path / "other.zarr"  # a Zarr group some other tool wrote: no graphdiff stamp
    zarr_group.mkdir()
    (zarr_group / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    for path in (folder, text, zarr_group):
        res = _verify(path)
        assert res.exit_code == 6, (path, res.exit_code, res.stdout, res.stderr)
        assert res.stderr.count("\n") == 1 and "not a graphdiff STATE directory or artifact" in res.stderr
        res = _verify(path, "--json")
        out = json.loads(res.stdout)
        assert res.exit_code == 6 and out["exit_code"] == 6 and out["kind"] == "damaged"


def test_verify_of_a_damaged_graphdiff_artifact_still_exits_1(inputs, tmp_path):
    import shutil

    graph = tmp_path / "graph.zarr"
    shutil.copytree(inputs[0], graph)
    (graph / "zarr.json").write_text((graph / "zarr.json").read_text()[:30])  # truncated: damaged, not foreign
    res = _verify(graph)
    assert res.exit_code == 1 and "problem:" in res.stdout


def test_verify_lists_what_a_killed_writer_left_as_notices(state, inputs, tmp_path):
    dead, host = _dead_pid(), debris._HOST
    left = [
        state / "steps" / f".00000002.zarr.staging-{host}@{dead}@deadbeef",  # update killed while writing step 2
        state / f".CURRENT.tmp-{host}@{dead}@deadbeef",                        # ... or while replacing CURRENT
        state / ".trash-00000001.zarr-0badc0de",                               # a prune cut short
        tmp_path / f".STATE.staging-{host}@{dead}@deadbeef",                   # an init of the same path killed
    ]
    for p in left:
        if "CURRENT" in p.name:
            p.write_text('{"step": 2, "pa')
        else:
            p.mkdir()
            (p / "zarr.json").write_text("{")
    before = tree_hash(tmp_path)
    res = _verify(state, "--json")
    assert res.exit_code == 0, res.stdout
    out = json.loads(res.stdout)
    assert out["intact"] and out["problems"] == []
    assert len(out["notices"]) == len(left), out["notices"]
    for p in left:
        assert sum(p.name in n for n in out["notices"]) == 1, (p.name, out["notices"])
    assert all(str(dead) in n and "killed" in n for n in out["notices"] if ".staging-" in n or ".tmp-" in n)
    text = _verify(state)
    assert text.exit_code == 0
    assert sum(line.startswith("notice: ") for line in text.stdout.splitlines()) == len(left)
    assert tree_hash(tmp_path) == before  # verify removes nothing


def test_verify_of_an_artifact_lists_the_staging_folder_beside_it(inputs, tmp_path):
    import shutil

    graph = tmp_path / "graph.zarr"
    shutil.copytree(inputs[0], graph)
    left = tmp_path / f".graph.zarr.staging-{debris._HOST}@{_dead_pid()}@deadbeef"
    left.mkdir()
    other = tmp_path / f".clusters.zarr.staging-{debris._HOST}@{_dead_pid()}@deadbeef"  # another destination's
    other.mkdir()
    out = json.loads(_verify(graph, "--json").stdout)
    assert out["intact"] and len(out["notices"]) == 1 and left.name in out["notices"][0]
