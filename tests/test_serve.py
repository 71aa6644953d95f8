"""``graphdiff serve``: a shell loop's per-step calls answered by one resident process, with the same
output and exit codes as the command run in its own process (real processes, the installed console
script, a real Unix socket)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from _handoff_fixtures import GRAPHDIFF, make_inputs
from graphdiff_cli.cli.wire import FORWARDED_ENV, MAX_REPLY, MessageError, recv_message, socket_path

pytestmark = pytest.mark.skipif(not hasattr(__import__("socket"), "AF_UNIX"), reason="no Unix sockets here")


def _gd(*args, cwd, env=None, timeout=300):
    return subprocess.run([str(GRAPHDIFF), *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd,
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


# ---------------------------------------------------------------------------------------------------
# attacks on the socket: stalled, malformed, huge, impostor, wrong-STATE requests; OS errors of serve


def _frame(obj) -> bytes:
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return struct.pack(">Q", len(data)) + data


def _frames(sock: socket.socket, timeout: float = 30.0) -> list:
    """The frames the server sends on ``sock`` until its final one (a ``code``), the close, or ``timeout``
    seconds; a trailing "timeout" when it said nothing more within that time."""
    out, deadline = [], time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return out + ["timeout"]
        try:
            frame = recv_message(sock, MAX_REPLY, left)  # the client's own reader of a frame
        except socket.timeout:
            return out + ["timeout"]
        except (OSError, MessageError):
            return out
        if frame is None:
            return out
        out.append(frame)
        if "code" in frame:
            return out


def _ask(path, payload, timeout: float = 30.0) -> list:
    """Send one raw request (an object, or bytes sent as they are) to the socket ``path``; the frames back."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(str(path))
    try:
        with contextlib.suppress(OSError):  # a refused request may be closed before it is all sent
            sock.sendall(payload if isinstance(payload, bytes) else _frame(payload))
        return _frames(sock, timeout)
    finally:
        sock.close()


def _one_line_refusal(frames) -> str:
    """The refusal a bad request gets: a final frame with a non-zero code and one error line on stderr."""
    assert frames and isinstance(frames[-1], dict) and frames[-1].get("code", 0) != 0, frames
    lines = frames[-1]["stderr"].splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphdiff: error: "), frames
    return lines[0]


def _stop(server, timeout: float = 60.0):
    server.send_signal(signal.SIGTERM)
    return server.communicate(timeout=timeout)


def _vmhwm_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_a_stalled_connection_neither_hangs_the_server_nor_its_clients(two_states):
    """A client that sends 3 bytes of a message and waits: the server goes on answering others, and closes
    the stalled connection with a one-line error once its read timeout has passed."""
    root, _ = two_states
    folder = root / "served"
    server = _start(folder)
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        stalled.connect(str(socket_path(folder / "STATE")))
        stalled.sendall(b"\x00\x00\x00")
        t0 = time.monotonic()
        res = _gd("--json", "status", "--state", "STATE", cwd=folder, timeout=60)  # blocked until killed before
        assert res.returncode == 0 and json.loads(res.stdout)["step"] == 0, res.stderr
        assert time.monotonic() - t0 < 30
        assert res.stderr == ""  # answered by the server, nothing to warn about
        _one_line_refusal(_frames(stalled, timeout=30))  # the server's read timeout closed it
    finally:
        stalled.close()
        out, err = _stop(server)
    assert server.returncode == 0 and "served 1 requests" in out + err, err


def test_a_server_that_does_not_answer_is_not_waited_for_and_is_sent_only_what_the_command_reads(two_states):
    """Something of the client's own uid listens on STATE.sock, reads the request and never answers: the
    client gives up within its bound and runs the command itself. What it sent holds the command line and
    the variables graphdiff reads, not the rest of the environment."""
    root, _ = two_states
    folder = root / "served"
    path = socket_path(folder / "STATE")
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        mute.bind(str(path))
    finally:
        os.umask(old)
    mute.listen(4)
    got = []

    def listen():
        conn, _ = mute.accept()
        with conn:
            conn.settimeout(90)
            data = b""
            with contextlib.suppress(OSError):
                while chunk := conn.recv(1 << 16):  # never answers; reads until the client gives up
                    data += chunk
            got.append(data)

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    try:
        t0 = time.monotonic()
        res = _gd("--json", "status", "--state", "STATE", cwd=folder, timeout=60,
                  env={"GRAPHDIFF_SECRET": "s3cret", "AWS_SECRET_ACCESS_KEY": "k", "GRAPHDIFF_DEBUG": "1"})
        assert res.returncode == 0 and json.loads(res.stdout)["step"] == 0, res.stderr  # run in its own process
        assert time.monotonic() - t0 < 40
        assert len(res.stderr.splitlines()) == 1 and "did not answer" in res.stderr, res.stderr
        thread.join(timeout=30)
        request = json.loads(got[0][8:])
        assert request["argv"] == ["--json", "status", "--state", "STATE"]
        # of the variables set here, only the one graphdiff reads; of the caller's own environment, only those it
        # reads too (OMP_NUM_THREADS where the shell sets it: the test must hold in any environment)
        inherited = {k for k in FORWARDED_ENV if k in os.environ}
        assert set(request["env"]) == {"GRAPHDIFF_DEBUG"} | inherited
        assert not {"GRAPHDIFF_SECRET", "AWS_SECRET_ACCESS_KEY"} & set(request["env"])
    finally:
        mute.close()


