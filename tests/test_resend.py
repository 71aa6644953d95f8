"""A re-sent step is recognised by what it says, not by its bytes: the set of (id, n, s) rows and the threshold.

A trainer that crashes after graphdiff committed a step sends that step again, often re-serialised (rows in
another order, keys in another order, CSV instead of JSONL, one row per rollout, or rows through the Python
API where the CLI had a file): each is the no-op. Outcomes that are another applied step's are refused naming
that step. Rows given to ``State.update`` are kept only for applied steps, and only while the step is retained.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from _handoff_fixtures import GRAPHDIFF, make_inputs, step_rows, tree_hash, write_outcomes
from graphdiff_cli import State
from graphdiff_cli.errors import AlreadyAppliedError, DataError, StepGapError


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("resend-inputs"))


@pytest.fixture
def st(tmp_path, inputs):
    graph, clusters, _ = inputs
    return State.init(graph, clusters, tmp_path / "S", device="cpu", keep=3, keep_every=1000, durable=False)


def _applied(st, tmp_path, ids, upto):
    files = {}
    for t in range(1, upto + 1):
        files[t] = write_outcomes(tmp_path / f"o{t}.jsonl", step_rows(ids, t))
        st.update(t, files[t])
    return files


def test_the_last_step_reordered_is_a_no_op(st, tmp_path, inputs):
    ids = inputs[2]
    _applied(st, tmp_path, ids, 3)
    rows = step_rows(ids, 3)
    before = tree_hash(st.path)
    variants = {
        "rows reversed": write_outcomes(tmp_path / "rev.jsonl", rows[::-1]),
        "keys reordered": tmp_path / "keys.jsonl",
        "as CSV": write_outcomes(tmp_path / "o3.csv", rows),
        "one row per rollout": tmp_path / "rollouts.jsonl",
    }
    variants["keys reordered"].write_text("".join(json.dumps({"s": r["s"], "n": r["n"], "id": r["id"]}) + "\n"
                                                  for r in rows))
    variants["one row per rollout"].write_text("".join(
        json.dumps({"id": r["id"], "reward": int(j < r["s"])}) + "\n" for r in rows for j in range(r["n"])))
    for what, path in variants.items():
        res = st.update(3, path)
        assert res.get("noop") and res["step"] == 3, what
    assert tree_hash(st.path) == before


def test_a_cli_step_resent_as_rows_is_a_no_op_and_the_reverse(st, tmp_path, inputs):
    ids = inputs[2]
    _applied(st, tmp_path, ids, 2)
    assert st.update(2, step_rows(ids, 2)[::-1])["noop"]
    assert not st.outcomes_dir.exists() or not any(st.outcomes_dir.iterdir())  # nothing kept for a step applied
    res = st.update(3, step_rows(ids, 3))  # rows through the API, then the same rows as a file, reordered
    path = write_outcomes(tmp_path / "again.jsonl", step_rows(ids, 3)[::-1])
    proc = subprocess.run([str(GRAPHDIFF), "update", "--state", str(st.path), "--step", "3", "--outcomes",
                           str(path), "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["noop"] and json.loads(proc.stdout)["outcomes"] == res["outcomes"]


def test_other_steps_outcomes_are_refused_naming_their_step(st, tmp_path, inputs):
    ids = inputs[2]
    files = _applied(st, tmp_path, ids, 5)
    with pytest.raises(AlreadyAppliedError, match="these are the outcomes of step 3") as err:
        st.update(5, files[3])
    assert "step 5 is already applied from other outcomes" in str(err.value)
    with pytest.raises(AlreadyAppliedError, match="step 4 is already applied, from these very outcomes"):
        st.update(4, files[4])
    with pytest.raises(AlreadyAppliedError, match="from other outcomes \\(the current step is 5"):
        st.update(5, write_outcomes(tmp_path / "new.jsonl", step_rows(ids, 9)))
    with pytest.raises(StepGapError, match="these are the outcomes of step 2, already applied"):
        st.update(8, step_rows(ids, 2))
    proc = subprocess.run([str(GRAPHDIFF), "update", "--state", str(st.path), "--step", "5", "--outcomes",
                           str(files[3])], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3 and "these are the outcomes of step 3" in proc.stderr


def test_another_threshold_is_other_outcomes(st, tmp_path, inputs):
    ids = inputs[2]
    rewards = tmp_path / "r.jsonl"
    rewards.write_text("".join(json.dumps({"id": i, "reward": 0.25 * (k % 5)}) + "\n"
                               for k, i in enumerate(ids[:10])))
    st.update(1, rewards, success_threshold=0.5)
    assert st.update(1, rewards, success_threshold=0.5)["noop"]
    with pytest.raises(AlreadyAppliedError, match="from other outcomes"):
        st.update(1, rewards, success_threshold=0.75)


def test_refused_rows_are_not_kept_and_errors_name_the_row(st, inputs):
    ids = inputs[2]
    rows = step_rows(ids, 1)
    bad = rows[:3] + [{"id": ids[0], "n": 2, "s": 5}]
    with pytest.raises(DataError) as err:
        st.update(1, bad)
    assert str(err.value).startswith("outcome row 4: s = 5 successes is more than n = 2")
    assert ".outcomes" not in str(err.value)
    with pytest.raises(DataError, match="outcome row 2: unknown prompt id 'nope'"):
        st.update(1, [rows[0], {"id": "nope", "n": 1, "s": 0}])
    assert not st.outcomes_dir.exists() or not any(st.outcomes_dir.iterdir())
    st.update(1, rows)
    assert len(list(st.outcomes_dir.iterdir())) == 1


def test_rows_files_are_pruned_with_their_steps(st, inputs):
    ids = inputs[2]
    for t in range(1, 8):
        st.update(t, step_rows(ids, t))
    kept = sorted(int(p.name[5:13]) for p in st.outcomes_dir.iterdir())
    assert kept == [t for t in st.status()["retained"] if t >= 1] and len(kept) < 7
    named = {Path(e["outcomes"]).name for e in st.dir.log_entries() if e.get("step") in kept}
    assert named == {p.name for p in st.outcomes_dir.iterdir()}


def test_states_sharing_the_folder_keep_their_own_files_even_for_the_same_rows(tmp_path, inputs):
    """Two STATEs fed the same rows (an empty step's placeholder row is the same for any two STATEs of the same
    prompts) each keep the file their own log names, whatever the other prunes."""
    graph, clusters, ids = inputs
    shared = tmp_path / "rows"
    State.init(graph, clusters, tmp_path / "A", device="cpu", keep=2, keep_every=0, durable=False)
    State.init(graph, clusters, tmp_path / "B", device="cpu", keep=50, durable=False)
    a = State.open(tmp_path / "A", device="cpu", durable=False, outcomes_dir=shared)
    b = State.open(tmp_path / "B", device="cpu", durable=False, outcomes_dir=shared)
    for t in range(1, 6):
        rows = [] if t == 3 else step_rows(ids, t)
        b.update(t, rows)
        a.update(t, rows)
    for e in b.dir.log_entries():
        if e.get("step"):
            assert Path(e["outcomes"]).is_file(), e["step"]
    assert len([e for e in a.dir.log_entries() if e.get("step") and Path(e["outcomes"]).is_file()]) < 5


def test_a_writer_refused_or_answered_the_no_op_never_removes_a_file_the_log_names(tmp_path, inputs):
    """Two writers of one step: whichever loses (refused under the lock, or answered the no-op) removes only
    its own file; a writer whose view of the STATE was a step old still applies from a file that stays."""
    graph, clusters, ids = inputs
    root = tmp_path / "S"
    State.init(graph, clusters, root, device="cpu", durable=False)
    a, b = State.open(root, device="cpu", durable=False), State.open(root, device="cpu", durable=False)
    b.step  # b read the STATE at step 0
    res = a.update(1, step_rows(ids, 1))
    assert b.update(1, step_rows(ids, 1))["noop"]
    assert Path(res["outcomes"]).is_file()
    res2 = b.update(2, step_rows(ids, 2))  # b's view was a step old: its file is the one the log names
    assert Path(res2["outcomes"]).is_file() and State.open(root).step == 2
    assert sorted(p.name[:13] for p in a.outcomes_dir.iterdir()) == ["step_00000001", "step_00000002"]


def test_an_error_that_names_no_row_is_not_mangled(st, monkeypatch):
    from graphdiff_cli.stages import handoff

    def gone(path, *args, **kw):
        from graphdiff_cli.io.outcomes import read_outcomes

        Path(path).unlink()
        return read_outcomes(path)

    monkeypatch.setattr(handoff, "read_step_outcomes", gone)
    with pytest.raises(DataError, match="^the outcome rows: no such outcomes file$"):
        st.update(1, [{"id": "q000", "n": 1, "s": 0}])


def test_python_errors_name_keywords_and_the_cli_names_flags(st, tmp_path, inputs):
    """The Python API's messages name its keywords and calls, the command line's its flags and commands."""
    ids = inputs[2]
    rewards = write_outcomes(tmp_path / "r.jsonl", [{"id": ids[0], "reward": 0.5}])
    with pytest.raises(DataError, match=r"pass success_threshold=X \(") as err:
        st.update(1, rewards)
    assert "--" not in str(err.value)
    with pytest.raises(DataError, match="use id_field to name the id column"):
        st.update(1, [{"prompt": ids[0], "n": 1, "s": 0}])
    st.update(1, step_rows(ids, 1))
    st.update(2, step_rows(ids, 2))
    with pytest.raises(AlreadyAppliedError, match=r"run State\.rollback\(0\) first"):
        st.update(1, step_rows(ids, 7))
    with pytest.raises(Exception, match="^keep must be an integer"):
        st.retention(keep=1)
    proc = subprocess.run([str(GRAPHDIFF), "update", "--state", str(st.path), "--step", "3", "--outcomes",
                           str(rewards)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "pass --success-threshold X" in proc.stderr
    proc = subprocess.run([str(GRAPHDIFF), "update", "--state", str(st.path), "--step", "1", "--outcomes",
                           str(rewards), "--success-threshold", "0.5"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3 and "graphdiff rollback --to 0 first" in proc.stderr
