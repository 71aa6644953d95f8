"""``graphdiff predict``: the current step's estimates per prompt -> a JSONL, CSV or Parquet table."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ...stages.handoff import PREDICT_COLUMNS
from ..common import command, emit, progress


# The help lists the columns from the constant predict writes them by, so the two cannot drift.
@command("predict", help=f"Write {', '.join(PREDICT_COLUMNS)} for each prompt.")
def predict(
    state: Path = typer.Option(..., "--state", help="STATE directory (from init)."),
    out: Path = typer.Option(..., "--out", "-o", help="Table to write (replaced atomically)."),
    ids: Optional[Path] = typer.Option(None, "--ids", help="Only these prompts: one id per line, or a "
                                       ".jsonl/.csv/.parquet table with an 'id' column (default: all)."),
    fmt: Optional[str] = typer.Option(None, "--format", help="jsonl, csv or parquet (default: from the "
                                      "extension of --out)."),
    group_size: int = typer.Option(8, "--group-size", help="Rollouts per group, for p_zero_variance "
                                   "= P(all correct or all wrong)."),
):
    from ...stages.handoff import predict as run_predict

    with progress("predicting") as bar:
        res = run_predict(state, out, ids_file=ids, fmt=fmt, group_size=group_size, progress=bar)
    emit(res, f"step {res['step']}: {res['rows']} predictions (mean p {res['p_mean']:.3f}) -> {res['out']}")