def test_a_malformed_request_is_refused_on_its_connection_and_the_server_goes_on(two_states):
    root, _ = two_states
    folder = root / "served"
    path = socket_path(folder / "STATE")
    server = _start(folder)
    good = {"v": 2, "argv": ["status", "--state", "STATE"], "cwd": str(folder), "env": {}}
    bad = [
        [1, 2, 3],                                   # a list, not an object (AttributeError before)
        {**good, "cwd": None},                       # TypeError before
        {**good, "env": ["x"]},
        {**good, "env": {"GRAPHDIFF_DEBUG": "a\x00b"}},  # ValueError before
        {**good, "argv": "status"},
        {**good, "argv": ["status", 7]},
        {**good, "argv": ["status", "--state", "ST\x00ATE"]},
        {**good, "cwd": "relative/folder"},
        {key: value for key, value in good.items() if key != "argv"},
        b"\xff\xfe not JSON",
        b"[" * 200_000,                              # deeper than the JSON parser recurses
        b"",
        b'"a string"',
    ]
    try:
        for payload in bad:
            _one_line_refusal(_ask(path, _frame(payload)))  # bytes: the body as it is; else as JSON
            assert server.poll() is None, payload
        res = _gd("--json", "status", "--state", "STATE", cwd=folder, timeout=60)
        assert res.returncode == 0 and json.loads(res.stdout)["step"] == 0 and res.stderr == ""
    finally:
        out, err = _stop(server)
    assert server.returncode == 0 and "served 1 requests" in out + err, err


def _impostor(path: Path, uid: int, mode: int):
    """A socket at ``path`` bound here, then handed to ``uid`` with ``mode``, answering every request
    ``{"code": 0}``; the list of what it received."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chown(path, uid, uid)
    os.chmod(path, mode)
    sock.listen(8)
    sock.settimeout(0.2)
    got, stop = [], threading.Event()

    def answer():
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    got.append(conn.recv(1 << 20))
                    conn.sendall(_frame({"code": 0}))

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return sock, got, stop


@pytest.mark.skipif(os.geteuid() != 0, reason="hands a socket to another uid: needs root")
def test_a_socket_of_another_user_is_not_trusted_and_serve_says_whose_it_is(two_states):
    """Another user bound STATE.sock first (mode 0777) and answers {"code": 0} to everything: the client
    sends it nothing and runs the update itself; `serve` is refused in one line naming the socket's owner."""
    root, ids = two_states
    folder = root / "served"
    path = socket_path(folder / "STATE")
    sock, got, stop = _impostor(path, 65534, 0o777)
    try:
        (folder / "o.jsonl").write_text(_rows(ids, 1))
        res = _gd("update", "--state", "STATE", "--step", 1, "--outcomes", "o.jsonl", "--json", cwd=folder,
                  env={"GRAPHDIFF_SECRET": "s3cret"}, timeout=120)
        assert res.returncode == 0 and json.loads(res.stdout)["step"] == 1, (res.stdout, res.stderr)
        assert len(res.stderr.splitlines()) == 1 and "65534" in res.stderr, res.stderr  # the one warning
        status = _gd("--json", "status", "--state", "STATE", cwd=folder, env={"GRAPHDIFF_NO_SERVE": "1"})
        assert json.loads(status.stdout)["step"] == 1  # applied, not swallowed
        assert got == []  # not even connected to: no argv, no cwd, no environment
        again = _gd("serve", "--state", "STATE", cwd=folder, timeout=120)
        assert again.returncode == 7, again.stderr
        line = again.stderr.strip()
        assert len(line.splitlines()) == 1 and str(path) in line and "uid 65534" in line, line
        assert got == []
    finally:
        stop.set()
        sock.close()


