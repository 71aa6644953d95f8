"""``graphdiff serve``'s loop: command lines from ``client.forward`` run one at a time in this process,
whose imports and resident ``State`` objects outlive each call.

Each request is run as the console script would run it (``app.run``), in the client's working directory
and ``GRAPHDIFF_*`` environment, with stdout and stderr captured for the reply, so output, ``--json`` and
exit codes are the same bytes as a command run in its own process. Requests are served in order: writes to
a STATE are serialized by its lock anyway, and a reader waits for the request ahead of it. A client that
goes away mid-request does not stop it (an update then committed is a no-op when sent again). SIGTERM or
ctrl-C stops the server: the request in progress ends as an interrupted command does (its write undone),
the socket is removed.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import stat
import time
from pathlib import Path

from ..errors import StateError
from .wire import connect, forwarded, recv_message, send_message, socket_path

MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes on Linux, 104 on macOS


def bind(state) -> tuple[socket.socket, Path]:
    """The listening socket ``<STATE>.sock`` (mode 0600): refused while another server answers on it; a
    stale one (its server gone) is replaced."""
    path = socket_path(Path(state).absolute())
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise StateError(f"the socket path {path} is longer than {MAX_SOCKET_PATH} bytes (a Unix socket's limit): "
                         "serve a STATE with a shorter path (a symlink to it works)")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None:
        if not stat.S_ISSOCK(mode):
            raise StateError(f"{path} exists and is not a socket: move it away to serve this STATE")
        live = connect(path)
        if live is not None:
            live.close()
            raise StateError(f"another graphdiff serve already answers on {path}")
        path.unlink()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        srv.bind(str(path))
    finally:
        os.umask(old)
    srv.listen(64)
    return srv, path


@contextlib.contextmanager
def _as_client(req: dict):
    """The client's working directory and GRAPHDIFF_* environment for one request."""
    cwd = os.getcwd()
    saved = {k: v for k, v in os.environ.items() if forwarded(k)}
    for k in saved:
        del os.environ[k]
    os.environ.update({str(k): str(v) for k, v in (req.get("env") or {}).items()})
    try:
        os.chdir(req["cwd"])
        yield
    finally:
        os.chdir(cwd)
        for k in [k for k in os.environ if forwarded(k)]:
            del os.environ[k]
        os.environ.update(saved)


def handle(req: dict) -> dict:
    """Run one forwarded command line; its exit code and captured output."""
    from .common import OUT, run

    out, err = io.StringIO(), io.StringIO()
    mine = (OUT.json, OUT.quiet, OUT.verbose)  # the server's own output settings, not the request's
    t0 = time.perf_counter()
    try:
        with _as_client(req), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = run([str(a) for a in req["argv"]])
    except OSError as exc:  # the client's working directory is gone
        return {"code": 1, "stdout": "", "stderr": f"graphdiff: error: {exc}\n", "seconds": 0.0}
    finally:
        OUT.json, OUT.quiet, OUT.verbose = mine
    return {"code": int(code), "stdout": out.getvalue(), "stderr": err.getvalue(),
            "seconds": time.perf_counter() - t0}


def serve(state, *, idle_exit: float = 0.0, on_ready=None) -> dict:
    """Serve ``state``'s socket until SIGTERM/ctrl-C (or ``idle_exit`` seconds without a request); returns
    what it served."""
    from ..state import State

    State.keep_resident()
    State.open(state).estimator()  # refused in one line unless it is a STATE; read once, before the first call
    srv, path = bind(state)
    served, seconds = 0, 0.0
    ident = os.stat(path).st_ino
    try:
        if on_ready is not None:
            on_ready(path)
        srv.settimeout(idle_exit if idle_exit > 0 else None)
        while True:
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                break
            with conn:
                try:
                    req = recv_message(conn)
                except (OSError, ValueError):
                    continue
                if req is None or not isinstance(req.get("argv"), list) or "cwd" not in req:
                    continue
                reply = handle(req)
                served, seconds = served + 1, seconds + reply["seconds"]
                with contextlib.suppress(OSError):  # the client went away: its command ran all the same
                    send_message(conn, reply)
                if reply["code"] == 130:  # the command was interrupted: a signal for the server
                    break
    except KeyboardInterrupt:
        pass
    finally:
        srv.close()
        with contextlib.suppress(OSError):
            if os.lstat(path).st_ino == ident:
                path.unlink()
    return {"state": str(state), "socket": str(path), "requests": served, "seconds": round(seconds, 3)}
