"""``graphdiff cluster``: graph artifact -> spectral clusters artifact (the K latent states)."""

from __future__ import annotations

from pathlib import Path

import typer

from ..common import command, emit, progress, warn


@command("cluster")
def cluster(
    graph: Path = typer.Argument(..., help="Graph artifact (from build-graph)."),
    out: Path = typer.Option(..., "--out", "-o", help="Clusters artifact to write."),
    states: str = typer.Option("auto", "--states", help="Number of latent states K, or 'auto' = "
                               "min(320, max(2, N // 25)) for N prompts. K > N is refused."),
    seed: int = typer.Option(0, "--seed", help="Seed of the k-means step."),
    eigen_solver: str = typer.Option("arpack", "--eigen-solver", help="arpack (the paper's) or lobpcg-amg (LOBPCG "
                                     "with an algebraic-multigrid preconditioner; the amg extra, else arpack). "
                                     "The eigen-residual is stamped either way."),
    kmeans: str = typer.Option("lloyd", "--kmeans", help="lloyd (numpy, k-means++ seeding, the paper's) or faiss "
                               "(faiss's Lloyd from the same seeding, float32)."),
):
    """Spectral clustering of W into K latent difficulty states (Section 3.4)."""
    from ...stages.prepare import cluster as run_cluster

    with progress("spectral clustering") as update:
        res = run_cluster(graph, out, states=states, seed=seed, eigen_solver=eigen_solver, kmeans=kmeans,
                          progress=update)
    for line in res["warnings"]:
        warn(line)
    sz, sp = res["sizes"], res["spectral"]
    emit(res, f"{res['n_prompts']} prompts in K = {res['states']} states (sizes {sz['min']}..{sz['max']}, "
              f"{sz['empty']} empty; {sp['eigen_solver']}, eigen-residual {sp['eigen_residual']:.1e}) "
              f"-> {res['out']}")
