"""graphdiff watch: step files of an inbox applied to a STATE in step order, exactly once, across a real
kill -9 and restart; half-written files never read; out-of-order arrival held until the gap fills."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from _handoff_fixtures import GRAPHDIFF, make_inputs, step_rows, tree_hash, write_outcomes
from graphdiff_cli.cli.app import app
from graphdiff_cli.errors import DataError, InvalidArgumentError, StateError
from graphdiff_cli.estimator import Estimator
from graphdiff_cli.io.state_dir import StateDir
from graphdiff_cli.stages.watch import inbox_lock, predictions_path, scan_inbox, step_file_name
from graphdiff_cli.state import State

runner = CliRunner()
STEPS = 4


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """graph.zarr, clusters.zarr (40 prompts, 4 states), the outcomes of steps 1..4 and the reference
    estimator: each step applied exactly once, in order, by State.update."""
    folder = tmp_path_factory.mktemp("watch-inputs")
    graph, clusters, ids = make_inputs(folder, n=40)
    files = [write_outcomes(folder / f"o{t}.jsonl", step_rows(ids, t)) for t in range(1, STEPS + 1)]
    ref = folder / "REF"
    State.init(graph, clusters, ref, device="cpu", durable=False)
    for t, f in enumerate(files, start=1):
        State.open(ref, durable=False).update(t, f)
    return {"graph": graph, "clusters": clusters, "ids": ids, "files": files, "ref": ref}


@pytest.fixture
def state(tmp_path, inputs):
    out = tmp_path / "STATE"
    State.init(inputs["graph"], inputs["clusters"], out, device="cpu", durable=False)
    return out


@pytest.fixture
def inbox(tmp_path):
    d = tmp_path / "inbox"
    d.mkdir()
    return d


def drop(inputs, inbox: Path, step: int, name: str | None = None) -> Path:
    """Put step ``step``'s outcomes into the inbox the way a writer should: temporary name, then rename."""
    dst = inbox / (name or step_file_name(step))
    tmp = inbox / (dst.name + ".tmp")
    tmp.write_bytes(inputs["files"][step - 1].read_bytes())
    os.replace(tmp, dst)
    return dst


def applied_steps(state: Path) -> list[int]:
    return [int(e["step"]) for e in StateDir.open(state).log_entries()]


def assert_same_as_reference(state: Path, inputs) -> None:
    """Exactly once: a step applied twice (or skipped) would change the counts and the estimates."""
    ours, ref = Estimator.load(state, device="cpu"), Estimator.load(inputs["ref"], device="cpu")
    assert ours.step_ == ref.step_ == STEPS
    np.testing.assert_array_equal(np.asarray(ours.rollouts_), np.asarray(ref.rollouts_))
    np.testing.assert_array_equal(np.asarray(ours.successes_), np.asarray(ref.successes_))
    np.testing.assert_allclose(ours.predict(), ref.predict(), atol=1e-6)


def run_watch(state, inbox, **kw):
    kw.setdefault("once", True)
    events = []
    res = State.open(state, durable=kw.pop("durable", False)).watch(inbox, listener=events.append, **kw)
    return res, events


# --------------------------------------------------------------------------------------------- order


def test_a_long_watch_keeps_bounded_bookkeeping(state, inbox, inputs, monkeypatch):
    """A watcher lives for the whole run: the result lists only the last APPLIED_KEPT steps (all counted),
    and step files the trainer deleted are forgotten (the soak's memory growth, docs/lab/reliability.md)."""
    import graphdiff_cli.stages.watch as W

    monkeypatch.setattr(W, "APPLIED_KEPT", 2)
    for t in range(1, STEPS + 1):
        drop(inputs, inbox, t)
    w = W._Watcher(State.open(state, device="cpu", durable=False)._watch_handoff(), inbox, complete="rename", predictions=None,
                   group_size=8, success_threshold=1.0, lock_timeout=5.0, listener=lambda e: None)
    w.pass_once()
    assert [a["step"] for a in w.applied] == [3, 4] and w.n_applied == 4
    w.pass_once()  # the applied files are checked against the log once, and remembered
    assert len(w._checked) == STEPS
    for t in (1, 2):
        (inbox / step_file_name(t)).unlink()
    w.pass_once()
    assert sorted(w._checked) == [step_file_name(3), step_file_name(4)]
    assert_same_as_reference(state, inputs)




