"""``graphdiff serve``'s loop: command lines from ``client.forward`` run one at a time in this process,
whose imports and resident ``State`` objects outlive each call.

Each request is run as the console script would run it (``common.run``), in the client's working directory
and with the variables the command reads (``wire.FORWARDED_ENV``) as the client had them, with stdout and
stderr captured for the reply, so output, ``--json`` and exit codes are the same bytes as a command run in its
own process. Requests are served in order: writes to a STATE are serialized by its lock anyway, and a reader
waits for the request ahead of it. A client that goes away mid-request does not stop it (an update then
committed is a no-op when sent again). SIGTERM or ctrl-C stops the server: the request in progress ends as an
interrupted command does (its write undone), the socket is removed.

What a connection can do to the server is bounded (docs/reference/handoff.md, "What the server accepts"): each
connection is read and answered by a thread of its own with a deadline per message (``wire.IO_TIMEOUT``), so
a stalled one holds nothing but itself; a request longer than ``wire.MAX_REQUEST`` is refused from its
length; a peer of another uid (SO_PEERCRED), a malformed request, a command other than ``update``,
``predict``, ``select``, ``allocate`` and ``status``, or any STATE but the served one is refused in one line on
that connection, and the server goes on. Only the main thread runs commands (so SIGTERM interrupts the one
in progress, as in a command's own process).
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import queue
import socket
import stat
import threading
import time
from pathlib import Path

from ..errors import StateError
from .wire import (COMMANDS, FORWARDED_ENV, GLOBAL_FLAGS, HEARTBEAT, IO_TIMEOUT, MAX_CONNECTIONS, MAX_REQUEST,
                   PROTOCOL, MessageError, connect, peer_uid, recv_message, send_message, socket_path)

MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes on Linux, 104 on macOS


def _os_error(path, doing: str, exc: OSError) -> StateError:
    """An OSError of the socket file as the one line every command gives: the path, what failed and why (a
    read-only or full file system, a folder that may not be written), as a StateError (exit 7, "conflict",
    as `update`'s lock on the same STATE)."""
    why = exc.strerror or errno.errorcode.get(exc.errno or 0) or str(exc)
    return StateError(f"{path}: cannot {doing} ({why}); graphdiff serve creates its socket beside the STATE, "
                      "in a folder it must be able to write")


def bind(state) -> tuple[socket.socket, Path]:
    """The listening socket ``<STATE>.sock`` (mode 0600): refused while another server answers on it, while
    another user's socket or a file that is not a socket is there; a stale socket of this user (its server
    gone) is replaced."""
    path = socket_path(Path(state).absolute())
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise StateError(f"the socket path {path} is longer than {MAX_SOCKET_PATH} bytes (a Unix socket's limit): "
                         "serve a STATE with a shorter path (a symlink to it works)")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _os_error(path, "look at the socket", exc) from None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise StateError(f"{path} exists and is not a socket: move it away to serve this STATE")
        if st.st_uid != os.geteuid():
            raise StateError(f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}): another "
                             "user's socket blocks serving this STATE (clients ignore it and run each command "
                             "themselves); remove it, or ask its owner to")
        live = connect(path)
        if live is not None:
            live.close()
            raise StateError(f"another graphdiff serve already answers on {path}")
        try:
            path.unlink()  # stale: its server is gone
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _os_error(path, "remove the stale socket (its server is gone)", exc) from None
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        srv.bind(str(path))
        srv.listen(MAX_CONNECTIONS)
    except OSError as exc:
        srv.close()
        if exc.errno == errno.EADDRINUSE:
            raise StateError(f"{path}: another process bound this socket first; graphdiff serve did not "
                             "replace it") from None
        raise _os_error(path, "create the socket", exc) from None
    finally:
        os.umask(old)
    return srv, path


# ------------------------------------------------------------------------------------------- requests


