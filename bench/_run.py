"""Read a workflow run folder (artifacts/<run>/ with graph/*.zarr, clusters/*.zarr, data/log.jsonl, one of
each), as the replay benches do."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _one(run: Path, pattern: str) -> Path:
    found = sorted(Path(run).glob(pattern))
    if len(found) != 1:
        raise SystemExit(f"{run}: expected one {pattern}, found {len(found)}")
    return found[0]


def run_inputs(run: Path):
    """The run's graph and clusters (``io.readers.read_inputs``)."""
    from graphdiff_cli.io.readers import read_inputs

    return read_inputs(_one(run, "graph/*.zarr"), _one(run, "clusters/*.zarr"))


def run_log(run: Path, inputs):
    """The run's log, prompt ids mapped to the graph's node indices (``io.readers.read_log``)."""
    from graphdiff_cli.io.readers import read_log

    return read_log(_one(run, "data/log.jsonl"), inputs.graph.index)
