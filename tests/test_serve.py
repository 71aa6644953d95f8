"""``graphdiff serve``: a shell loop's per-step calls answered by one resident process, with the same
output and exit codes as the command run in its own process (real processes, the installed console
script, a real Unix socket)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import pytest

from _handoff_fixtures import GRAPHDIFF, make_inputs
from graphdiff_cli.cli.wire import socket_path

pytestmark = pytest.mark.skipif(not hasattr(__import__("socket"), "AF_UNIX"), reason="no Unix sockets here")


def _gd(*args, cwd, env=None):
    return subprocess.run([str(GRAPHDIFF), *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, **(env or {})})


def _rows(ids, step):
    return "".join(json.dumps({"id": i, "n": 8, "s": (3 * step + k) % 9}) + "\n" for k, i in enumerate(ids[:30]))


@pytest.fixture()
def two_states(tmp_path):
    """The same STATE twice: `served` gets a server, `plain` runs each command in its own process."""
    graph, clusters, ids = make_inputs(tmp_path, n=120, k_states=4, prefix="p")
    for name in ("served", "plain"):
        (tmp_path / name).mkdir()
        assert _gd("init", "--graph", graph, "--clusters", clusters, "--out", "STATE", cwd=tmp_path / name).returncode == 0
    return tmp_path, ids


def _start(folder):
    proc = subprocess.Popen([str(GRAPHDIFF), "serve", "--state", "STATE"], cwd=folder, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    first = proc.stderr.readline()  # said once the socket listens (a stale one may be there before)
    assert first.startswith(f"serving STATE STATE on {socket_path(folder / 'STATE')} "), (first, proc.communicate())
    return proc


def _strip_times(text: str) -> str:
    """A --json result without its timings and dates (which differ from run to run)."""
    obj = json.loads(text)
    for key in [k for k in obj if k in ("timings", "applied_at") or k.endswith("_s")]:
        obj.pop(key)
    return json.dumps(obj, sort_keys=True)


def test_a_served_loop_gives_what_separate_processes_give(two_states):
    root, ids = two_states
    server = _start(root / "served")
    try:
        for folder in ("served", "plain"):
            (root / folder / "outcomes").mkdir()
        for step in (1, 2):
            for folder in ("served", "plain"):
                (root / folder / "outcomes" / f"{step}.jsonl").write_text(_rows(ids, step))
            calls = [("update", "--state", "STATE", "--step", step, "--outcomes", f"outcomes/{step}.jsonl", "--json"),
                     ("update", "--state", "STATE", "--step", step, "--outcomes", f"outcomes/{step}.jsonl", "--json"),
                     ("select", "--state", "STATE", "--batch-size", 8, "--seed", step, "--json"),
                     ("predict", "--state", "STATE", "--out", f"p{step}.csv"),
                     ("update", "--state", "STATE", "--step", step + 2, "--outcomes", f"outcomes/{step}.jsonl")]
            for call in calls:
                a = _gd(*call, cwd=root / "served")
                b = _gd(*call, cwd=root / "plain", env={"GRAPHDIFF_NO_SERVE": "1"})
                assert a.returncode == b.returncode, (call, a.stderr, b.stderr)
                if "--json" in call:
                    assert _strip_times(a.stdout) == _strip_times(b.stdout).replace("plain", "served"), call
                else:
                    assert a.stderr.replace("served", "plain") == b.stderr, call
            assert (root / "served" / f"p{step}.csv").read_bytes() == (root / "plain" / f"p{step}.csv").read_bytes()
        # the second update of each step was the no-op; the gap was refused with its own exit code (4)
        assert json.loads(_gd(*calls[1], cwd=root / "served").stdout)["noop"] is True
        assert _gd(*calls[-1], cwd=root / "served").returncode == 4
        # GRAPHDIFF_STATE instead of --state, and a global flag before the command, are forwarded too
        env = {"GRAPHDIFF_STATE": str(root / "served" / "STATE")}
        status = _gd("--json", "status", cwd=root, env=env)
        assert status.returncode == 0 and json.loads(status.stdout)["step"] == 2
    finally:
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=60)
    assert server.returncode == 0, err
    assert out == ""  # the server's own summary is a log line (on stderr), not the last request's --json
    assert "served 13 requests" in out + err  # 2 x 5 calls, the no-op and the gap again, the status
    assert not socket_path(root / "served" / "STATE").exists()


def test_a_dead_server_leaves_the_loop_running_and_a_second_server_is_refused(two_states):
    root, ids = two_states
    folder = root / "served"
    server = _start(folder)
    again = _gd("serve", "--state", "STATE", cwd=folder)
    assert again.returncode == 7 and again.stderr.strip() == (
        f"graphdiff: error: another graphdiff serve already answers on {socket_path(folder / 'STATE')}")
    server.kill()  # kill -9: the socket file stays behind, nobody answers on it
    server.wait(timeout=60)
    assert socket_path(folder / "STATE").exists()
    (folder / "o.jsonl").write_text(_rows(ids, 1))
    res = _gd("update", "--state", "STATE", "--step", 1, "--outcomes", "o.jsonl", "--json", cwd=folder)
    assert res.returncode == 0 and json.loads(res.stdout)["step"] == 1  # ran in its own process
    restarted = _start(folder)  # the stale socket is replaced
    try:
        res = _gd("update", "--state", "STATE", "--step", 1, "--outcomes", "o.jsonl", "--json", cwd=folder)
        assert res.returncode == 0 and json.loads(res.stdout)["noop"] is True
    finally:
        restarted.send_signal(signal.SIGTERM)
        out, err = restarted.communicate(timeout=60)
    assert "served 1 requests" in out + err


def test_a_write_by_another_process_is_seen_by_the_server(two_states):
    """The server's resident STATE follows CURRENT: a step applied in-process elsewhere is the next
    served call's base (no stale estimator, no gap)."""
    root, ids = two_states
    folder = root / "served"
    server = _start(folder)
    try:
        (folder / "1.jsonl").write_text(_rows(ids, 1))
        (folder / "2.jsonl").write_text(_rows(ids, 2))
        assert _gd("update", "--state", "STATE", "--step", 1, "--outcomes", "1.jsonl", cwd=folder).returncode == 0
        assert _gd("update", "--state", "STATE", "--step", 2, "--outcomes", "2.jsonl", cwd=folder,
                   env={"GRAPHDIFF_NO_SERVE": "1"}).returncode == 0
        shutil.copytree(folder / "STATE", root / "copy")
        served = _gd("predict", "--state", "STATE", "--out", "served.csv", cwd=folder)
        plain = _gd("predict", "--state", str(root / "copy"), "--out", "plain.csv", cwd=folder)
        assert served.returncode == plain.returncode == 0
        assert (folder / "served.csv").read_bytes() == (folder / "plain.csv").read_bytes()
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=60)
