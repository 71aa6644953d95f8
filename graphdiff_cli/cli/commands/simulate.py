"""``graphdiff simulate``: write a synthetic RLVR trajectory (prompts + outcome log) with a known truth."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..common import command, emit


@command("simulate")
def simulate(
    out_prompts: Path = typer.Option(..., "--out-prompts", help="Prompts file to write (id, prompt, topic, level)."),
    out_log: Path = typer.Option(..., "--out-log", help="Log to write (step, id, n, s, p_true)."),
    prompts: Optional[int] = typer.Option(None, "--prompts", help="Number of prompts (default 2000; with --math "
                                          "all rows, or a seeded subset of this many)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Training steps (default 100; with --math "
                                        "--epochs full passes)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Prompts per step (default 128; "
                                             "256 with --math)."),
    rollouts: int = typer.Option(8, "--rollouts", help="Rollouts per prompt and step."),
    seed: int = typer.Option(0, "--seed", help="Seed: fixes prompts, difficulties, batches and outcomes."),
    math: Optional[Path] = typer.Option(None, "--math", help="MATH rows (unique_id, problem, subject, level): "
                                        "difficulty follows the real subject and level."),
    epochs: int = typer.Option(3, "--epochs", help="With --math and no --steps: passes over the prompts."),
    shift: list[str] = typer.Option([], "--shift", help="STEP:TOPIC:DELTA: from STEP on, the policy's ability on "
                                    "TOPIC moves by DELTA logits (+ a jump, - a decay); repeatable."),
    rates: Optional[Path] = typer.Option(None, "--rates", help="Real starting rates: rows id, n, s (e.g. DeepScaleR's "
                                         "problems.jsonl); --epochs passes of --batch-size (256) prompts, each "
                                         "prompt's logit drifting by its skill's speed (evaluation/rate_drift.py)."),
    skill_groups: Optional[Path] = typer.Option(None, "--skill-groups", help="With --rates: a clusters artifact "
                                                "whose labels are the skill groups sharing a drift speed "
                                                "(default: none shared)."),
    drift_mean: Optional[float] = typer.Option(None, "--drift-mean", help="With --rates: the mean prompt's logit "
                                               "gain over the run (default 1.0)."),
    drift_skill_sd: Optional[float] = typer.Option(None, "--drift-skill-sd", help="With --rates: sd of the skill "
                                                   "groups' gains (default 0.75)."),
    drift_item_sd: Optional[float] = typer.Option(None, "--drift-item-sd", help="With --rates: sd of prompts' gains "
                                                  "inside a group (default 0.5)."),
):
    """Simulate a policy that improves unevenly across topics (or, with --rates, from real starting rates);
    outcomes are Binomial(n, p_true)."""
    from ...stages.simulate import simulate as run_simulate

    res = run_simulate(out_prompts, out_log, prompts=prompts, steps=steps, batch_size=batch_size,
                       rollouts=rollouts, seed=seed, math=math, epochs=epochs,
                       shifts=shift, rates=rates, skill_groups=skill_groups, drift_mean=drift_mean,
                       drift_skill_sd=drift_skill_sd, drift_item_sd=drift_item_sd)
    mr = res["mean_rate"]
    last = "–" if mr["last_third"] is None else f"{mr['last_third']:.3f}"
    emit(res, f"{res['prompts']:,} prompts, {res['steps']} steps, {res['rows']:,} rows (mean success "
              f"{mr['first_third']:.3f} in the first third of steps, {last} after) -> {res['out_prompts']}, "
              f"{res['out_log']}")
