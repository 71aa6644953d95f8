"""``graphdiff settings``: every estimator setting, its meaning and its value in each preset."""

from __future__ import annotations

import json

import typer

from ..common import command, emit


@command("settings")
def settings(
    schema: bool = typer.Option(False, "--schema", help="Print the JSON schema of the estimator settings (the "
                                "workflow config's 'estimator' section) instead of the table."),
):
    """List the estimator settings that init, evaluate and the workflow config accept, with both presets."""
    from ...settings import PRESETS, describe, json_schema, show_value

    if schema:
        typer.echo(json.dumps(json_schema(), indent=2))
        return
    rows = describe()
    from rich.console import Console
    from rich.table import Table

    from ..common import OUT

    emit({"settings": rows, "presets": list(PRESETS)})
    if OUT.json:
        return
    table = Table(show_lines=False, pad_edge=False)
    table.add_column("setting (flag)")
    for name in PRESETS:
        table.add_column(name)
    table.add_column("meaning", overflow="fold")
    for r in rows:
        table.add_row(f"--{r['name'].replace('_', '-')}", *(show_value(r[p]) for p in PRESETS), r["description"])
    Console(highlight=False).print(table)
