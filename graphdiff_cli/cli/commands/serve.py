"""``graphdiff serve``: one process that stays up for a shell or cron loop's per-step calls."""

from __future__ import annotations

import typer

from ..common import command, emit, info
from ..options import StateOption


@command("serve")
def serve(
    state: StateOption,
    idle_exit: float = typer.Option(0.0, "--idle-exit", help="Stop after this many seconds without a request "
                                    "(0: run until SIGTERM or ctrl-C)."),
):
    """Keep the STATE in memory and run `update`, `predict`, `select`, `allocate` and `status` for it: each
    such `graphdiff` call on this STATE is sent over the socket STATE.sock and answered here, with the same
    output and exit code, without its own start-up. Without a server they run in their own process."""
    from ..server import serve as run_server

    res = run_server(state, idle_exit=idle_exit,
                     on_ready=lambda path: info(f"serving STATE {state} on {path} (pid {__import__('os').getpid()}); "
                                                "SIGTERM or ctrl-C stops"))
    emit(res, f"served {res['requests']} requests ({res['seconds']:.1f} s of commands); {res['socket']} removed")
