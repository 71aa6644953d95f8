"""The README's Python example runs as written: a whole loop through ``State`` (init, select, update,
estimates, predict, extend, rollback, status) on real artifacts made with the bundled encoder."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from _handoff_fixtures import GRAPHDIFF
from conftest import PROMPT_ROWS, write_jsonl

README = Path(__file__).resolve().parents[1] / "README.md"


def _gd(*args) -> None:
    res = subprocess.run([str(GRAPHDIFF), *map(str, args)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def _example() -> str:
    text = README.read_text(encoding="utf-8")
    m = re.search(r"<!-- readme-state-example -->\s*```python\n(.*?)```\s*<!-- /readme-state-example -->", text, re.S)
    assert m, "README.md lost its State example (the readme-state-example markers)"
    return m.group(1)


@pytest.mark.slow
def test_readme_state_example_runs(tmp_path, monkeypatch, capsys):
    old, new = PROMPT_ROWS[:32], PROMPT_ROWS[32:]
    ids = {r["id"] for r in old}
    write_jsonl(tmp_path / "prompts.jsonl", [{**r, "id": f"p{i + 1:02d}"} for i, r in enumerate(old)])
    write_jsonl(tmp_path / "new_prompts.jsonl", [{**r, "id": f"n{i + 1:02d}"} for i, r in enumerate(new)])
    (tmp_path / "pool.txt").write_text("".join(f"p{i + 1:02d}\n" for i in range(len(ids))))
    _gd("embed", tmp_path / "prompts.jsonl", "--out", tmp_path / "emb.zarr", "-q")
    _gd("build-graph", tmp_path / "emb.zarr", "--k-nn", 5, "--out", tmp_path / "graph.zarr", "-q")
    _gd("cluster", tmp_path / "graph.zarr", "--out", tmp_path / "clusters.zarr", "--states", 4, "-q")
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    seen = []

    def train_step(batch):
        seen.append(list(batch))
        return [{"id": pid, "n": 8, "s": int(rng.integers(0, 9))} for pid in batch]

    exec(compile(_example(), str(README), "exec"), {"train_step": train_step})
    assert capsys.readouterr().out.strip() == "2"
    assert len(seen) == 3 and all(len(b) == 8 and len(set(b)) == 8 for b in seen)
    from graphdiff_cli import State

    st = State.open("runs/STATE")
    status = st.status()
    assert status["step"] == 2 and status["n_prompts"] == 32  # the extend after step 3 was rolled back too
    assert sorted(p.name[:13] for p in Path("runs/STATE.outcomes").iterdir()) == [f"step_{t:08d}" for t in (1, 2, 3)]
    assert st.verify()["intact"]
