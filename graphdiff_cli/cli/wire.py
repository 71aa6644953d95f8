"""The wire between ``graphdiff`` clients and ``graphdiff serve``, standard library only: where a STATE's server
listens, who may talk to whom, the bounds on each message, and the frames each way.

Every frame is an 8-byte big-endian length and a JSON object. The client sends one request
``{"v": 2, "argv": [...], "cwd": "/abs", "env": {...}}``; the server answers with ``{"wait": n}`` at once (n:
requests ahead of it) and again every ``HEARTBEAT`` seconds while the request waits or runs, then with the
command's result ``{"code", "stdout", "stderr", "seconds"}``, or with a refusal ``{"code", "stdout", "stderr",
"refused"}`` (one line) when it will not run the request.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import time
from pathlib import Path

PROTOCOL = 2
CONNECT_TIMEOUT = 2.0  # a connection to the socket
IO_TIMEOUT = 5.0  # one whole message read or written, on either side
ANSWER_TIMEOUT = 5.0  # client: the server's first frame after the request was sent
SILENCE_TIMEOUT = 15.0  # client: the longest gap between frames once the server took the request
HEARTBEAT = 1.0  # server: a frame at least this often while a request waits or runs
MAX_REQUEST = 1 << 20  # bytes of one request (a command line and a few variables are a few KB)
MAX_REPLY = 64 << 20  # bytes of one reply (a command's stdout and stderr)
MAX_CONNECTIONS = 128  # open at once; more are told the server is busy (and run the command themselves)

COMMANDS = ("update", "predict", "select", "allocate", "status")  # what a client sends and a server runs
GLOBAL_FLAGS = frozenset({"--json", "-q", "--quiet", "-v", "--verbose"})  # before the command name

# The variables a forwarded command reads (update, predict, select, allocate, status and the code under them:
# `grep -rn "environ\|getenv\|envvar" graphdiff_cli`): the client sends these and no others, and the server
# sets exactly these from the request for the command's run.
FORWARDED_ENV = frozenset({
    "GRAPHDIFF_STATE",  # --state's default
    "GRAPHDIFF_DEBUG",  # the error boundary: a traceback instead of one line
    "GRAPHDIFF_TEST_PAUSE_AFTER", "GRAPHDIFF_TEST_PAUSE_FILE",  # io.state_dir's test hook (update)
    "OMP_NUM_THREADS",  # core.graph.usable_cpus: threads for products with W and for array reads
    "NO_COLOR", "COLUMNS",  # rich's output on stderr
})


class MessageError(ValueError):
    """A message that breaks the wire's rules (its length, its JSON, its shape); said in one line."""


def socket_path(state) -> Path:
    """Where ``graphdiff serve --state S`` listens: ``S.sock`` beside the STATE directory, in its own folder."""
    state = Path(state)
    return state.parent / f"{state.name}.sock"


def untrusted(st: os.stat_result) -> str | None:
    """Why a socket file (``os.lstat``'s ``st``) is not one this process may talk to, or None when it may: it
    must be a socket (not a link), owned by this process's effective uid, and writable by no one else. A
    socket file is owned by the uid that bound it (only root can hand it to another), so a user trusts only
    their own server, and root only root's."""
    me = os.geteuid()
    if not stat.S_ISSOCK(st.st_mode):
        return "it is not a socket"
    if st.st_uid != me:
        return f"it belongs to uid {st.st_uid}, not to this user (uid {me})"
    if st.st_mode & 0o022:
        return f"other users may write to it (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED: for a client, the process that
    listens; for the server, the one that connected); None where the OS does not say (then only the socket
    file's owner and mode guard it)."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    try:
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i")))
    except OSError:
        return None
    return uid


def connect(path) -> socket.socket | None:
    """A connection to the server listening on ``path``, or None when none answers (a stale socket)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None
    return sock


def encode(obj: dict) -> bytes:
    data = json.dumps(obj).encode()
    return struct.pack(">Q", len(data)) + data


def send_message(sock: socket.socket, obj: dict, timeout: float = IO_TIMEOUT) -> None:
    """Send one frame, all of it within ``timeout`` seconds (socket.timeout otherwise)."""
    sock.settimeout(timeout)
    sock.sendall(encode(obj))


def recv_message(sock: socket.socket, limit: int, timeout: float = IO_TIMEOUT) -> dict | None:
    """One frame, all of it within ``timeout`` seconds (socket.timeout otherwise), or None when the peer closed
    the connection before its first byte. MessageError (one line) for a length over ``limit`` bytes (refused
    from the length, before the body is read), a connection closed mid-message, or a body that is not a JSON
    object."""
    deadline = time.monotonic() + timeout
    head = _recv_exact(sock, 8, deadline)
    if head is None:
        return None
    (size,) = struct.unpack(">Q", head)
    if size > limit:
        raise MessageError(f"a message of {size} bytes, over the limit of {limit} bytes")
    body = _recv_exact(sock, size, deadline) if size else b""
    if body is None:
        raise MessageError(f"the connection closed in the middle of a message of {size} bytes")
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested deeper than the parser goes
        raise MessageError(f"a message that is not JSON ({exc.__class__.__name__})") from None
    if not isinstance(obj, dict):
        raise MessageError(f"a message that is a JSON {type(obj).__name__}, not an object")
    return obj


def _recv_exact(sock: socket.socket, size: int, deadline: float) -> bytes | None:
    """``size`` bytes by ``deadline``; None when the peer closed before the first one."""
    buf, got = bytearray(size), 0
    view = memoryview(buf)
    while got < size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("timed out")
        sock.settimeout(left)
        n = sock.recv_into(view[got:], min(size - got, 1 << 20))
        if not n:
            if got:
                raise MessageError(f"the connection closed after {got} of {size} bytes")
            return None
        got += n
    return bytes(buf)
