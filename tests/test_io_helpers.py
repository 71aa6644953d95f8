"""io.staging.staged_dir and io.locks.file_lock on their own (their callers have their own tests)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from graphdiff_cli.errors import DataError, StateError
from graphdiff_cli.io.locks import file_lock
from graphdiff_cli.io.staging import staged_dir


def test_staged_dir_replaces_atomically_and_cleans_up_on_error(tmp_path):
    dest = tmp_path / "sub" / "out"
    with staged_dir(dest, durable=True) as tmp:
        assert tmp.is_dir() and tmp.parent == dest.parent and tmp.name.startswith(".out.staging-")
        (tmp / "a.txt").write_text("one")
    assert (dest / "a.txt").read_text() == "one"
    with pytest.raises(RuntimeError):
        with staged_dir(dest, durable=False) as tmp:
            (tmp / "a.txt").write_text("two")
            raise RuntimeError("midway")
    assert (dest / "a.txt").read_text() == "one"  # untouched
    with staged_dir(dest, durable=False) as tmp:
        (tmp / "b.txt").write_text("three")
    assert sorted(p.name for p in dest.iterdir()) == ["b.txt"]
    assert sorted(p.name for p in dest.parent.iterdir()) == ["out"]  # no staging or .old- folder left


def test_staged_dir_without_replace_takes_only_a_missing_or_empty_dest(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with staged_dir(empty, replace=False) as tmp:
        (tmp / "x").write_text("x")
    assert (empty / "x").is_file()
    with pytest.raises(OSError):
        with staged_dir(empty, replace=False) as tmp:
            (tmp / "y").write_text("y")
    assert sorted(p.name for p in empty.iterdir()) == ["x"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def test_file_lock_polls_until_the_timeout_and_names_the_holder(tmp_path):
    path = tmp_path / "lock"
    with file_lock(path, record_pid=True, busy=lambda h: f"held by {h}"):
        assert path.read_text() == f"{os.getpid()}\n"
        # flock locks belong to the open file description: a second open in this process conflicts
        t0 = time.monotonic()
        with pytest.raises(StateError, match=f"^held by {os.getpid()}$"):
            with file_lock(path, 0.2, busy=lambda h: f"held by {h}"):
                pass
        assert time.monotonic() - t0 >= 0.2
        with pytest.raises(StateError, match="^held by"):
            with file_lock(path, 0.0, busy=lambda h: f"held by {h}"):
                pass
    with file_lock(path, 0.0, busy=lambda h: "unused"):  # released on exit
        pass
    with pytest.raises(StateError, match="^cannot open"):
        with file_lock(tmp_path / "missing" / "lock", busy=str, cannot_open=lambda e: f"cannot open ({e.strerror})"):
            pass
    with pytest.raises(FileNotFoundError):
        with file_lock(tmp_path / "missing" / "lock", busy=str):
            pass


# ------------------------------------------------------------------ debris of killed writers (io.debris)

_KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from graphdiff_cli.io.atomic import atomic_write
from graphdiff_cli.io.staging import staged_dir
kind, dest = sys.argv[1], Path(sys.argv[2])
if kind == "file":
    with atomic_write(dest) as f:
        f.write("half a file")
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
else:
    with staged_dir(dest) as tmp:
        (tmp / "part").write_text("half a folder")
        os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_writer(kind: str, dest) -> None:
    import signal
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", _KILLED_WRITER, kind, str(dest)])
    assert res.returncode == -signal.SIGKILL


def test_debris_of_killed_writers_is_swept_by_the_next_writer(tmp_path):
    """A real process killed with SIGKILL inside atomic_write / staged_dir leaves its temporary; the next write
    of the same destination removes it, and nothing else (another destination's, a live writer's, another
    host's, a user's dotfile)."""
    from graphdiff_cli.io import debris
    from graphdiff_cli.io.atomic import atomic_write_text

    pred, art = tmp_path / "pred.jsonl", tmp_path / "graph.zarr"
    for _ in range(3):
        _killed_writer("file", pred)
        _killed_writer("dir", art)
    left = sorted(p.name for p in tmp_path.iterdir())
    # each killed writer swept its dead predecessor: one temporary per destination, however many kills
    assert len(left) == 2 and all(debris.owner(n) for n in left), left
    assert not pred.exists() and not art.exists()  # nothing half-written under the real names
    # what must survive the sweep
    live = tmp_path / f".pred.jsonl.tmp-{debris._HOST}@{os.getpid()}@0000abcd"  # this (live) process
    remote = tmp_path / f".pred.jsonl.tmp-otherhost@{2 ** 22 + 7}@0000abcd"      # another host's writer
    other = tmp_path / ".other.jsonl.tmp-x@1@0"
    user = tmp_path / ".pred.jsonl.notes"
    for p in (live, remote, other, user):
        p.write_text("keep")
    atomic_write_text(pred, "whole\n")
    assert pred.read_text() == "whole\n"
    left = sorted(p.name for p in tmp_path.iterdir())
    assert sum(debris.owner(n) is not None and debris.owner(n)[0] == "pred.jsonl" and debris.owner(n)[2] ==
               debris._HOST and n != live.name for n in left) == 0
    assert {live.name, remote.name, other.name, user.name} <= set(left)
    assert len([n for n in left if n.startswith(".graph.zarr.staging-")]) == 1  # not this destination's turn yet
    with staged_dir(art, durable=False) as tmp:
        (tmp / "whole").write_text("x")
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".graph.zarr.")]
    assert sorted(p.name for p in art.iterdir()) == ["whole"]


def test_debris_names_round_trip():
    from graphdiff_cli.io import debris

    n = debris.temp_name("a.b.jsonl", "staging")
    assert debris.owner(n)[:2] == ("a.b.jsonl", "staging") and debris.owner(n)[3] == os.getpid()
    assert not debris.is_stale(n)  # made by this live process
    assert debris.owner(".x.tmp") is None and debris.owner("x.staging-h@1@ab") is None
    with pytest.raises(ValueError):
        debris.temp_name("x", "junk")


def test_a_replace_cut_between_its_renames_is_restored_not_swept(tmp_path):
    """Killed after renaming the old version aside and before renaming the new one in: the destination is
    missing and the old folder is the only intact copy; the next writer puts it back before anything else."""
    from graphdiff_cli.io import debris

    dest = tmp_path / "art.zarr"
    dead = f".art.zarr.old-{debris._HOST}@{2 ** 22 + 11}@0000abcd"  # a pid that is not running
    (tmp_path / dead).mkdir()
    (tmp_path / dead / "x").write_text("previous version")
    with pytest.raises(RuntimeError):
        with staged_dir(dest, durable=False):
            assert (dest / "x").read_text() == "previous version"  # restored before the new write began
            raise RuntimeError("the new write fails too")
    assert (dest / "x").read_text() == "previous version" and not (tmp_path / dead).exists()


def test_checksums_of_a_non_native_byte_order_array_read_back(tmp_path):
    from graphdiff_cli.io.artifacts import read_artifact, write_artifact

    a = np.arange(12, dtype=">f8").reshape(4, 3)
    write_artifact(tmp_path / "b.zarr", "test", {"a": a}, durable=False)
    assert np.array_equal(read_artifact(tmp_path / "b.zarr", "test").array("a"), a)


def test_a_plain_ids_file_drops_only_each_line_end(tmp_path):
    """One id per line, exactly as written: \\n and \\r\\n end a line; U+2028, U+0085 and spaces are id characters."""
    from graphdiff_cli.io.readers import IdIndex, id_file_nodes, read_id_file

    path = tmp_path / "ids.txt"
    path.write_bytes("\ufeffp1\r\n p2\np3\u2028x\n\np4 \n\tp5\x85\r\n".encode())
    assert read_id_file(path) == [(1, "p1"), (2, " p2"), (3, "p3\u2028x"), (5, "p4 "), (6, "\tp5\x85")]
    with pytest.raises(DataError, match=r"ids.txt:2: unknown prompt id ' p2' .* known id 'p2' only by whitespace"):
        id_file_nodes(path, IdIndex(["p1", "p2", "p3", "p4", "p5"]))