def _shared_folder(two_states) -> Path:
    """A sticky folder anyone may create files in (like /tmp), holding a copy of the served STATE."""
    folder = Path(tempfile.mkdtemp(prefix="gd-shared-", dir="/tmp"))
    os.chmod(folder, 0o1777)
    shutil.copytree(two_states[0] / "served" / "STATE", folder / "STATE")
    return folder


def _as_nobody(*argv, **kwargs):
    return subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *map(str, argv)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


NOBODY_LISTENS = r"""
import socket, struct, sys, json, os
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.bind(sys.argv[1]); sock.listen(4); sock.settimeout(60)
print("listening", flush=True)
conn, _ = sock.accept(); conn.settimeout(60)
data = b""
try:
    while chunk := conn.recv(1 << 16):
        data += chunk
        if len(data) >= 8 and len(data) >= 8 + struct.unpack(">Q", data[:8])[0]:
            conn.sendall(struct.pack(">Q", 11) + b'{"code": 0}')
except OSError:
    pass
print(len(data), flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="runs a process as nobody: needs "
                    "root and setpriv")
def test_a_server_run_by_another_user_is_not_trusted_even_behind_a_file_that_looks_right(two_states):
    """`nobody` listens on STATE.sock in a shared sticky folder and the file is then made root's, mode 0600:
    only the listener's credentials (SO_PEERCRED) tell, and the client sends it nothing."""
    folder, imp = _shared_folder(two_states), None
    try:
        path = socket_path(folder / "STATE")
        imp = _as_nobody(sys.executable, "-c", NOBODY_LISTENS, path)
        if imp.stdout.readline().strip() != "listening":
            pytest.skip(f"no process as nobody here: {imp.communicate(timeout=30)}")
        os.chown(path, 0, 0)
        os.chmod(path, 0o600)
        res = _gd("--json", "status", "--state", "STATE", cwd=folder, env={"GRAPHDIFF_SECRET": "s3cret"}, timeout=60)
        assert res.returncode == 0 and json.loads(res.stdout)["step"] == 0, (res.stdout, res.stderr)
        assert len(res.stderr.splitlines()) == 1 and "65534" in res.stderr, res.stderr
        out, _ = imp.communicate(timeout=90)
        assert out.split()[-1] == "0", out  # it got a connection and not one byte
    finally:
        if imp is not None and imp.poll() is None:
            imp.kill()
        shutil.rmtree(folder, ignore_errors=True)


