"""``graphdiff allocate``: split a total rollout budget over prompts from the STATE's current estimates."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..common import command, emit, progress, warn
from ...core.decisions import ALLOCATE_RULES
from ..options import IdFieldOption, LiveFeaturesOption, StateOption, complete_from, rules_help


@command("allocate")
def allocate(
    state: StateOption,
    ids: Path = typer.Option(..., "--ids", help="The batch's prompts: one id per line, or a "
                             ".jsonl/.csv/.parquet table with an 'id' column (or --id-field)."),
    budget: int = typer.Option(..., "--budget", help="Total rollouts to split over the prompts."),
    strategy: str = typer.Option(..., "--strategy", help=rules_help(ALLOCATE_RULES),
                                 autocompletion=complete_from(lambda: ALLOCATE_RULES)),
    out: Path = typer.Option(..., "--out", "-o", help="Table of id, n, p, p_nondegenerate "
                             "(.jsonl/.csv/.parquet)."),
    min_count: int = typer.Option(2, "--min", help="Fewest rollouts per prompt."),
    max_count: int = typer.Option(32, "--max", help="Most rollouts per prompt."),
    vip_gamma: float = typer.Option(0.0, "--vip-gamma", help="vip only: weight of VIP's code's log(p) tilt "
                                    "(0 = the paper's variance objective; VIP's code uses 0.0007)."),
    fmt: Optional[str] = typer.Option(None, "--format", help="jsonl, csv or parquet (default: from the "
                                      "extension of --out)."),
    id_field: IdFieldOption = "id",
    live_features: LiveFeaturesOption = None,
):
    """Write per-prompt rollout counts that sum to --budget, each within [--min, --max]."""
    from ...state import State

    with progress("allocating") as bar:
        res = State.open(state).allocate(ids, budget, strategy, out, min_count=min_count, max_count=max_count,
                                         vip_gamma=vip_gamma, fmt=fmt, id_field=id_field, progress=bar,
                                         live=live_features)
    expected = res["expected_signal_groups"]
    for line in res["warnings"]:
        warn(line)
    emit(res, f"step {res['step']}: {res['budget']} rollouts over {res['prompts']} prompts by {strategy} "
              f"(n {res['counts']['min']}..{res['counts']['max']}; expected groups with signal "
              f"{expected['allocation']:.2f} vs {expected['uniform']:.2f} uniform) -> {res['out']}")