def test_out_of_order_arrival_is_applied_in_step_order(state, inbox, inputs):
    for t in (3, 4, 2):
        drop(inputs, inbox, t)
    res, events = run_watch(state, inbox)
    assert res["n_applied"] == 0 and res["step"] == 0
    assert res["pending"] == [2, 3, 4] and res["next_step"] == 1
    assert any(e["event"] == "waiting" and e["later_steps"] == [2, 3, 4] for e in events)

    drop(inputs, inbox, 1)
    res, events = run_watch(state, inbox)
    assert [a["step"] for a in res["applied"]] == [1, 2, 3, 4]
    assert [e["step"] for e in events if e["event"] == "applied"] == [1, 2, 3, 4]
    assert applied_steps(state) == [0, 1, 2, 3, 4]
    assert res["pending"] == [] and res["step"] == STEPS
    assert_same_as_reference(state, inputs)

    # a second pass finds nothing new and applies nothing twice
    res, _ = run_watch(state, inbox)
    assert res["n_applied"] == 0 and applied_steps(state) == [0, 1, 2, 3, 4] and res["conflicts"] == []


def test_unpadded_and_csv_names_are_steps_too(state, inbox, inputs, tmp_path):
    drop(inputs, inbox, 1, name="step-1.jsonl")
    rows = [json.loads(x) for x in inputs["files"][1].read_text().splitlines()]
    write_outcomes(tmp_path / "two.csv", rows)
    os.replace(tmp_path / "two.csv", inbox / "step-02.csv")
    res, _ = run_watch(state, inbox)
    assert [a["file"] for a in res["applied"]] == ["step-1.jsonl", "step-02.csv"]


# ------------------------------------------------------------------------------------ half-written


def test_half_written_files_are_never_read_in_rename_mode(state, inbox, inputs):
    drop(inputs, inbox, 1)
    # a writer still busy: temporary names that are not step names, whatever their content
    (inbox / "step-000002.jsonl.tmp").write_text('{"id": "q000", "n": 8, "s"')
    (inbox / ".step-000002.jsonl").write_text('{"id": "q000", "n"')
    (inbox / "step-000002.jsonl.partial").write_text("garbage")
    res, _ = run_watch(state, inbox)
    assert [a["step"] for a in res["applied"]] == [1] and res["step"] == 1 and res["next_step"] == 2
    drop(inputs, inbox, 2)
    res, _ = run_watch(state, inbox)
    assert [a["step"] for a in res["applied"]] == [2]