NOBODY_ASKS = r"""
import socket, struct, sys, json
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); sock.settimeout(30)
sock.connect(sys.argv[1])
req = json.dumps({"v": 2, "argv": ["--json", "status", "--state", "STATE"], "cwd": sys.argv[2], "env": {}}).encode()
data = b""
try:
    sock.sendall(struct.pack(">Q", len(req)) + req)  # refused before it is read: the pipe may break
except OSError:
    pass
try:
    while chunk := sock.recv(1 << 16):
        data += chunk
except OSError:
    pass
print(json.dumps(data.decode(errors="replace")))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="runs a process as nobody: needs "
                    "root and setpriv")
def test_the_server_refuses_a_peer_of_another_uid(two_states):
    """The socket made connectable by everyone (0666): a request from uid 65534 is refused in one line
    (SO_PEERCRED), and the server goes on serving its owner."""
    folder = _shared_folder(two_states)
    server = _start(folder)
    try:
        path = socket_path(folder / "STATE")
        os.chmod(path, 0o666)
        asker = _as_nobody(sys.executable, "-c", NOBODY_ASKS, path, folder)
        out, err = asker.communicate(timeout=60)
        if asker.returncode != 0:
            pytest.skip(f"no process as nobody here: {err}")
        reply = json.loads(out)
        assert '"step"' not in reply and "uid 65534" in reply, reply
        res = _gd("--json", "status", "--state", "STATE", cwd=folder, timeout=60)  # the owner's client: not a 0666 one
        assert res.returncode == 0 and "other users may write to it (mode 0666)" in res.stderr, res.stderr
        os.chmod(path, 0o600)
        res = _gd("--json", "status", "--state", "STATE", cwd=folder, timeout=60)
        assert res.returncode == 0 and res.stderr == "" and json.loads(res.stdout)["step"] == 0
    finally:
        out, err = _stop(server)
        shutil.rmtree(folder, ignore_errors=True)
    assert server.returncode == 0 and "served 1 requests" in out + err, err


def test_the_server_runs_only_the_handoff_commands_of_its_own_state(two_states):
    """`serve --state S2` sent to S.sock made the server serve S2 for good (two SIGTERMs to stop it); any
    other STATE or command is refused in one line and S goes on being served; one SIGTERM stops it."""
    root, _ = two_states
    folder, other = root / "served", root / "plain" / "STATE"
    path = socket_path(folder / "STATE")
    server = _start(folder)
    ask = {"v": 2, "cwd": str(folder), "env": {}}
    try:
        for argv, env in [(["serve", "--state", str(other)], {}),
                          (["status", "--state", str(other)], {}),
                          (["status", "--state", "STATE", "--state", str(other)], {}),
                          (["status", f"--state={other}"], {}),
                          (["status"], {"GRAPHDIFF_STATE": str(other)}),
                          (["rollback", "--state", "STATE", "--to", "0"], {}),
                          (["init", "--graph", "g", "--clusters", "c", "--out", "X"], {}),
                          (["verify", "--state", "STATE"], {}),
                          (["--install-completion", "bash"], {})]:
            line = _one_line_refusal(_ask(path, {**ask, "argv": argv, "env": env}, timeout=20))
            assert server.poll() is None, argv
        assert "STATE" in line
        assert not socket_path(other).exists()
        res = _gd("--json", "status", "--state", "STATE", cwd=folder, timeout=60)
        assert res.returncode == 0 and res.stderr == "" and json.loads(res.stdout)["step"] == 0
        # its own STATE by another name (absolute, through GRAPHDIFF_STATE) is its own
        res = _gd("--json", "status", cwd=root, env={"GRAPHDIFF_STATE": str(folder / "STATE")}, timeout=60)
        assert res.returncode == 0 and res.stderr == "" and json.loads(res.stdout)["step"] == 0
        server.send_signal(signal.SIGTERM)  # once
        out, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0 and "served 2 requests" in out + err, err


def test_a_huge_request_is_refused_from_its_length_without_reading_it(two_states):
    """A request announcing 400 MB (and one really sent at 2 MiB) is refused in one line from its length; the
    server's peak memory does not move and it goes on serving."""
    root, _ = two_states
    folder = root / "served"
    path = socket_path(folder / "STATE")
    server = _start(folder)
    try:
        before = _vmhwm_kb(server.pid)
        t0 = time.monotonic()
        line = _one_line_refusal(_ask(path, struct.pack(">Q", 400_000_000) + b"{" * 65536, timeout=20))
        assert time.monotonic() - t0 < 15 and "400000000" in line, line
        big = {"v": 2, "argv": ["status", "--state", "STATE", "x" * (2 << 20)], "cwd": str(folder), "env": {}}
        _one_line_refusal(_ask(path, big, timeout=20))
        _one_line_refusal(_ask(path, struct.pack(">Q", (1 << 64) - 1), timeout=20))
        assert _vmhwm_kb(server.pid) - before < 32 * 1024
        res = _gd("--json", "status", "--state", "STATE", cwd=folder, timeout=60)
        assert res.returncode == 0 and res.stderr == "" and json.loads(res.stdout)["step"] == 0
    finally:
        out, err = _stop(server)
    assert server.returncode == 0 and "served 1 requests" in out + err, err


def _in_own_mounts(script: str, **env) -> subprocess.CompletedProcess:
    """``script`` (sh) in a private mount namespace, so its mounts vanish with it."""
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-ec", script], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **env})


def _can_mount() -> bool:
    if not shutil.which("unshare"):
        return False
    with contextlib.suppress(Exception):
        return _in_own_mounts("d=$(mktemp -d); mount -t tmpfs -o size=1m tmpfs $d").returncode == 0
    return False


@pytest.mark.skipif(not _can_mount(), reason="needs unshare and mount (root or CAP_SYS_ADMIN) for a read-only "
                    "and a full file system")
@pytest.mark.parametrize("disk, says", [("read-only", "Read-only file system"), ("full", "No space left on device")])
def test_serve_on_a_read_only_or_full_file_system_names_the_socket_and_the_error(two_states, tmp_path, disk, says):
    root, _ = two_states
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    inodes = sum(1 for _ in (root / "served" / "STATE").rglob("*")) + 8
    limit = f"size=64m,nr_inodes={inodes}" if disk == "full" else "size=64m"
    then = ("mount -o remount,ro \"$M\"" if disk == "read-only" else
            "i=0; while touch \"$M/fill$i\" 2>/dev/null; do i=$((i+1)); done")
    res = _in_own_mounts(f'mount -t tmpfs -o {limit} tmpfs "$M"; cp -a "$SRC" "$M/STATE"; {then}; '
                         f'"$GD" serve --state "$M/STATE" --json', M=str(mnt), SRC=str(root / "served" / "STATE"),
                         GD=str(GRAPHDIFF))
    assert res.returncode == 7, (res.stdout, res.stderr)
    err = json.loads(res.stdout)
    assert err["kind"] == "conflict" and str(socket_path(mnt / "STATE")) in err["error"] and says in err["error"], err
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
