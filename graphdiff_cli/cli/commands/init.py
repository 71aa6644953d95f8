"""``graphdiff init``: graph + clusters artifacts -> a new STATE directory at step 0."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..common import command, emit, progress
from ..options import KeepEveryOption, KeepOption, SnapshotEveryOption
from ..settings_options import with_settings


@command("init")
@with_settings
def init(
    graph: Path = typer.Option(..., "--graph", help="Graph artifact (from build-graph)."),
    clusters: Path = typer.Option(..., "--clusters", help="Clusters artifact made from that graph (from cluster)."),
    out: Path = typer.Option(..., "--out", "-o", help="STATE directory to create (must not exist or be empty)."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML/JSON config whose 'estimator' section "
                                          "(a preset and the settings below) is read: a Snakemake config file, "
                                          "evaluate's config, or a file of only that section's keys; flags "
                                          "override it."),
    embeddings: Optional[Path] = typer.Option(None, "--embeddings", help="The embeddings artifact the graph was "
                                              "built from, for graphdiff extend and the read-out of the "
                                              "embedding, which the STATE then keeps (default: where build-graph "
                                              "read them; checked by content hash)."),
    no_covariates: bool = typer.Option(False, "--no-covariates", help="Leave out the prompts' covariates that "
                                       "graphdiff embed wrote into the embeddings artifact (by default the STATE "
                                       "keeps them and the estimate reads them: setting covariate_readout)."),
    keep: KeepOption = None,
    keep_every: KeepEveryOption = None,
    snapshot_every: SnapshotEveryOption = None,
    settings_flags: dict = None,
):
    """Create the STATE directory a trainer updates once per step (step 0: prior only, no outcomes).

    Every estimator setting (`graphdiff settings` lists them) is a flag; one that cannot act under the chosen schedule or mixing is refused.
    """
    from ...state import State

    with progress("creating the state") as update:
        res = State.init(graph, clusters, out, config=config, embeddings=embeddings, progress=update, keep=keep,
                         keep_every=keep_every, snapshot_every=snapshot_every, covariates=not no_covariates,
                         **settings_flags).created
    emit(res, f"STATE {res['state']} at step 0: {res['n_prompts']} prompts, K = {res['states']} states, "
              f"{res['edges']} edges (keeps the last {res['keep']} states"
              + (f" and every {res['keep_every']}th)" if res["keep_every"] else ")") + "; " + _readout_line(res["readout"]) + "; " + _covariates_line(res["covariates"]))


def _readout_line(readout: dict) -> str:
    if readout["on"]:
        return f"read-out of the embedding on ({readout['dim']}-d, {readout['bytes'] / 2**20:.0f} MB kept in the STATE)"
    return f"read-out of the embedding off: {readout['why']}"


def _covariates_line(cov: dict) -> str:
    if cov["on"]:
        ref = f", starting from the reference rate {cov['reference']}" if cov["reference"] else ""
        return f"read-out of the covariates on ({cov['width']} features{ref})"
    return f"covariates off: {cov['why']}"
