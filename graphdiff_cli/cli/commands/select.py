"""``graphdiff select``: choose B prompts of a candidate pool from the STATE's current estimates."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ...core.decisions import DEFAULT_SELECT_STRATEGY, SELECT_RULES
from ..common import command, emit, progress, warn
from ..options import (DEFAULT_GROUP_SIZE, GroupSizeOption, IdFieldOption, LiveFeaturesOption, StateOption,
                       complete_from, rules_help)

# the default's reason beside its help line
_STRATEGY_HELP = rules_help(SELECT_RULES, {DEFAULT_SELECT_STRATEGY: "the default: the highest effective-group rate "
                                                                    "on the real log, docs/lab/results.md"})


@command("select")
def select(
    state: StateOption,
    candidates: Path = typer.Option(..., "--candidates", help="Candidate pool: one id per line, or a "
                                    ".jsonl/.csv/.parquet table with an 'id' column (or --id-field)."),
    batch_size: int = typer.Option(..., "--batch-size", "-B", help="How many distinct prompts to choose."),
    strategy: str = typer.Option(DEFAULT_SELECT_STRATEGY, "--strategy", help=_STRATEGY_HELP,
                                 autocompletion=complete_from(lambda: SELECT_RULES)),
    out: Path = typer.Option(..., "--out", "-o", help="Chosen prompts, best first (.txt: one id per line; "
                             ".jsonl/.csv/.parquet: rank, id, p, variance, p_zero_variance, n_seen, key)."),
    seed: int = typer.Option(0, "--seed", help="Seed of every random choice (draws, drops, tie-breaks)."),
    target: float = typer.Option(0.5, "--target", help="Target success probability (target, thompson)."),
    explore: float = typer.Option(1.0, "--explore", help="target: pseudo-rollouts at --target added to each "
                                  "prompt's belief before ranking, so little-known prompts get tried (0: the "
                                  "bare estimate; default 1, Jeffreys' prior weight)."),
    group_size: GroupSizeOption = DEFAULT_GROUP_SIZE,
    fmt: Optional[str] = typer.Option(None, "--format", help="jsonl, csv or parquet (default: from the "
                                      "extension of --out)."),
    id_field: IdFieldOption = "id",
    live_features: LiveFeaturesOption = None,
):
    """Choose --batch-size prompts of --candidates by --strategy and write them to --out."""
    from ...state import State

    with progress("selecting") as bar:
        res = State.open(state).select(candidates, batch_size, strategy, out, seed=seed, target=target,
                                       explore=explore, group_size=group_size, fmt=fmt, id_field=id_field,
                                       progress=bar, live=live_features)
    for line in res["warnings"]:
        warn(line)
    emit(res, f"step {res['step']}: chose {res['batch_size']} of {res['pool']} by {strategy} "
              f"(predicted effective share {res['predicted_effective_share']['chosen']:.3f} vs "
              f"{res['predicted_effective_share']['pool']:.3f} for the pool) -> {res['out']}")