class Refused(Exception):
    """A request the server will not run: said in one line on its connection (``code``: its exit code)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def _refusal(message: str, code: int = 2) -> dict:
    from .common import plain_line

    line = plain_line(message)
    return {"code": code, "stdout": "", "stderr": f"graphdiff: error: {line}\n", "refused": line}


def _str(value, what: str) -> str:
    if not isinstance(value, str):
        raise Refused(f"malformed request: {what} is a JSON {type(value).__name__}, not a string")
    if "\x00" in value:
        raise Refused(f"malformed request: {what} holds a NUL character")
    return value


def _state_candidates(argv: list[str]) -> list[str]:
    """Every value ``--state`` could take from ``argv``: each token after a ``--state`` and each
    ``--state=VALUE`` (click takes the last that it parses as the option; all are checked)."""
    out = []
    for i, arg in enumerate(argv):
        if arg == "--state":
            out.append(argv[i + 1] if i + 1 < len(argv) else "")
        elif arg.startswith("--state="):
            out.append(arg.split("=", 1)[1])
    return out


def _same_dir(cwd: str, name: str, served: tuple[int, int]) -> bool:
    if not name:
        return False
    try:
        st = os.stat(os.path.join(cwd, name))
    except (OSError, ValueError):
        return False
    return (st.st_dev, st.st_ino) == served


def check(req: dict, served: tuple[int, int], served_path: Path) -> dict:
    """The request as the server runs it (argv, cwd, env), or Refused: a malformed request; a command other
    than the handoff ones; a STATE other than the served one, through --state or GRAPHDIFF_STATE."""
    if req.get("v") != PROTOCOL:
        raise Refused(f"this graphdiff serve speaks protocol {PROTOCOL}, the client another: restart graphdiff "
                      "serve with the installed graphdiff (or set GRAPHDIFF_NO_SERVE=1)")
    argv, cwd, env = req.get("argv"), req.get("cwd"), req.get("env", {})
    if not isinstance(argv, list):
        raise Refused(f"malformed request: argv is a JSON {type(argv).__name__}, not a list")
    argv = [_str(a, "an argument") for a in argv]
    cwd = _str(cwd, "cwd")
    if not os.path.isabs(cwd):
        raise Refused("malformed request: cwd is not an absolute path")
    if not isinstance(env, dict):
        raise Refused(f"malformed request: env is a JSON {type(env).__name__}, not an object")
    for key, value in env.items():
        if key not in FORWARDED_ENV:
            raise Refused(f"malformed request: env holds {key[:80]!r}, not a variable graphdiff reads")
        _str(value, f"env[{key}]")
    rest = list(argv)
    while rest and rest[0] in GLOBAL_FLAGS:
        rest.pop(0)
    if not rest or rest[0] not in COMMANDS:
        name = rest[0][:80] if rest else "nothing"
        raise Refused(f"graphdiff serve runs {', '.join(COMMANDS)} for its STATE, not {name!r}: run that "
                      "command in its own process", 7)
    candidates = _state_candidates(argv)
    env = dict(env)
    if candidates:
        wrong = [c for c in candidates if not _same_dir(cwd, c, served)]
        env["GRAPHDIFF_STATE"] = str(served_path)  # what click falls back to can only be the served STATE
    else:
        wrong = [] if _same_dir(cwd, env.get("GRAPHDIFF_STATE", ""), served) else [env.get("GRAPHDIFF_STATE", "")]
    if wrong:
        raise Refused(f"this graphdiff serve serves the STATE {served_path}, not {wrong[0][:300]!r}: run the "
                      "command in its own process (or serve that STATE)", 7)
    return {"argv": argv, "cwd": cwd, "env": env}


@contextlib.contextmanager
def _as_client(req: dict):
    """The client's working directory and the variables the command reads, for one request."""
    cwd = os.getcwd()
    saved = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    for k in saved:
        del os.environ[k]
    os.environ.update(req["env"])
    try:
        os.chdir(req["cwd"])
        yield
    finally:
        os.chdir(cwd)
        for k in FORWARDED_ENV:
            os.environ.pop(k, None)
        os.environ.update(saved)


def handle(req: dict) -> dict:
    """Run one checked command line (``check``); its exit code and captured output."""
    from .common import OUT, plain_line, run

    out, err = io.StringIO(), io.StringIO()
    mine = (OUT.json, OUT.quiet, OUT.verbose)  # the server's own output settings, not the request's
    t0 = time.perf_counter()
    try:
        with _as_client(req), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = run(req["argv"])
    except Exception as exc:  # noqa: BLE001 - the client's working directory is gone, ...: its error, not the server's
        return {"code": 1, "stdout": "", "stderr": f"graphdiff: error: {plain_line(str(exc))}\n", "seconds": 0.0}
    finally:
        OUT.json, OUT.quiet, OUT.verbose = mine
    return {"code": int(code), "stdout": out.getvalue(), "stderr": err.getvalue(),
            "seconds": time.perf_counter() - t0}


# ------------------------------------------------------------------------------------------- the loop


class _Job:
    def __init__(self, req: dict):
        self.req, self.reply, self.done = req, None, threading.Event()


