"""``graphdiff cluster``: graph artifact -> spectral clusters artifact (the K latent states)."""

from __future__ import annotations

from pathlib import Path

import typer

from ..app import app
from ..common import JSON_OPTION, QUIET_OPTION, VERBOSE_OPTION, configure, emit, progress, run_guarded


@app.command("cluster")
def cluster(
    graph: Path = typer.Argument(..., help="Graph artifact (from build-graph)."),
    out: Path = typer.Option(..., "--out", "-o", help="Clusters artifact to write."),
    states: str = typer.Option("auto", "--states", help="Number of latent states K, or 'auto' = "
                               "min(320, max(2, N // 25)) for N prompts. K > N is refused."),
    seed: int = typer.Option(0, "--seed", help="Seed of the k-means step."),
    json_out: bool = JSON_OPTION,
    quiet: bool = QUIET_OPTION,
    verbose: bool = VERBOSE_OPTION,
):
    """Spectral clustering of W into K latent difficulty states (Section 3.4)."""
    configure(json_out, quiet, verbose)

    def body():
        from ...stages.prepare import cluster as run_cluster

        with progress("spectral clustering") as update:
            res = run_cluster(graph, out, states=states, seed=seed, progress=update)
        sz = res["sizes"]
        emit(res, f"{res['n_prompts']} prompts in K = {res['states']} states (sizes {sz['min']}..{sz['max']}, "
                  f"{sz['empty']} empty) -> {res['out']}")

    run_guarded(body)
