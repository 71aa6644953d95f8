"""Durability and links (the issue items "Writes through links" and "Durability gaps"), in process: fsync
errors are raised, never swallowed (EINVAL on a folder excepted), and once CURRENT is renamed a failed folder
fsync is "committed, durability unknown"; every folder a command creates is fsynced with its parent; nothing
is written through a planted link; an artifact's arrays written together end before its staging folder is removed,
also when the writer is interrupted.

fsync failures are simulated by replacing ``os.fsync``; which folders were fsynced is read from the inode of
each descriptor given to it."""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path

import numpy as np
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


def recording_fsync(monkeypatch) -> set[int]:
    """Record the inode of every folder os.fsync is called on."""
    real, seen = os.fsync, set()

    def fsync(fd):
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            seen.add(st.st_ino)
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def synced(seen: set[int], *paths) -> list[bool]:
    return [os.stat(p).st_ino in seen for p in paths]


def test_every_folder_a_command_creates_is_fsynced_with_its_parent(state, inputs, tmp_path, monkeypatch):
    """predict --out, watch --predictions, init --out and the OpenRLHF recorder's folder, each into folders that
    do not exist yet: each new folder and the folder it was made in are fsynced (before, only the last folder
    was, after the file's rename: a power loss could take the "written" predictions away with the new folders)."""
    from typer.testing import CliRunner

    from graphdiff_cli.cli.app import app
    from graphdiff_cli.integrations.openrlhf import StepRecorder

    graph, clusters, ids, files = inputs
    seen = recording_fsync(monkeypatch)
    res = CliRunner().invoke(app, ["predict", "--state", str(state), "--out", str(tmp_path / "p" / "q" / "r.jsonl")])
    assert res.exit_code == 0, res.stderr
    assert synced(seen, tmp_path / "p" / "q", tmp_path / "p", tmp_path) == [True] * 3

    seen.clear()
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    os.replace(write_outcomes(tmp_path / "tmp.jsonl", step_rows(ids, 1)), inbox / "step-000001.jsonl")
    out = tmp_path / "w" / "x" / "pred-{step}.jsonl"
    assert State.open(state, durable=False).watch(inbox, once=True, predictions=out)["step"] == 1
    assert (tmp_path / "w" / "x" / "pred-000001.jsonl").is_file()
    assert synced(seen, tmp_path / "w" / "x", tmp_path / "w", tmp_path) == [True] * 3

    seen.clear()
    State.init(graph, clusters, tmp_path / "i" / "j" / "S", device="cpu", durable=True)
    assert synced(seen, tmp_path / "i" / "j" / "S", tmp_path / "i" / "j", tmp_path / "i", tmp_path) == [True] * 4

    seen.clear()
    StepRecorder(state, batch_size=2, n_samples=2, folder=tmp_path / "rec" / "sub")
    assert synced(seen, tmp_path / "rec" / "sub", tmp_path / "rec", tmp_path) == [True] * 3


