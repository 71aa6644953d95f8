"""The ``graphdiff`` command: global options and command registration (one module per command)."""

from __future__ import annotations

import typer

from .._version import __version__
from .common import JSON_OPTION, OUT, QUIET_OPTION, VERBOSE_OPTION, app, run


def _flags_without_type() -> None:
    """Boolean flags (``--json``, ``--once``, ``--help``) take no value, but typer's help shows them as
    ``--json <bool>``, which reads as if ``--json true`` were expected (it is refused). Their type column is
    left empty; every other option keeps its ``<int>``, ``<path>``, ..."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None:  # a typer without the type column: nothing to hide
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich


_flags_without_type()


def _version(value: bool):
    if value:
        typer.echo(f"graphdiff {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    json_out: bool = JSON_OPTION,
    quiet: bool = QUIET_OPTION,
    verbose: bool = VERBOSE_OPTION,
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
):
    OUT.json, OUT.quiet, OUT.verbose = json_out, quiet, verbose


def _register() -> None:
    """Each command module adds itself to ``app``; import errors here are bugs, not user errors."""
    import importlib
    import pkgutil

    from . import commands

    for mod in pkgutil.iter_modules(commands.__path__):
        importlib.import_module(f"{commands.__name__}.{mod.name}")


_register()


def _help_width() -> None:
    """Help that is piped or captured (not a terminal) is laid out 100 columns wide, not rich's 80: at 80 the
    option column of `evaluate --help` cut names and words ("--no-counterfact…"). A terminal keeps its own
    width; TERMINAL_WIDTH overrides both (typer reads it)."""
    import os
    import sys

    from typer import rich_utils

    if not os.environ.get("TERMINAL_WIDTH") and not sys.stdout.isatty():
        rich_utils.MAX_WIDTH = 100


_help_width()


def _release_freed_memory() -> None:
    """Have glibc hand large freed buffers back to the OS at once (fixed 1 MiB mmap threshold).

    By default glibc raises its mmap threshold after the first large free, so later chunk-sized
    buffers (decoded Zarr chunks, per-step temporaries) come from the heap and stay resident after
    they are freed: about 110 MB of a 150k-prompt `update`'s peak. Only the command-line process
    does this; importing graphdiff as a library leaves the host's allocator alone. A no-op off glibc.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD (also stops its dynamic adjustment)
    except (OSError, AttributeError):
        pass


def _sigterm_interrupts() -> None:
    """SIGTERM (a scheduler's kill, ``timeout``) ends a command as ctrl-C does: through the error boundary, so
    it exits 130 with kind "interrupted" and a write in progress is undone by its transaction (watch installs
    its own handler: it finishes the step in progress first)."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def main() -> None:
    """The console script after ``client.main`` found no ``graphdiff serve`` to forward to."""
    import sys

    _release_freed_memory()
    _sigterm_interrupts()
    sys.exit(run(sys.argv[1:]))
