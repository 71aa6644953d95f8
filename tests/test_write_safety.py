"""Durability and links (the issue items "Writes through links" and "Durability gaps"), in process: fsync
errors are raised, never swallowed (EINVAL on a folder excepted), and once CURRENT is renamed a failed folder
fsync is "committed, durability unknown"; every folder a command creates is fsynced with its parent; nothing
is written through a planted link.

fsync failures are simulated by replacing ``os.fsync``; which folders were fsynced is read from the inode of
each descriptor given to it."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from _handoff_fixtures import make_inputs, step_rows, write_outcomes
from graphdiff_cli.io.state_dir import StateDir
from graphdiff_cli.state import State


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("safety-inputs")
    graph, clusters, ids = make_inputs(folder, n=40)
    files = [write_outcomes(folder / f"o{t}.jsonl", step_rows(ids, t)) for t in (1, 2)]
    return graph, clusters, ids, files


@pytest.fixture
def state(tmp_path, inputs):
    graph, clusters, _, _ = inputs
    out = tmp_path / "STATE"
    State.init(graph, clusters, out, device="cpu", durable=False)
    return out


def failing_fsync(monkeypatch, err: int, *paths):
    """Make os.fsync fail with ``err`` on the folders ``paths`` (every folder when none is given)."""
    real = os.fsync
    inodes = {os.stat(p).st_ino for p in paths}

    def fsync(fd):
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode) and (not inodes or st.st_ino in inodes):
            raise OSError(err, os.strerror(err))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


# ------------------------------------------------------------------------------ item 9: fsync errors


def test_an_fsync_error_on_a_folder_fails_the_write_before_the_commit(state, inputs, monkeypatch):
    """fsync(steps/) after the step folder's rename fails: the update fails and CURRENT stays where it was
    (it used to be swallowed: the step was committed on a folder the disk may not hold)."""
    files = inputs[3]
    failing_fsync(monkeypatch, errno.EIO, state / "steps")
    with pytest.raises(OSError, match="Input/output error"):
        State.open(state, durable=True).update(1, files[0])
    monkeypatch.undo()
    assert StateDir.open(state).current_step == 0
    assert State.open(state, durable=True).update(1, files[0])["step"] == 1  # the debris is swept, the step applies


def test_einval_from_a_folder_fsync_is_tolerated(state, inputs, monkeypatch, tmp_path):
    """A file system without folder fsync (EINVAL) is the one documented exception: the writes go on."""
    failing_fsync(monkeypatch, errno.EINVAL)
    assert State.open(state, durable=True).update(1, inputs[3][0])["step"] == 1
    assert State.open(state).predict(tmp_path / "p.jsonl")["rows"] == 40
