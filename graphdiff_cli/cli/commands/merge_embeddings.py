"""``graphdiff merge-embeddings``: shard artifacts -> one embeddings artifact."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer

from ..common import command, emit, progress


@command("merge-embeddings")
def merge_embeddings(
    shards: List[Path] = typer.Argument(..., help="Shard artifacts written by 'embed --shard I/N', all N of them."),
    out: Path = typer.Option(..., "--out", "-o", help="Embeddings artifact to write."),
):
    """Join embedding shards in index order (same prompts file, model, instruction and dim; each index once)."""
    from ...stages.prepare import merge_embeddings as merge

    with progress("merging shards") as update:
        res = merge(shards, out, progress=update)
    emit(res, f"merged {res['n_shards']} shards -> {res['out']} ({res['shape'][0]} x {res['shape'][1]})")
