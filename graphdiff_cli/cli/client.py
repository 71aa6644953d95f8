"""The console script's first step, standard library only: hand a per-step command to a running
``graphdiff serve``, else run it here.

A shell or cron loop that calls ``graphdiff update`` / ``predict`` / ``select`` / ``allocate`` / ``status``
every step pays Python's imports and the STATE's read on each call. ``graphdiff serve --state S`` keeps them
in one process listening on the Unix socket ``S.sock`` beside the STATE; this module, which imports nothing
of graphdiff's but its version, sends such a command line there (with the working directory and the
``GRAPHDIFF_*`` environment) and prints the reply's stdout, stderr and exit code exactly as the command
run here would. No server (or a stale socket): the command runs in this process, as always.
"""

from __future__ import annotations

import os
import stat
import sys

from .wire import connect, forwarded, recv_message, send_message, socket_path

FORWARDED = frozenset({"update", "predict", "select", "allocate", "status"})
GLOBAL_FLAGS = frozenset({"--json", "-q", "--quiet", "-v", "--verbose"})


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
    return {"argv": list(argv), "cwd": os.getcwd(), "env": {k: v for k, v in os.environ.items() if forwarded(k)}}


def forward(argv: list[str]) -> int | None:
    """Run ``argv`` in the STATE's server and return its exit code; None when there is none to run it (then
    the caller runs it here). A server that ends before answering is said on stderr and also gives None:
    every forwarded command is safe to run again (an update it applied is then a no-op)."""
    name, state = _command_and_state(argv)
    if (name not in FORWARDED or state is None or os.environ.get("GRAPHDIFF_NO_SERVE")
            or "--help" in argv or "_GRAPHDIFF_COMPLETE" in os.environ):
        return None
    path = socket_path(state)
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            return None
    except OSError:
        return None
    sock = connect(path)
    if sock is None:  # a stale socket (its server is gone): run here
        return None
    try:
        try:
            send_message(sock, request(argv))
            reply = recv_message(sock)
        except (OSError, ValueError):
            reply = None
        except KeyboardInterrupt:  # the server's command goes on (as after a commit): say so, exit as ctrl-C does
            print("graphdiff: error: interrupted (the server goes on with the command: send the same call "
                  "again, a no-op if it had committed)", file=sys.stderr, flush=True)
            return 130
        if reply is None:
            print(f"graphdiff: warning: the server on {path} ended before answering; running the command here "
                  "(a step it had applied is now a no-op)", file=sys.stderr, flush=True)
            return None
    finally:
        sock.close()
    sys.stdout.write(reply.get("stdout", ""))
    sys.stdout.flush()
    sys.stderr.write(reply.get("stderr", ""))
    sys.stderr.flush()
    return int(reply.get("code", 1))


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
