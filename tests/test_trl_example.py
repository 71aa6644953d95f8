"""examples/trl/grpo_dynamic_sampling.py end to end, as a user runs it: a STATE built from its prompts with
the graphdiff CLI, then a few GRPO steps with graphdiff's dynamic sampling on a tiny CPU model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="trl is not installed (pip install 'graphdiff-rl[trl]')")
pytestmark = pytest.mark.slow  # ~50 s on 2 busy cores: four CLI calls (the encoder) and the trainer

from graphdiff_cli.io.state_dir import StateDir  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "trl" / "grpo_dynamic_sampling.py"


def test_example_trains_with_dynamic_sampling(tmp_path):
    steps = 4
    res = subprocess.run([sys.executable, str(EXAMPLE), "--out", str(tmp_path), "--steps", str(steps)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    # transformers' FutureWarnings came from gradient checkpointing under its deprecated name (gradient_checkpointing,
    # on by TRL's config default): the example's config says activation_checkpointing, and its output has none
    assert "FutureWarning" not in res.stderr + res.stdout, res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["steps"] == steps and summary["state_step"] == steps
    assert summary["groups_trained_with_signal"] + summary["groups_padded"] == 4 * steps
    assert summary["rollouts_generated"] == 4 * summary["groups_generated"]
    log = StateDir.open(tmp_path / "STATE").log_entries()
    assert [e["step"] for e in log] == list(range(steps + 1))
    assert sum(e["rollouts"] for e in log[1:]) == summary["rollouts_generated"]  # every generated group applied
