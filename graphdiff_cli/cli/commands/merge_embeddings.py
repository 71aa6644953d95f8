"""``graphdiff merge-embeddings``: shard artifacts -> one embeddings artifact."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer

from ..app import app
from ..common import JSON_OPTION, QUIET_OPTION, VERBOSE_OPTION, configure, emit, progress, run_guarded


@app.command("merge-embeddings")
def merge_embeddings(
    shards: List[Path] = typer.Argument(..., help="Shard artifacts written by 'embed --shard I/N', all N of them."),
    out: Path = typer.Option(..., "--out", "-o", help="Embeddings artifact to write."),
    json_out: bool = JSON_OPTION,
    quiet: bool = QUIET_OPTION,
    verbose: bool = VERBOSE_OPTION,
):
    """Join embedding shards in index order (same prompts file, model, instruction and dim; each index once)."""
    configure(json_out, quiet, verbose)

    def body():
        from ...stages.prepare import merge_embeddings as merge

        with progress("merging shards") as update:
            res = merge(shards, out, progress=update)
        emit(res, f"merged {res['n_shards']} shards -> {res['out']} ({res['shape'][0]} x {res['shape'][1]})")

    run_guarded(body)
