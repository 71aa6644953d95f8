"""``graphdiff predict``: the current step's estimates per prompt -> a JSONL, CSV or Parquet table."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ...stages.handoff import PREDICT_COLUMNS
from ..common import command, emit, progress
from ..options import DEFAULT_GROUP_SIZE, GroupSizeOption, IdFieldOption, LiveFeaturesOption, StateOption


# The help lists the columns from the constant predict writes them by, so the two cannot drift.
@command("predict", help=f"Write {', '.join(PREDICT_COLUMNS)} for each prompt.")
def predict(
    state: StateOption,
    out: Path = typer.Option(..., "--out", "-o", help="Table to write (replaced atomically)."),
    ids: Optional[Path] = typer.Option(None, "--ids", help="Only these prompts: one id per line, or a "
                                       ".jsonl/.csv/.parquet table with an 'id' column (or --id-field; "
                                       "default: all)."),
    fmt: Optional[str] = typer.Option(None, "--format", help="jsonl, csv or parquet (default: from the "
                                      "extension of --out)."),
    group_size: GroupSizeOption = DEFAULT_GROUP_SIZE,
    id_field: IdFieldOption = "id",
    live_features: LiveFeaturesOption = None,
):
    from ...state import State

    with progress("predicting") as bar:
        res = State.open(state).predict(out, ids_file=ids, fmt=fmt, group_size=group_size, id_field=id_field,
                                        progress=bar, live=live_features)
    emit(res, f"step {res['step']}: {res['rows']} predictions (mean p {res['p_mean']:.3f}) -> {res['out']}")
