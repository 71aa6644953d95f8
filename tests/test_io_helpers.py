"""io.staging.staged_dir and io.locks.file_lock on their own (their callers have their own tests)."""

from __future__ import annotations

import os
import time

import pytest

from graphdiff_cli.errors import StateError
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
