"""``graphdiff verify``: is a STATE directory (or an artifact) intact? One line per problem (exit 1 if any) and per
notice (what a killed writer left); exit 6 for a path graphdiff did not write."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ...errors import InvalidArgumentError
from ..common import EXIT_ERROR, command, emit


@command("verify")
def verify(
    path: Optional[Path] = typer.Argument(None, help="A STATE directory, or any graphdiff artifact (*.zarr)."),
    state: Optional[Path] = typer.Option(None, "--state", envvar="GRAPHDIFF_STATE",
                                         help="The STATE directory, as the other commands take it (PATH, when given, wins)."),
):
    """Check a STATE's whole lineage (CURRENT, model, log, every retained step, every array against its
    checksums) or an artifact, and list what killed writers left as notices; exit 0 when intact, 1 when damaged,
    6 when PATH is nothing graphdiff wrote."""
    from ...stages.verify import verify as run_verify

    if path is None and state is None:
        raise InvalidArgumentError("give the STATE directory or artifact to check: graphdiff verify PATH (or --state)")
    res = run_verify(path if path is not None else state)
    lines = [f"{res['kind']} {res['path']}: " + ("intact" if res["intact"] else f"{len(res['problems'])} problem(s)")
             + f" ({len(res['checked'])} part(s) checked)"]
    lines += [f"problem: {p}" for p in res["problems"]] + [f"notice: {n}" for n in res["notices"]]
    emit(res, "\n".join(lines), report=True)
    if not res["intact"]:
        raise typer.Exit(EXIT_ERROR)