def test_done_marker_mode_waits_for_the_marker(state, inbox, inputs):
    full = inputs["files"][0].read_text()
    target = inbox / step_file_name(1)
    target.write_text(full[: len(full) // 2 + 3])  # half-written in place, under its final name
    res, events = run_watch(state, inbox, complete="done")
    assert res["n_applied"] == 0 and res["incomplete"] == [target.name]
    assert any(e["event"] == "waiting" and e["incomplete"] == [target.name] for e in events)

    target.write_text(full)
    (inbox / (target.name + ".done")).touch()
    res, _ = run_watch(state, inbox, complete="done")
    assert [a["step"] for a in res["applied"]] == [1] and res["incomplete"] == []


def test_scan_inbox_names():
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        for name in ("step-000001.jsonl", "step-2.csv", "step-000000.jsonl", "step-3.txt", "notes.jsonl",
                     "step-4.parquet.tmp", "step-5.jsonl.done"):
            (d / name).write_text("x")
        (d / "step-000006.jsonl").mkdir()
        scan = scan_inbox(d)
        assert sorted(scan.ready) == [1, 2]
        assert scan.invalid == ["step-000000.jsonl"] and scan.incomplete == ["step-000006.jsonl"]
        done = scan_inbox(d, complete="done")
        assert done.ready == {} and "step-000001.jsonl" in done.incomplete
        with pytest.raises(InvalidArgumentError):
            scan_inbox(d, complete="sometimes")
    with pytest.raises(DataError, match="no such inbox"):
        scan_inbox(Path("/nonexistent/inbox"))


# -------------------------------------------------------------------------------- refusals, conflicts


def test_a_changed_file_for_an_applied_step_is_a_conflict_and_left_alone(state, inbox, inputs):
    drop(inputs, inbox, 1)
    run_watch(state, inbox)
    before = tree_hash(state)
    (inbox / step_file_name(1)).write_bytes(inputs["files"][2].read_bytes())  # other bytes for step 1
    res, events = run_watch(state, inbox)
    assert res["n_applied"] == 0 and tree_hash(state) == before
    assert [c["step"] for c in res["conflicts"]] == [1]
    assert res["conflicts"][0]["applied_hash"] != res["conflicts"][0]["hash"]
    assert any(e["event"] == "conflict" for e in events)


def test_an_applied_step_re_serialised_in_the_inbox_is_no_conflict(state, inbox, inputs):
    """The same rows in another order (a trainer that rewrote the file on resume) are the step's outcomes."""
    drop(inputs, inbox, 1)
    run_watch(state, inbox)
    lines = inputs["files"][0].read_text().splitlines(keepends=True)
    (inbox / step_file_name(1)).write_text("".join(reversed(lines)))
    res, events = run_watch(state, inbox)
    assert res["conflicts"] == [] and not any(e["event"] == "conflict" for e in events)


def test_a_file_deleted_between_the_look_at_the_inbox_and_its_read_is_not_an_error(state, inbox, inputs,
                                                                                   monkeypatch):
    """A trainer may delete step files at any time: one gone after the scan listed it stopped the watcher with a
    bare FileNotFoundError. An applied step's file is simply forgotten; a pending one is reported and waited for."""
    import graphdiff_cli.stages.watch as W

    real, doomed = W.scan_inbox, []

    def scan_then_delete(folder, complete="rename"):
        scan = real(folder, complete)
        while doomed:
            (inbox / doomed.pop()).unlink()
        return scan

    monkeypatch.setattr(W, "scan_inbox", scan_then_delete)
    for t in (1, 2):
        drop(inputs, inbox, t)
    run_watch(state, inbox)
    doomed.append(step_file_name(1))  # applied: a fresh watcher checks it against the log
    drop(inputs, inbox, 3)
    doomed.append(step_file_name(3))  # pending: read after the scan listed it
    res, events = run_watch(state, inbox)
    assert res["step"] == 2 and res["n_applied"] == 0 and res["conflicts"] == []
    assert [e for e in events if e["event"] == "vanished"] == [{"event": "vanished", "step": 3,
                                                                 "file": step_file_name(3)}]
    (inbox / "retire-3.txt").write_text(inputs["ids"][0] + "\n")
    doomed.append("retire-3.txt")  # a prompt set change, gone before it is hashed
    res, events = run_watch(state, inbox)
    assert res["step"] == 2 and any(e["event"] == "vanished" and e["file"] == "retire-3.txt" for e in events)
    drop(inputs, inbox, 3)
    drop(inputs, inbox, 4)
    res, _ = run_watch(state, inbox)  # and it goes on once the files are there
    assert res["step"] == STEPS and applied_steps(state) == [0, 1, 2, 3, 4]
    assert_same_as_reference(state, inputs)


def test_two_files_for_the_next_step_are_refused(state, inbox, inputs):
    drop(inputs, inbox, 1)
    drop(inputs, inbox, 1, name="step-1.jsonl")
    with pytest.raises(DataError, match="two outcomes files for step 1"):
        run_watch(state, inbox)
    assert applied_steps(state) == [0]


def test_bad_file_stops_the_watcher_with_one_line_and_changes_nothing(state, inbox, inputs):
    drop(inputs, inbox, 1)
    (inbox / step_file_name(2)).write_text('{"id": "not-a-prompt", "n": 8, "s": 1}\n')
    drop(inputs, inbox, 3)
    run_watch(state, inbox, once=True, until_step=1)
    before = tree_hash(state)
    res = runner.invoke(app, ["watch", "--state", str(state), "--inbox", str(inbox), "--once"])
    assert res.exit_code == 1
    err = res.stderr.strip()
    assert "not-a-prompt" in err and step_file_name(2) in err and "step 2" in err
    assert tree_hash(state) == before and applied_steps(state) == [0, 1]


def test_second_watcher_on_one_inbox_is_refused(state, inbox):
    with inbox_lock(inbox):
        res = runner.invoke(app, ["watch", "--state", str(state), "--inbox", str(inbox), "--once"])
    assert res.exit_code == 5 and "another graphdiff watch" in res.stderr


def test_bad_options(state, inbox, tmp_path):
    for args, code in ((["--poll", "0"], 2), (["--complete", "maybe"], 2), (["--group-size", "0"], 2),
                       (["--predictions", str(tmp_path / "p.txt")], 2)):
        res = runner.invoke(app, ["watch", "--state", str(state), "--inbox", str(inbox), "--once", *args])
        assert res.exit_code == code, (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1
    res = runner.invoke(app, ["watch", "--state", str(tmp_path / "nope"), "--inbox", str(inbox), "--once"])
    assert res.exit_code == 6 and "no such STATE" in res.stderr
    res = runner.invoke(app, ["watch", "--state", str(state), "--inbox", str(tmp_path / "nope"), "--once"])
    assert res.exit_code == 1 and "no such inbox" in res.stderr


# ------------------------------------------------------------------------------------ predictions, CLI


def test_cli_json_and_predictions_after_each_step(state, inbox, inputs, tmp_path):
    for t in (1, 2):
        drop(inputs, inbox, t)
    template = tmp_path / "preds" / "p-{step}.csv"
    res = runner.invoke(app, ["watch", "--state", str(state), "--inbox", str(inbox), "--once",
                              "--predictions", str(template), "--json"])
    assert res.exit_code == 0, res.stderr
    assert res.stdout.count("\n") == 1
    out = json.loads(res.stdout)
    assert out["command"] == "watch" and out["step"] == 2 and out["n_applied"] == 2
    assert out["predictions"] == str(predictions_path(template, 2))
    written = sorted(p.name for p in (tmp_path / "preds").iterdir() if not p.name.startswith("."))
    assert written == ["p-000000.csv", "p-000001.csv", "p-000002.csv"]  # at start, then after each step
    lines = (tmp_path / "preds" / "p-000002.csv").read_text().splitlines()
    assert lines[0].startswith("id,p,") and len(lines) == 1 + len(inputs["ids"])


def test_predictions_at_start_only_when_the_state_moved(state, inbox, inputs, tmp_path):
    out = tmp_path / "p.jsonl"
    drop(inputs, inbox, 1)
    _, events = run_watch(state, inbox, predictions=out)
    assert [e["step"] for e in events if e["event"] == "predicted"] == [0, 1]
    _, events = run_watch(state, inbox, predictions=out)  # nothing moved: nothing rewritten
    assert not [e for e in events if e["event"] == "predicted"]
    State.open(state).rollback(0)
    (inbox / step_file_name(1)).unlink()  # the trainer redoes step 1 from its checkpoint
    _, events = run_watch(state, inbox, predictions=out)
    assert [e["step"] for e in events if e["event"] == "predicted"] == [0]
    assert max(json.loads(x)["n_seen"] for x in out.read_text().splitlines()) == 0


def test_freshness_is_read_from_what_the_files_say_not_their_times(state, inbox, inputs, tmp_path):
    """A predictions file dated in the future (clock skew, a copy) is rewritten when the STATE moved; one whose
    step was rolled back and applied again from other outcomes too, even with a file per step; a file replaced
    after it was written too. Only a file its stamp vouches for, at the current version, is kept."""
    out = tmp_path / "p.jsonl"
    drop(inputs, inbox, 1)
    run_watch(state, inbox, predictions=out)
    stamp = out.with_name(f".{out.name}.stamp")  # one for the file (a {step} template: one for all its files)
    assert json.loads(stamp.read_text())["version"] == [1, 0]
    st = State.open(state)
    st.rollback(0)
    future = time.time() + 10 * 365 * 86400
    os.utime(out, (future, future))  # the old file looks newer than any CURRENT
    _, events = run_watch(state, inbox, predictions=out)
    assert [e["step"] for e in events if e["event"] == "predicted"] == [0, 1]  # at start, then after step 1 again
    _, events = run_watch(state, inbox, predictions=out)
    assert not [e for e in events if e["event"] == "predicted"]
    out.write_text(out.read_text().replace('"n_seen": 0', '"n_seen": 9'))  # replaced since: not vouched for
    os.utime(out, (future, future))
    _, events = run_watch(state, inbox, predictions=out)
    assert [e["step"] for e in events if e["event"] == "predicted"] == [1]
    # a file per step: step 1 rolled back and applied again from other outcomes is another state
    per_step = tmp_path / "pred-{step}.jsonl"
    run_watch(state, inbox, predictions=per_step)
    first = predictions_path(per_step, 1).read_text()
    st.rollback(0)
    (inbox / step_file_name(1)).unlink()
    write_outcomes(inbox / step_file_name(1), step_rows(inputs["ids"], 1, seed=5))
    State.open(state).update(1, inbox / step_file_name(1))
    _, events = run_watch(state, inbox, predictions=per_step)
    assert [e["step"] for e in events if e["event"] == "predicted"] == [1]
    assert predictions_path(per_step, 1).read_text() != first
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".stamp")) == [".p.jsonl.stamp",
                                                                                   ".pred-{step}.jsonl.stamp"]


# ------------------------------------------------------------------------------- kill -9 and restart


def _start(state, inbox, *args, pause: str | None = None, release: Path | None = None):
    env = dict(os.environ)
    env.pop("GRAPHDIFF_TEST_PAUSE_AFTER", None)
    if pause:
        env.update(GRAPHDIFF_TEST_PAUSE_AFTER=pause, GRAPHDIFF_TEST_PAUSE_FILE=str(release))
    return subprocess.Popen([str(GRAPHDIFF), "watch", "--state", str(state), "--inbox", str(inbox), "--poll", "0.05",
                             *map(str, args)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the watcher exited ({proc.returncode}) before its pause: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the watcher never reached its pause point")
        time.sleep(0.02)


@pytest.mark.slow
def test_exactly_once_across_kill_9_and_restart(state, inbox, inputs, tmp_path):
    for t in range(1, STEPS + 1):
        drop(inputs, inbox, t)
    preds = tmp_path / "preds-{step}.jsonl"

    # 1. killed after writing step 1's artifact and log, before CURRENT: step 1 is not applied
    release = tmp_path / "release-1"
    proc = _start(state, inbox, "--predictions", preds, pause="log", release=release)
    _wait_for(Path(f"{release}.reached"), proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert StateDir.open(state).current_step == 0

    # 2. restarted, killed right after CURRENT moved to step 1, before its predictions were written
    release = tmp_path / "release-2"
    proc = _start(state, inbox, "--predictions", preds, pause="current", release=release)
    _wait_for(Path(f"{release}.reached"), proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert StateDir.open(state).current_step == 1
    assert not predictions_path(preds, 1).exists()

    # 3. restarted again: catches up from step 2 and stops by itself at the last step
    proc = _start(state, inbox, "--predictions", preds, "--until-step", STEPS, "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    res = json.loads(out)
    assert [a["step"] for a in res["applied"]] == [2, 3, 4] and res["stopped"] == "until_step"
    assert applied_steps(state) == [0, 1, 2, 3, 4]  # each step once in the log
    assert_same_as_reference(state, inputs)
    # the predictions missed by the kill were written at restart, then one file per step
    for t in range(1, STEPS + 1):
        rows = predictions_path(preds, t).read_text().splitlines()
        assert len(rows) == len(inputs["ids"])
    last = {json.loads(x)["id"]: json.loads(x) for x in predictions_path(preds, STEPS).read_text().splitlines()}
    ref = Estimator.load(inputs["ref"], device="cpu")
    assert [last[i]["n_seen"] for i in inputs["ids"]] == np.asarray(ref.rollouts_).astype(int).tolist()


@pytest.mark.slow
def test_sigterm_stops_a_waiting_watcher_cleanly(state, inbox):
    proc = _start(state, inbox, "--json")
    time.sleep(0.2)
    deadline = time.monotonic() + 60
    while not (inbox / ".graphdiff-watch.lock").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out)["stopped"] == "stopped"
    with inbox_lock(inbox):  # released on exit
        pass
    with pytest.raises(StateError):
        with inbox_lock(inbox):
            with inbox_lock(inbox):
                pass


@pytest.mark.slow
def test_python_loop_example_drives_a_watcher_in_lockstep(state):
    """examples/python_loop.py --mode inbox: the trainer drops step files, graphdiff watch applies them
    and writes each step's predictions, which the trainer waits for before its next step."""
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PATH=f"{GRAPHDIFF.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    res = subprocess.run([sys.executable, str(repo / "examples" / "python_loop.py"), "--state", str(state),
                          "--mode", "inbox", "--steps", "2", "--batch-size", "8"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "after step 2" in res.stdout
    assert applied_steps(state) == [0, 1, 2]
    inbox = state.parent / f"{state.name}.inbox"
    assert sorted(p.name for p in inbox.glob("step-*")) == ["step-000001.jsonl", "step-000002.jsonl"]


def test_watch_keeps_the_estimator_in_memory_and_predicts_only_the_pool_named(state, inbox, inputs, tmp_path):
    """Across steps the watcher reads the STATE once (the estimator stays resident) and ends where separate
    updates end; --predict-ids writes only the trainer's next pool, read again at every step."""
    for t in range(1, STEPS + 1):
        drop(inputs, inbox, t)
    pool = tmp_path / "pool.txt"
    pool.write_text(f"{inputs['ids'][5]}\n{inputs['ids'][2]}\n")
    res = State.open(state, durable=False).watch(inbox, once=True, predictions=tmp_path / "pred-{step}.csv",
                                                 predict_ids=pool)
    assert res["n_applied"] == STEPS and res["state_loads"] == 1
    assert_same_as_reference(state, inputs)
    rows = (tmp_path / f"pred-{STEPS:06d}.csv").read_text().splitlines()
    assert rows[0].startswith("id,p,") and [r.split(",")[0] for r in rows[1:]] == [inputs["ids"][5], inputs["ids"][2]]


def test_once_says_it_found_nothing_to_apply_not_that_it_waits(state, inbox, inputs):
    """watch --once ends after its pass: its line says what it found, never "waiting for step N"."""
    res = runner.invoke(app, ["watch", "--state", str(state), "--inbox", str(inbox), "--once"])
    assert res.exit_code == 0, res.stderr
    assert "waiting" not in res.stderr and "nothing to apply: no file for step 1 in the inbox" in res.stderr
    for t in (1, 3):
        drop(inputs, inbox, t)
    res = runner.invoke(app, ["watch", "--state", str(state), "--inbox", str(inbox), "--once"])
    assert res.exit_code == 0 and "waiting" not in res.stderr, res.stderr
    assert "nothing more to apply: no file for step 2 in the inbox; left for a later run: step(s) 3" in res.stderr
    assert applied_steps(state) == [0, 1]
