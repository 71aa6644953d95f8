"""docs/tutorial.md runs as written: every ```bash block, in order, in one empty folder, with the repository's
.venv first on PATH (its ``graphdiff`` and ``python``), each block exiting 0; then the STATE it built exists,
is at the step the tutorial reaches, answers a read, and behaves as the tutorial says (a re-sent step is a
no-op, a gap is refused with the STATE unchanged)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from _handoff_fixtures import GRAPHDIFF
from graphdiff_cli import State

TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorial.md"
STEPS = 3        # the tutorial's loop: for T in 1 2 3
PROMPTS = 120    # the prompts its parquet holds


def _blocks() -> list[str]:
    blocks = re.findall(r"^```bash\n(.*?)^```", TUTORIAL.read_text(encoding="utf-8"), re.S | re.M)
    assert len(blocks) >= 5, "docs/tutorial.md lost its bash blocks"
    return blocks


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{GRAPHDIFF.parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("GRAPHDIFF_STATE", None)
    return env


@pytest.mark.slow
def test_tutorial_runs_as_written(tmp_path):
    for i, block in enumerate(_blocks()):
        res = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=_env(),
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, f"tutorial block {i + 1} failed:\n{block}\n--- stderr:\n{res.stderr[-3000:]}"

    state = tmp_path / "runs" / "STATE"
    st = State.open(state)
    assert st.status()["step"] == STEPS
    e = st.estimates()
    assert len(e["id"]) == PROMPTS
    assert ((e["p"] >= 0.0) & (e["p"] <= 1.0)).all()
    assert (e["n_seen"] > 0).any(), "no prompt was rolled out in the tutorial's steps"
    assert len((tmp_path / "predictions.jsonl").read_text().splitlines()) == PROMPTS

    # "Run the last update again: it is a no-op that says so."
    rows = [json.loads(line) for line in (tmp_path / f"outcomes_{STEPS}.jsonl").read_text().splitlines()]
    assert st.update(STEPS, rows).get("noop") is True
    # "Send step 5 now and it is refused as a gap (exit code 4), with the STATE unchanged."
    gap = subprocess.run([str(GRAPHDIFF), "update", "--state", str(state), "--step", str(STEPS + 2),
                          "--outcomes", f"outcomes_{STEPS}.jsonl"], cwd=tmp_path, env=_env(),
                         capture_output=True, text=True)
    assert gap.returncode == 4, gap.stderr
    assert State.open(state).status()["step"] == STEPS
