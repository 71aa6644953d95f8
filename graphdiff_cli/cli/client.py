"""The console script's first step, standard library only: hand a per-step command to a running
``graphdiff serve``, else run it here.

A shell or cron loop that calls ``graphdiff update`` / ``predict`` / ``select`` / ``allocate`` / ``status``
every step pays Python's imports and the STATE's read on each call. ``graphdiff serve --state S`` keeps them
in one process listening on the Unix socket ``S.sock`` beside the STATE; this module, which imports nothing
of graphdiff's but its version, sends such a command line there (with the working directory and the variables
the command reads, ``wire.FORWARDED_ENV``, never the rest of the environment) and prints the reply's stdout,
stderr and exit code exactly as the command run here would.

The command runs in this process instead, as always, when there is no server (or a stale socket); when the
socket is not this user's own (``wire.untrusted``: another owner, writable by others) or the process listening
on it runs as another uid (SO_PEERCRED), with a warning and nothing sent; and when the server does not take the
request within ``wire.ANSWER_TIMEOUT`` seconds, goes silent for ``wire.SILENCE_TIMEOUT`` seconds, refuses it or
ends before answering, with a warning (every forwarded command is safe to run again: an update it had applied
is then a no-op).
"""

from __future__ import annotations

import os
import socket
import stat
import sys

from .wire import (ANSWER_TIMEOUT, COMMANDS, FORWARDED_ENV, GLOBAL_FLAGS, MAX_REPLY, MAX_REQUEST, PROTOCOL,
                   SILENCE_TIMEOUT, connect, encode, peer_uid, recv_message, send_message, socket_path, untrusted)


def _command_and_state(argv: list[str]) -> tuple[str | None, str | None]:
    """The command name (after the global flags) and the ``--state`` it names (or GRAPHDIFF_STATE)."""
    rest = list(argv)
    while rest and rest[0] in GLOBAL_FLAGS:
        rest.pop(0)
    name = rest[0] if rest else None
    state = os.environ.get("GRAPHDIFF_STATE") or None
    for i, arg in enumerate(rest):
        if arg == "--state" and i + 1 < len(rest):
            state = rest[i + 1]
        elif arg.startswith("--state="):
            state = arg.split("=", 1)[1]
    return name, state


def request(argv: list[str]) -> dict:
    """What the server is sent: the command line, the working directory, and of the environment only the
    variables the command reads."""
    return {"v": PROTOCOL, "argv": list(argv), "cwd": os.getcwd(),
            "env": {k: v for k, v in os.environ.items() if k in FORWARDED_ENV}}


def _warn(argv: list[str], message: str) -> None:
    if not ({"-q", "--quiet"} & set(argv)):
        print(f"graphdiff: warning: {message}; running the command here", file=sys.stderr, flush=True)


def _reply(sock: socket.socket, path, argv: list[str]) -> dict | None:
    """The server's result for the request just sent, or None (said on stderr) when it gives none: it takes the
    request within ANSWER_TIMEOUT seconds, then says it still works on it at least every SILENCE_TIMEOUT."""
    timeout = ANSWER_TIMEOUT
    while True:
        try:
            frame = recv_message(sock, MAX_REPLY, timeout)
        except socket.timeout:
            _warn(argv, f"graphdiff serve on {path} did not answer within {timeout:g} s")
            return None
        except (OSError, ValueError):
            frame = None
        if frame is None:
            _warn(argv, f"the server on {path} ended before answering (a step it had applied is now a no-op)")
            return None
        if "refused" in frame:
            _warn(argv, f"graphdiff serve on {path} refused the call: {frame['refused']}")
            return None
        if "code" in frame:
            if not (isinstance(frame["code"], int) and isinstance(frame.get("stdout", ""), str)
                    and isinstance(frame.get("stderr", ""), str)):
                _warn(argv, f"the server on {path} answered something that is not a result")
                return None
            return frame
        timeout = SILENCE_TIMEOUT  # {"wait": n}: taken, queued or running


def forward(argv: list[str]) -> int | None:
    """Run ``argv`` in the STATE's server and return its exit code; None when there is none to run it (then
    the caller runs it here). A server that ends before answering is said on stderr and also gives None:
    every forwarded command is safe to run again (an update it applied is then a no-op)."""
    name, state = _command_and_state(argv)
    if (name not in COMMANDS or state is None or os.environ.get("GRAPHDIFF_NO_SERVE")
            or "--help" in argv or "_GRAPHDIFF_COMPLETE" in os.environ):
        return None
    path = socket_path(state)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return None
    why = untrusted(st)
    if why is not None:
        _warn(argv, f"not using {path}: {why}")
        return None
    try:
        req = request(argv)
    except OSError:  # the working directory is gone: the command says so itself
        return None
    if len(encode(req)) > MAX_REQUEST:  # a command line the server would refuse
        return None
    sock = connect(path)
    if sock is None:  # a stale socket (its server is gone): run here
        return None
    try:
        uid = peer_uid(sock)
        if uid is not None and uid != os.geteuid():
            _warn(argv, f"not using {path}: the process listening on it runs as uid {uid}, not as this user "
                        f"(uid {os.geteuid()})")
            return None
        try:
            send_message(sock, req)
            reply = _reply(sock, path, argv)
        except OSError:
            _warn(argv, f"the server on {path} did not take the request")
            return None
        except KeyboardInterrupt:  # the server's command goes on (as after a commit): say so, exit as ctrl-C does
            print("graphdiff: error: interrupted (the server goes on with the command: send the same call "
                  "again, a no-op if it had committed)", file=sys.stderr, flush=True)
            return 130
        if reply is None:
            return None
    finally:
        sock.close()
    sys.stdout.write(reply.get("stdout", ""))
    sys.stdout.flush()
    sys.stderr.write(reply.get("stderr", ""))
    sys.stderr.flush()
    return reply["code"]


def main() -> None:
    """The ``graphdiff`` console script."""
    argv = sys.argv[1:]
    if argv == ["--version"]:  # no import of the command line for it
        from .._version import __version__

        print(f"graphdiff {__version__}")
        return
    code = forward(argv)
    if code is not None:
        sys.exit(code)
    from .app import main as run_here

    run_here()