def test_a_failed_fsync_after_currents_rename_is_committed_durability_unknown(state, inputs, monkeypatch):
    """fsync(STATE/) fails right after CURRENT's rename: the step is applied (every reader sees it), so update
    exits 0 with a warning and "durability_unknown": true (it used to fail although the step was visible), and
    sending the step again is the usual no-op. A rollback there stops at CURRENT: the later lines and states stay
    as debris above it, removed by the next writer."""
    import json

    from typer.testing import CliRunner

    from graphdiff_cli.cli.app import app

    files = inputs[3]
    runner = CliRunner()
    failing_fsync(monkeypatch, errno.EIO, state)
    res = runner.invoke(app, ["update", "--state", str(state), "--step", "1", "--outcomes", str(files[0]), "--json"])
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["step"] == 1 and out["durability_unknown"] is True
    assert any("committed, durability unknown" in w for w in out["warnings"])
    warning = [line for line in res.stderr.splitlines() if "durability unknown" in line]
    assert len(warning) == 1 and warning[0].startswith("graphdiff: warning: ") and "Input/output error" in warning[0]
    assert StateDir.open(state).current_step == 1
    res = runner.invoke(app, ["update", "--state", str(state), "--step", "1", "--outcomes", str(files[0]), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["noop"] is True

    res = runner.invoke(app, ["rollback", "--state", str(state), "--to", "0", "--json"])
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["durability_unknown"] is True and "durability unknown" in res.stderr
    sd = StateDir.open(state)
    assert sd.current_step == 0 and [e["step"] for e in sd.log_entries()] == [0]
    assert (state / "steps" / "00000001.zarr").is_dir()  # left above CURRENT: CURRENT's rename may not be on disk
    monkeypatch.undo()
    up = State.open(state, durable=False).update(1, files[1])  # other outcomes: step 1 is free again
    assert up["step"] == 1 and up["durability_unknown"] is False and up["warnings"] == []
    assert [e["step"] for e in StateDir.open(state).log_entries()] == [0, 1]


def test_openrlhf_pending_appends_are_fsynced(state, inputs, monkeypatch):
    """Each rollout the recorder appends to its wave's pending file is fsynced before the reward call returns
    (OpenRLHF never sends it again; a power loss used to be free to drop it, or to leave a torn file)."""
    from graphdiff_cli.integrations.openrlhf import StepRecorder

    real, seen = os.fsync, set()

    def fsync(fd):
        seen.add(os.fstat(fd).st_ino)
        return real(fd)

    rec = StepRecorder(state, batch_size=2, n_samples=2)
    monkeypatch.setattr(os, "fsync", fsync)
    rec.record(inputs[2][0], 1.0)
    pending = rec.folder / "pending-00000001.jsonl"
    assert pending.read_text().count("\n") == 1 and os.stat(pending).st_ino in seen


# ------------------------------------------------------------------------------ item 4: no writes through links


def _outside(tmp_path, text="the user's own file\n"):
    p = tmp_path / "outside" / "file.txt"
    p.parent.mkdir(exist_ok=True)
    p.write_text(text)
    return p


def _refused_in_one_line(res) -> None:
    assert res.exit_code == 7, (res.exit_code, res.stderr)
    assert res.stderr.startswith("graphdiff: error: ") and res.stderr.count("\n") == 1
    assert "is a symbolic link" in res.stderr


@pytest.mark.parametrize("planted", ["log.jsonl", ".lock (dangling)", "steps/"])
def test_a_link_planted_in_the_state_is_refused_and_what_it_points_to_is_unchanged(state, inputs, tmp_path, planted):
    """A symlinked log.jsonl used to get the step appended to the outside file, a dangling .lock link created a
    file outside the STATE, a symlinked steps/ received the step's folder: each is refused in one line (exit 7)
    before anything is written, the STATE stays at its step and the outside file or folder as it was."""
    from typer.testing import CliRunner

    from _handoff_fixtures import tree_hash
    from graphdiff_cli.cli.app import app

    outside = tmp_path / "outside"
    outside.mkdir()
    if planted == "log.jsonl":
        target = outside / "log.jsonl"
        os.replace(state / "log.jsonl", target)  # a valid log, so every read passes: only the write can tell
    elif planted == "steps/":
        target = outside / "steps"
        os.replace(state / "steps", target)
    else:
        target = outside / "lock"  # does not exist
        os.unlink(state / ".lock")
    os.symlink(target, state / planted.split(" ")[0].rstrip("/"))
    before = tree_hash(outside)
    res = CliRunner().invoke(app, ["update", "--state", str(state), "--step", "1", "--outcomes", str(inputs[3][0])])
    _refused_in_one_line(res)
    assert tree_hash(outside) == before and os.path.exists(target) == (planted != ".lock (dangling)")
    assert StateDir.open(state).current_step == 0


def test_a_link_at_the_watchers_lock_is_refused_not_truncated(state, tmp_path):
    """INBOX/.graphdiff-watch.lock pointing at a file used to truncate it to the watcher's pid."""
    from graphdiff_cli.errors import StateError

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    outside = _outside(tmp_path)
    os.symlink(outside, inbox / ".graphdiff-watch.lock")
    with pytest.raises(StateError, match="is a symbolic link"):
        State.open(state, durable=False).watch(inbox, once=True)
    assert outside.read_text() == "the user's own file\n"


@pytest.mark.parametrize("planted", ["lock", "pending-00000001.jsonl"])
def test_a_link_in_the_openrlhf_recorders_folder_is_refused(state, inputs, tmp_path, planted):
    """The recorder's lock (its pid written in) and its wave's pending file (rollouts appended) never follow a
    link: the call is refused (and the refusal kept in ERROR, as every recorder failure), the file unchanged."""
    from graphdiff_cli.errors import StateError
    from graphdiff_cli.integrations.openrlhf import StepRecorder

    rec = StepRecorder(state, batch_size=2, n_samples=2, durable=False)
    outside = _outside(tmp_path)
    os.symlink(outside, rec.folder / planted)
    with pytest.raises(StateError, match="is a symbolic link"):
        rec.record(inputs[2][0], 1.0)
    assert outside.read_text() == "the user's own file\n"
    assert "is a symbolic link" in (rec.folder / "ERROR").read_text()


def test_files_and_locks_are_created_0644_whatever_the_umask(tmp_path, inputs):
    """Under umask 0 the STATE's lock, CURRENT, the log, a predictions table, the watcher's lock and the
    recorder's lock and pending file used to be created 0666 (writable by anyone)."""
    from graphdiff_cli.integrations.openrlhf import StepRecorder

    graph, clusters, ids, files = inputs
    old = os.umask(0)
    try:
        st = tmp_path / "S"
        State.init(graph, clusters, st, device="cpu", durable=False)
        State.open(st, durable=False).update(1, files[0])
        State.open(st).predict(tmp_path / "p.csv")
        inbox = tmp_path / "inbox"
        inbox.mkdir()
        State.open(st, durable=False).watch(inbox, once=True)
        rec = StepRecorder(st, batch_size=2, n_samples=2, durable=False)
        rec.record(ids[0], 1.0)
    finally:
        os.umask(old)
    made = [st / ".lock", st / "CURRENT", st / "log.jsonl", tmp_path / "p.csv", inbox / ".graphdiff-watch.lock",
            rec.folder / "lock", rec.folder / "pending-00000002.jsonl"]
    assert {p.name: oct(stat.S_IMODE(os.stat(p).st_mode)) for p in made} == {p.name: "0o644" for p in made}


def test_an_atomic_write_over_a_link_replaces_the_link_not_its_target(state, tmp_path):
    """predict --out (any atomic write: temporary file, rename) names a link: the rename replaces the link, so the
    file it pointed to keeps every byte (this held before the link fix too; it is why atomic writes need no
    O_NOFOLLOW at their destination)."""
    outside = _outside(tmp_path)
    out = tmp_path / "pred.jsonl"
    os.symlink(outside, out)
    assert State.open(state).predict(out)["rows"] == 40
    assert not out.is_symlink() and out.read_text().count("\n") == 40
    assert outside.read_text() == "the user's own file\n"


def test_fsync_tree_syncs_every_file_and_folder_and_raises_the_first_error(tmp_path, monkeypatch):
    """A staged artifact's files and folders are fsynced together from a pool of threads (one journal commit for
    many files): every one of them is still fsynced before fsync_tree returns; of two failing files, the error of
    the first in walk order is raised, not lost in a worker thread; where no thread can be started, every one is
    fsynced one after another."""
    from concurrent.futures import ThreadPoolExecutor

    from graphdiff_cli.io.staging import FSYNC_THREADS, fsync_tree

    root = tmp_path / "tree"
    for d in range(3):
        for f in range(FSYNC_THREADS + 5):  # more files than threads in each folder
            (root / f"a{d}" / "b").mkdir(parents=True, exist_ok=True)
            (root / f"a{d}" / "b" / f"f{f}").write_bytes(b"x" * f)
    expected = {os.stat(p).st_ino for p in [root, *root.rglob("*")]}
    real, seen = os.fsync, set()

    def fsync(fd):
        seen.add(os.fstat(fd).st_ino)
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    fsync_tree(root)
    assert seen == expected

    walked = [os.path.join(dp, n) for dp, _, names in os.walk(root) for n in names]
    first, second = walked[7], walked[-3]  # the first and a later file in walk order
    errors = {os.stat(first).st_ino: errno.EIO, os.stat(second).st_ino: errno.ENOSPC}

    def failing(fd):
        err = errors.get(os.fstat(fd).st_ino)
        if err:
            raise OSError(err, os.strerror(err))
        return real(fd)

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError, match="Input/output error"):
        fsync_tree(root)

    def no_threads(self, *a, **k):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(ThreadPoolExecutor, "submit", no_threads)
    seen.clear()
    fsync_tree(root)
    assert seen == expected


def test_arrays_written_together_read_back_and_match_a_one_at_a_time_write(tmp_path):
    """write_artifact writes a group's arrays concurrently on zarr's event loop: every kind of array (a multi-chunk
    float array written in slabs, text, a 0-d and an empty array) reads back exactly, its chunk files lie beside its
    ``zarr.json`` (separator "."), and every chunk file and array ``zarr.json`` is byte for byte what a write of one
    slab at a time (a budget of 0) makes."""
    from graphdiff_cli.io import artifacts
    from graphdiff_cli.io.artifacts import read_artifact, write_artifact

    rng = np.random.default_rng(0)
    arrays = {"q": rng.random((9000, 1000), dtype=np.float32),  # 36 MB: three 16 MiB chunk rows
              "ids": np.array([f"p{i}" for i in range(3000)]), "t": np.array(7), "none": np.zeros((0, 3)),
              **{f"c{i}": rng.integers(0, 9, 5000) for i in range(20)}}
    together = write_artifact(tmp_path / "together", "test", arrays, attrs={"step": 3})
    budget = artifacts._write_budget
    try:
        artifacts._write_budget = lambda: 0
        alone = write_artifact(tmp_path / "alone", "test", arrays, attrs={"step": 3})
    finally:
        artifacts._write_budget = budget
    art = read_artifact(together, "test")
    assert art.names == tuple(sorted(arrays)) and art.attr("step") == 3
    for name, arr in arrays.items():
        got = art.array(name)
        assert got.shape == arr.shape and (got.astype(arr.dtype) == arr).all(), name
    files = sorted(p.relative_to(together) for p in together.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(alone) for p in alone.rglob("*") if p.is_file())
    assert [f.name for f in files if f.parts[0] == "q"] == ["c.0.0", "c.1.0", "c.2.0", "zarr.json"]  # no c/ folders
    for f in files:
        if f != Path("zarr.json"):  # the group's holds the stamp's creation time
            assert (together / f).read_bytes() == (alone / f).read_bytes(), f


def test_a_failed_chunk_write_waits_for_the_others_and_leaves_nothing(tmp_path, monkeypatch):
    """One chunk's write failing (the second chunk of a three-chunk array; the store says ENOSPC) fails the artifact
    with that error, but only once every other chunk's write has ended, its own array's included: nothing is still
    writing into the staging folder when it is removed, and neither the destination nor any staging folder is left."""
    import asyncio

    import zarr.storage._local as local

    from graphdiff_cli.io.artifacts import write_artifact

    real, ended = local.LocalStore.set, []

    async def set_(self, key, value, *a, **k):
        if key == "q/c.1.0":
            raise OSError(errno.ENOSPC, "No space left on device")
        if key.startswith(("q/c", "a")) and not key.endswith("zarr.json"):
            await asyncio.sleep(0.2)  # still writing when the failed chunk raises
            ended.append(key)
        return await real(self, key, value, *a, **k)

    monkeypatch.setattr(local.LocalStore, "set", set_)
    rows = (16 << 20) // (1000 * 4)  # one 16 MiB chunk row
    arrays = {"q": np.ones((3 * rows, 1000), np.float32), **{f"a{i}": np.arange(100) + i for i in range(8)}}
    with pytest.raises(OSError, match="No space left"):
        write_artifact(tmp_path / "out", "test", arrays)
    assert sorted(ended) == sorted(["q/c.0.0", "q/c.2.0", *(f"a{i}/c.0" for i in range(8))])
    time.sleep(0.5)  # nothing left running remakes the staging folder
    assert list(tmp_path.iterdir()) == []


def test_the_byte_budget_bounds_the_writes_in_flight():
    """At most ``limit`` bytes of writes run at once; a write larger than the budget runs alone; 0 is one at a time."""
    import asyncio

    from graphdiff_cli.io.artifacts import _ByteBudget

    def run(limit, costs):
        state = {"now": 0, "n": 0, "peak": 0, "most": 0, "big_alone": []}

        async def work(cost):
            state["now"] += cost
            state["n"] += 1
            state["peak"], state["most"] = max(state["peak"], state["now"]), max(state["most"], state["n"])
            await asyncio.sleep(0.002)
            if cost > limit:
                state["big_alone"].append(state["n"] == 1)
            state["now"] -= cost
            state["n"] -= 1

        async def main():
            budget = _ByteBudget(limit)
            await asyncio.gather(*(budget.run(c, work(c)) for c in costs))

        asyncio.run(main())
        return state

    assert (run(100, [30] * 10)["peak"], run(100, [30] * 10)["most"]) == (90, 3)
    mixed = run(100, [30, 500, 30, 30, 60])
    assert mixed["big_alone"] == [True] and mixed["most"] >= 2
    assert max(mixed["peak"] - 500, 0) == 0
    none = run(0, [5] * 6)
    assert (none["peak"], none["most"]) == (5, 1)


def test_an_interrupted_write_starts_no_more_writes_and_leaves_nothing(tmp_path, monkeypatch):
    """ctrl-C or SIGTERM (a KeyboardInterrupt in the thread waiting on zarr's loop) stops the group's writes: the
    coroutine on zarr's loop would otherwise go on after the staging folder is removed, making it again (LocalStore
    makes a chunk's parent folders) with every array and the stamp in it. None starts after the interrupt, the
    ones running end before it is raised, and neither the destination nor any staging folder is left."""
    import asyncio
    import signal
    import threading
    import time

    import zarr.core.array

    from graphdiff_cli.io import artifacts
    from graphdiff_cli.io.artifacts import write_artifact

    real, main, log = zarr.core.array.AsyncArray.setitem, threading.main_thread().ident, []

    async def setitem(self, selection, value, *a, **k):
        log.append(("start", self.basename))
        if self.basename == "a0":
            signal.pthread_kill(main, signal.SIGINT)  # what ctrl-C does to the thread waiting in sync()
        await asyncio.sleep(0.3)  # the main thread takes the signal meanwhile, even on a loaded machine
        await real(self, selection, value, *a, **k)
        log.append(("end", self.basename))

    monkeypatch.setattr(zarr.core.array.AsyncArray, "setitem", setitem)
    monkeypatch.setattr(artifacts, "_write_budget", lambda: 0)  # one write at a time: the others still to start
    # ctrl-C raises KeyboardInterrupt, even where this process was started with SIGINT ignored (a background job of
    # a non-interactive shell, as CI may start it: Python then installs no handler of its own)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    arrays = {f"a{i}": np.arange(100) + i for i in range(8)}
    try:
        with pytest.raises(KeyboardInterrupt):
            write_artifact(tmp_path / "out", "test", arrays)
    finally:
        signal.signal(signal.SIGINT, previous)
    at_raise = list(log)
    time.sleep(0.5)  # what a coroutine left running would write meanwhile
    assert log == at_raise == [("start", "a0"), ("end", "a0")]
    assert list(tmp_path.iterdir()) == []
