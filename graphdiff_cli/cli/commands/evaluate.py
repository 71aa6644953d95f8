"""``graphdiff evaluate``: replay a training log through graphdiff and the peers' estimators; write a report."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ...evaluation.methods import covariate_keys, embedding_keys, methods_help
from ..common import command, emit, progress

# the registered methods (each registers itself: evaluation.registry), as --methods and --embeddings list them
_METHODS_HELP = methods_help()
_EMBEDDING_HELP = ", ".join(embedding_keys())
_COVARIATE_HELP = ", ".join(covariate_keys())


@command("evaluate")
def evaluate(
    log: Path = typer.Option(..., "--log", help="Training log (JSONL/CSV/Parquet) with rows step, id, n, s; "
                             "ids are the graph's prompt ids."),
    graph: Path = typer.Option(..., "--graph", help="Graph artifact (from build-graph)."),
    clusters: Path = typer.Option(..., "--clusters", help="Clusters artifact (from cluster)."),
    out: Path = typer.Option(..., "--out", "-o", help="Report folder to write (replaced atomically)."),
    embeddings: Optional[Path] = typer.Option(None, "--embeddings", help="Embeddings artifact; needed by the "
                                              f"embedding peers ({_EMBEDDING_HELP}), which are skipped without "
                                              "it unless named in --methods (then refused)."),
    covariates: Optional[Path] = typer.Option(None, "--covariates", help="Embeddings artifact holding the "
                                              "prompts' covariates (graphdiff embed with covariates); default: "
                                              "--embeddings, when it holds them. graphdiff reads them, and so do "
                                              f"the covariate peers ({_COVARIATE_HELP}), which are skipped without "
                                              "them unless named in --methods (then refused)."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML/JSON config shaped like the Snakemake "
                                          "config (that file works): section 'estimator' (graphdiff's settings, "
                                          "read as init --config reads it) and 'evaluate.settings' (baseline "
                                          "settings)."),
    methods: Optional[List[str]] = typer.Option(None, "--methods", help="Methods to compare, comma-separated "
                                                f"or repeated, or all (the default): {_METHODS_HELP}."),
    device: Optional[str] = typer.Option(None, "--device", help="graphdiff's device: auto, cpu, cuda "
                                         "(overrides the config)."),
    counterfactual: Optional[bool] = typer.Option(None, "--counterfactual/--no-counterfactual", help="Replay "
                                                  "prompt selection and rollout allocation driven by each "
                                                  "estimator (offline counterfactual: effective-group rates, "
                                                  "expected non-degenerate groups). Default: where the log "
                                                  "allows it; --counterfactual refuses a log that does not."),
    pool_factor: float = typer.Option(2.0, "--pool-factor", help="--counterfactual: candidate pool = this x the "
                                      "log's median batch size."),
    seed: int = typer.Option(0, "--seed", help="--counterfactual: seed of the pools and random strategies."),
    explore: Optional[float] = typer.Option(None, "--explore", help="--counterfactual: the target rule's "
                                            "exploration (select --explore; default select's); it is also "
                                            "run at 0 for comparison."),
):
    """Is graphdiff better than what you use now? Replays LOG step by step with no look-ahead."""
    from ...stages.evaluate import evaluate as run_evaluate

    with progress("replaying the log") as update:
        res = run_evaluate(log, graph, clusters, out, embeddings=embeddings, config=config, methods=methods,
                           device=device, counterfactual=counterfactual, pool_factor=pool_factor, seed=seed,
                           explore=explore, covariates=covariates, progress=update)
    lines = [f"{res['rows']:,} rows over {res['steps']:,} steps, {len(res['methods'])} methods -> {res['out']}"]
    for name, m in res["summary"].items():
        mae = "–" if m["mae"] is None else f"{m['mae']:.3f}"
        wr = "–" if m["within_r"] is None else f"{m['within_r']:.3f}"
        ms = "–" if m["seconds_per_step"] is None else f"{1000 * m['seconds_per_step']:.1f}"
        tag = " (oracle)" if name in res["oracles"] else ""
        lines.append(f"  {name}{tag}: MAE {mae}, within-batch r {wr}, {ms} ms/step")
    emit(res, "\n".join(lines))
