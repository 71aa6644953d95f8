"""``graphdiff init``: graph + clusters artifacts -> a new STATE directory at step 0."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..app import app
from ..common import JSON_OPTION, QUIET_OPTION, VERBOSE_OPTION, configure, emit, progress, run_guarded


@app.command("init")
def init(
    graph: Path = typer.Option(..., "--graph", help="Graph artifact (from build-graph)."),
    clusters: Path = typer.Option(..., "--clusters", help="Clusters artifact made from that graph (from cluster)."),
    out: Path = typer.Option(..., "--out", "-o", help="STATE directory to create (must not exist or be empty)."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML file of these settings (and 'preset'); "
                                          "flags override it."),
    preset: Optional[str] = typer.Option(None, "--preset", help="default (the paper's model with the measured "
                                         "improvements of docs/results.md) or paper (Sections 3.4-3.6 exactly); "
                                         "the options below override it (default: default)."),
    beta: Optional[float] = typer.Option(None, "--beta", help="Potts coupling strength beta (both presets: 2.0)."),
    epsilon: Optional[float] = typer.Option(None, "--epsilon", help="Smoothing of the spectral prior A "
                                            "(both presets: 0.1)."),
    gamma: Optional[float] = typer.Option(None, "--gamma", help="Weight of the graph's estimate under --mixing "
                                          "gamma (Section 3.6) (both presets: 0.5)."),
    window: Optional[int] = typer.Option(None, "--window", help="Forget outcomes older than L steps "
                                         "(Appendix G) (both presets: cumulative)."),
    schedule: Optional[str] = typer.Option(None, "--schedule", help="residual, synchronous or sequential "
                                           "mean-field updates (default: residual; paper: synchronous)."),
    device: Optional[str] = typer.Option(None, "--device", help="auto (GPU where one works), cpu or cuda "
                                         "(default: auto)."),
    max_iters: Optional[int] = typer.Option(None, "--max-iters", help="Most mean-field rounds per step "
                                            "(default: 50)."),
    tol: Optional[float] = typer.Option(None, "--tol", help="Stop when a round raises the ELBO by less than "
                                        "this per prompt (default: 1e-6)."),
    mixing: Optional[str] = typer.Option(None, "--mixing", help="How p combines the graph's estimate with "
                                         "a prompt's own outcomes: evidence (empirical Bayes), offset, or gamma "
                                         "(the paper's fixed mix) (default: evidence; paper: gamma)."),
    prior_strength: Optional[str] = typer.Option(None, "--prior-strength", help="kappa: weight of the "
                                                 "graph's estimate, in rollouts, under --mixing evidence or "
                                                 "offset, or auto (chosen online by prequential error) "
                                                 "(default: auto)."),
    belief_strength: Optional[str] = typer.Option(None, "--belief-strength", help="nu: weight of the graph's "
                                                  "estimate, in rollouts, in the belief that select and "
                                                  "p_zero_variance use, or auto (chosen online by the "
                                                  "likelihood of whole groups) (default: auto; paper: "
                                                  "Appendix E's belief)."),
    prompt_forgetting: Optional[float] = typer.Option(None, "--prompt-forgetting", help="lambda: a prompt's "
                                                      "own counts decay by this at each of its visits "
                                                      "(default: 0.85; paper: 1)."),
    state_forgetting: Optional[float] = typer.Option(None, "--state-forgetting", help="rho: state-level "
                                                     "evidence decays by this every step (both presets: 1 = "
                                                     "cumulative)."),
    state_prior: Optional[str] = typer.Option(None, "--state-prior", help="Beta prior of each state: "
                                              "observed (mean = recent global success rate) or uniform "
                                              "(default: observed; paper: uniform)."),
    neighbor_smoothing: Optional[float] = typer.Option(None, "--neighbor-smoothing", help="tau, in rollouts: "
                                                       "add the mutual neighbours' offsets from their model "
                                                       "predictions to the graph's estimate (default: 4; "
                                                       "paper: off)."),
    keep: Optional[int] = typer.Option(None, "--keep", help="States kept besides step 0 (older ones are "
                                       "pruned after each update) (default: 5)."),
    json_out: bool = JSON_OPTION,
    quiet: bool = QUIET_OPTION,
    verbose: bool = VERBOSE_OPTION,
):
    """Create the STATE directory a trainer updates once per step (step 0: prior only, no outcomes)."""
    configure(json_out, quiet, verbose)

    def body():
        from ...stages.handoff import init_state

        with progress("creating the state") as update:
            res = init_state(graph, clusters, out, config=config, progress=update, beta=beta, epsilon=epsilon,
                             gamma=gamma, window=window, schedule=schedule, device=device, max_iters=max_iters,
                             tol=tol, keep=keep, mixing=mixing, prior_strength=prior_strength,
                             belief_strength=belief_strength, prompt_forgetting=prompt_forgetting, state_forgetting=state_forgetting,
                             state_prior=state_prior, neighbor_smoothing=neighbor_smoothing, preset=preset)
        emit(res, f"STATE {res['state']} at step 0: {res['n_prompts']} prompts, K = {res['states']} states, "
                  f"{res['edges']} edges (keeps the last {res['keep']} states)")

    run_guarded(body)
