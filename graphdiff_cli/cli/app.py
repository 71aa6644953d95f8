"""The ``graphdiff`` command: global options and command registration (one module per command)."""

from __future__ import annotations

import typer

from .. import __version__
from .common import OUT

app = typer.Typer(
    name="graphdiff",
    help="Online graph-based estimates of each RL prompt's success probability under the current policy.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool):
    if value:
        typer.echo(f"graphdiff {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    json_out: bool = typer.Option(False, "--json", help="Print exactly one JSON object with the result on stdout."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="Print nothing on stderr but errors."),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="Print more detail on stderr."),
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


def main() -> None:
    app()