class _Server:
    """The listening socket's threads: one accepts, one per connection reads, checks, waits and answers; the
    main thread runs the jobs they queue (``run``)."""

    def __init__(self, srv: socket.socket, path: Path, served: tuple[int, int], served_path: Path):
        self.srv, self.path, self.served, self.served_path = srv, path, served, served_path
        self.jobs: queue.Queue[_Job] = queue.Queue()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.open = 0  # connections being served
        self.last = time.monotonic()  # the last connection accepted or request finished
        self.me = os.geteuid()

    def accept_loop(self) -> None:
        self.srv.settimeout(0.25)
        while not self.stop.is_set():
            try:
                conn, _ = self.srv.accept()
            except (socket.timeout, BlockingIOError, InterruptedError):
                continue
            except OSError:  # the socket was closed: the server stops
                return
            self.last = time.monotonic()
            with self.lock:
                busy = self.open >= MAX_CONNECTIONS
                self.open += not busy
            if busy:
                with contextlib.suppress(OSError):
                    send_message(conn, _refusal(f"graphdiff serve is busy ({MAX_CONNECTIONS} connections open): "
                                                "run the command in its own process", 5), timeout=0.5)
                conn.close()
                continue
            threading.Thread(target=self.converse, args=(conn,), daemon=True).start()

    def converse(self, conn: socket.socket) -> None:
        """One connection, never more than its own thread: every error of the client's ends here."""
        try:
            with conn:
                self._converse(conn)
        except Exception:  # noqa: BLE001,S110 - a broken connection is the client's: the server goes on
            pass
        finally:
            with self.lock:
                self.open -= 1

    def _converse(self, conn: socket.socket) -> None:
        uid = peer_uid(conn)
        if uid is not None and uid != self.me:
            send_message(conn, _refusal(f"a client of uid {uid} may not use the graphdiff serve of uid "
                                        f"{self.me}: run the command in its own process", 7))
            return
        try:
            req = recv_message(conn, MAX_REQUEST, IO_TIMEOUT)
            if req is None:  # connected and closed: a liveness probe
                return
            job = _Job(check(req, self.served, self.served_path))
        except socket.timeout:
            send_message(conn, _refusal(f"no whole request within {IO_TIMEOUT:g} s: connection closed"))
            return
        except MessageError as exc:
            send_message(conn, _refusal(f"malformed request: {exc}"))
            return
        except Refused as exc:
            send_message(conn, _refusal(str(exc), exc.code))
            return
        self.jobs.put(job)
        try:
            send_message(conn, {"wait": self.jobs.qsize()})  # taken: the client waits from now on
            while not job.done.wait(HEARTBEAT):
                send_message(conn, {"wait": self.jobs.qsize()})
        except OSError:  # the client went away: its command runs all the same
            return
        if job.reply is not None:
            send_message(conn, job.reply, timeout=IO_TIMEOUT + len(job.reply["stdout"]) / 50e6)

    def run(self, idle_exit: float) -> tuple[int, float]:
        """Run queued jobs until SIGTERM/ctrl-C, an interrupted command, or ``idle_exit`` idle seconds."""
        served, seconds = 0, 0.0
        job = None
        try:
            while True:
                try:
                    job = self.jobs.get(timeout=0.25)
                except queue.Empty:
                    job = None
                    if (idle_exit > 0 and self.open == 0 and self.jobs.empty()
                            and time.monotonic() - self.last >= idle_exit):
                        break
                    continue
                job.reply = handle(job.req)
                job.done.set()
                served, seconds = served + 1, seconds + job.reply["seconds"]
                self.last = time.monotonic()
                if job.reply["code"] == 130:  # the command was interrupted: a signal for the server
                    break
        except KeyboardInterrupt:
            pass
        finally:
            self.stop.set()
            pending = [job] if job is not None else []
            with contextlib.suppress(queue.Empty):
                while True:
                    pending.append(self.jobs.get_nowait())
            for left in pending:  # no reply: the connection closes, its client runs the command itself
                left.done.set()
        return served, seconds


def serve(state, *, idle_exit: float = 0.0, on_ready=None) -> dict:
    """Serve ``state``'s socket until SIGTERM/ctrl-C (or ``idle_exit`` seconds without a request); returns
    what it served."""
    from ..state import State

    State.keep_resident()
    State.open(state).estimator()  # refused in one line unless it is a STATE; read once, before the first call
    served_path = Path(state).absolute()
    st = os.stat(served_path)
    srv, path = bind(state)
    ident = os.stat(path).st_ino
    loop = _Server(srv, path, (st.st_dev, st.st_ino), served_path)
    acceptor = threading.Thread(target=loop.accept_loop, daemon=True)
    try:
        acceptor.start()
        if on_ready is not None:
            on_ready(path)
        served, seconds = loop.run(idle_exit)
    finally:
        loop.stop.set()
        srv.close()
        with contextlib.suppress(OSError):
            if os.lstat(path).st_ino == ident:
                path.unlink()
    return {"state": str(state), "socket": str(path), "requests": served, "seconds": round(seconds, 3)}
