"""``graphdiff check-encoder``: is an embedding model available offline? (The workflow asks at plan time.)"""

from __future__ import annotations

import typer

from ..common import command, emit


@command("check-encoder")
def check_encoder(
    model: str = typer.Option("bundled", "--model", help="'bundled', a local model folder, or a Hugging Face "
                              "name already in the local cache (graphdiff never downloads)."),
):
    """Say where an embedding model would be loaded from, without loading it; exit 1 with the fix if it is
    not on this machine."""
    from ...backends.embed import locate_encoder

    path = locate_encoder(model)
    emit({"command": "check-encoder", "model": model, "path": path}, f"{model}: {path}", report=True)
