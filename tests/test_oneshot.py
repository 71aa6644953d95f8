"""One-Shot-RLVR conversion: the README's replay protocol on a tiny fixture and its counts on the real data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from graphdiff_cli.errors import DataError
from graphdiff_cli.evaluation.oneshot import convert_oneshot, write_oneshot
from graphdiff_cli.io.tables import read_rows

ONESHOT = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "oneshot_rlvr"


def _fixture(tmp_path, visits, order, raw_override=None):
    d = tmp_path / "oneshot"
    d.mkdir()
    with open(d / "prompts.jsonl", "w") as f:
        for idx in visits:
            f.write(json.dumps({"index": idx, "problem": f"problem {idx}", "answer": "1"}) + "\n")
    with open(d / "acc_history.jsonl", "w") as f:
        for idx, ss in visits.items():
            for k, s in enumerate(ss):
                f.write(json.dumps({"index": idx, "visit": k, "n_rollouts": 8, "n_correct": s}) + "\n")
    raw = {str(idx): [s / 8 for s in visits[idx]] for idx in order}
    (d / "acc_step_500.raw.json").write_text(json.dumps(raw_override or raw))
    return d


def test_rounds_follow_the_protocol(tmp_path):
    visits = {0: [1, 2], 1: [0], 2: [8, 7, 6], 3: [4, 4]}
    d = _fixture(tmp_path, visits, order=[2, 0, 3, 1])
    conv = convert_oneshot(d, seed=0, batch_size=2)
    steps = {}
    for row in conv.log:
        steps.setdefault(row["step"], []).append((row["id"], row["visit"], row["s"]))
    # round 0 in first-draw order, batches of 2: [2, 0], [3, 1]; round 1: prompts with > 1 visit (3 of
    # them, shuffled): a batch of 2 and one of 1; round 2: prompt 2 alone
    assert steps[1] == [("2", 0, 8), ("0", 0, 1)]
    assert steps[2] == [("3", 0, 4), ("1", 0, 0)]
    r1 = steps[3] + steps[4]
    assert sorted(r1) == [("0", 1, 2), ("2", 1, 7), ("3", 1, 4)] and len(steps[3]) == 2
    assert steps[5] == [("2", 2, 6)]
    assert [p["id"] for p in conv.prompts] == ["2", "0", "3", "1"]
    assert conv.summary()["rows"] == 8 and conv.summary()["rounds"] == 3
    # seeded: the same seed gives the same log
    assert convert_oneshot(d, seed=0, batch_size=2).log == conv.log


def test_inconsistent_files_are_refused(tmp_path):
    d = _fixture(tmp_path, {0: [1, 2]}, order=[0], raw_override={"0": [0.125, 0.5]})
    with pytest.raises(DataError, match="disagree"):
        convert_oneshot(d)
    with pytest.raises(DataError, match="missing"):
        convert_oneshot(tmp_path / "nowhere")


def test_write_oneshot_writes_prompts_and_log(tmp_path):
    d = _fixture(tmp_path, {0: [1, 2], 1: [3]}, order=[1, 0])
    summary = write_oneshot(d, tmp_path / "p.jsonl", tmp_path / "log.csv", batch_size=1)
    assert summary["rows"] == 3
    prompts = [r for _, r in read_rows(tmp_path / "p.jsonl")]
    assert prompts == [{"id": "1", "prompt": "problem 1"}, {"id": "0", "prompt": "problem 0"}]
    log = [r for _, r in read_rows(tmp_path / "log.csv")]
    assert log[0] == {"step": "1", "id": "1", "n": "8", "s": "3"}


@pytest.mark.shared_data
@pytest.mark.skipif(not ONESHOT.is_dir(), reason="../shared/data/oneshot_rlvr is absent (real run not available)")
def test_real_oneshot_counts():
    conv = convert_oneshot(ONESHOT, seed=0)
    summ = conv.summary()
    assert summ["rows"] == 64_000
    assert summ["prompts"] == len({r["id"] for r in conv.log}) == 1_209
    assert summ["mean_first_visit"] == pytest.approx(0.335, abs=5e-4)
    assert summ["mean_last_visit"] == pytest.approx(0.490, abs=5e-4)
    with open(ONESHOT / "acc_step_500.raw.json") as f:
        first_keys = list(json.load(f))[:128]
    assert [r["id"] for r in conv.log[:128]] == first_keys  # step 1 = the recorded first batch
    steps = np.array([r["step"] for r in conv.log])
    assert (np.diff(steps) >= 0).all()
    for t in np.unique(steps)[::50]:
        ids = [r["id"] for r in conv.log if r["step"] == t]
        assert len(ids) == len(set(ids)) <= 128
