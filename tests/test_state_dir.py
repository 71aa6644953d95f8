"""The STATE directory and the handoff stages, in process: every step equals an in-memory Estimator fed
the same outcomes; every refusal leaves the tree byte-for-byte unchanged; a crash after any write
leaves a readable state and the step can be re-run; retention, rollback and the lock."""

from __future__ import annotations

import fcntl
import json
import os
import shutil

import numpy as np
import pytest

from _handoff_fixtures import make_inputs, step_rows, tree_hash, write_clusters, write_outcomes
from graphdiff_cli.errors import (AlreadyAppliedError, ArtifactError, DataError, InvalidArgumentError, StateError,
                                  StepGapError)
from graphdiff_cli.estimator import Estimator
from graphdiff_cli.io import state_dir as sdmod
from graphdiff_cli.io.artifacts import read_artifact
from graphdiff_cli.io.state_dir import StateDir
from graphdiff_cli.state import State
from graphdiff_cli.io.readers import read_graph


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("inputs")
    graph, clusters, ids = make_inputs(folder)
    return graph, clusters, ids


@pytest.fixture
def state(tmp_path, inputs):
    graph, clusters, _ = inputs
    out = tmp_path / "STATE"
    State.init(graph, clusters, out, device="cpu", keep=3, durable=False)
    return out


def reference(inputs, **cfg) -> Estimator:
    """The in-memory twin of a STATE made by ``State.init`` (which uses the "default" preset)."""
    graph, clusters, _ = inputs
    w = read_graph(graph).w
    labels = read_artifact(clusters, "clusters").array("labels")
    return Estimator(w, labels, n_states=4, **({"device": "cpu"} | cfg))


def outcomes(tmp_path, ids, step, ext=".jsonl"):
    return write_outcomes(tmp_path / f"o{step}{ext}", step_rows(ids, step))


def apply_ref(est, ids, step):
    index = {p: i for i, p in enumerate(ids)}
    rows = step_rows(ids, step)
    est.update([index[r["id"]] for r in rows], [r["n"] for r in rows], [r["s"] for r in rows])


def update(state, step, path, **kw):
    return State.open(state, durable=False).update(step, path, **kw)


def rollback(state, to, **kw):
    return State.open(state).rollback(to, **kw)


# ----------------------------------------------------------------------------------------- init + load

def test_init_writes_the_layout_and_estimator_load_opens_the_current_step(state, inputs):
    graph, clusters, ids = inputs
    assert sorted(p.name for p in state.iterdir()) == [".lock", "CURRENT", "log.jsonl", "model.zarr", "retention.json", "steps"]
    assert json.loads((state / "CURRENT").read_text()) == {"step": 0, "path": "steps/00000000.zarr"}
    sd = StateDir.open(state)
    assert sd.ids == ids and sd.keep == 3 and sd.retained_steps() == [0]
    model = read_artifact(state / "model.zarr", "estimator-model")
    assert model.inputs == {"graph": read_artifact(graph, "graph").content_hash,
                            "clusters": read_artifact(clusters, "clusters").content_hash}
    est = Estimator.load(state)
    ref = reference(inputs)
    assert est.step_ == 0 and np.array_equal(est.q_, ref.q_)
    assert np.array_equal(est.labels, ref.labels) and (est.graph != ref.graph).nnz == 0
    (log,) = sd.log_entries()
    assert log["step"] == 0 and log["event"] == "init" and log["graph_hash"] == model.inputs["graph"]


def test_steps_match_an_in_memory_estimator_and_the_graph_is_written_once(state, inputs, tmp_path):
    _, _, ids = inputs
    ref = reference(inputs)
    model_files = {p: p.stat().st_mtime_ns for p in (state / "model.zarr").rglob("*") if p.is_file()}
    for t in (1, 2, 3):
        res = update(state, t, outcomes(tmp_path, ids, t))
        apply_ref(ref, ids, t)
        assert res["step"] == t
        est = Estimator.load(state)
        assert est.step_ == t
        np.testing.assert_allclose(est.q_, ref.q_, rtol=0, atol=1e-6)
        np.testing.assert_allclose(est.predict(), ref.predict(), rtol=0, atol=1e-6)
        assert np.array_equal(est.rollouts_, ref.rollouts_) and np.array_equal(est.successes_, ref.successes_)
    # the step artifacts hold no graph; model.zarr was never rewritten
    assert "graph_data" not in read_artifact(state / "steps/00000003.zarr", "estimator-step").group
    assert {p: p.stat().st_mtime_ns for p in (state / "model.zarr").rglob("*") if p.is_file()} == model_files
    # a step artifact opened directly finds its model
    assert Estimator.load(state / "steps/00000002.zarr").step_ == 2


def test_windowed_residual_state_round_trips_every_array(tmp_path, inputs):
    graph, clusters, ids = inputs
    out = tmp_path / "W"
    State.init(graph, clusters, out, device="cpu", window=2, schedule="residual", durable=False)
    ref = reference(inputs, window=2, schedule="residual")
    for t in (1, 2, 3):
        update(out, t, outcomes(tmp_path, ids, t))
        apply_ref(ref, ids, t)
    got, want = Estimator.load(out).state_dict(), ref.state_dict()
    assert got["config"] == want["config"] | {"device": "cpu"}
    for key in want:
        if key not in ("config", "graph"):
            np.testing.assert_allclose(np.asarray(got[key], float), np.asarray(want[key], float), atol=1e-6,
                                       err_msg=key)


def test_standalone_save_and_load_still_work(tmp_path, inputs):
    ref = reference(inputs)
    apply_ref(ref, inputs[2], 1)
    ref.save(tmp_path / "est.zarr")
    back = Estimator.load(tmp_path / "est.zarr")
    assert back.step_ == 1 and np.array_equal(back.q_, ref.q_)


# ------------------------------------------------------------------------------------------- refusals

def _refused(state, exc, match, fn, *args, **kw):
    before = tree_hash(state)
    with pytest.raises(exc, match=match) as err:
        fn(*args, **kw)
    assert "\n" not in str(err.value)
    assert tree_hash(state) == before
    return err


def test_step_refusals_change_nothing(state, inputs, tmp_path):
    ids = inputs[2]
    update(state, 1, outcomes(tmp_path, ids, 1))
    update(state, 2, outcomes(tmp_path, ids, 2))
    o = outcomes(tmp_path, ids, 3)
    _refused(state, AlreadyAppliedError, "step 2 is already applied .*current step is 2", update, state, 2, o)
    _refused(state, AlreadyAppliedError, "step 1 is already applied", update, state, 1, o)
    _refused(state, StepGapError, "step 5 would skip steps 3..4", update, state, 5, o)
    _refused(state, StepGapError, "step 4 would skip step 3:", update, state, 4, o)
    # the last applied step sent again from the same outcomes: a no-op (a retry after a crash or a signal that
    # came after the commit); an older step is refused even then (the trainer is behind the STATE)
    before = tree_hash(state)
    assert update(state, 2, outcomes(tmp_path, ids, 2))["noop"] and tree_hash(state) == before
    _refused(state, AlreadyAppliedError, "step 1 is already applied", update, state, 1, outcomes(tmp_path, ids, 1))
    _refused(state, AlreadyAppliedError, "step 2 is already applied", update, state, 2, outcomes(tmp_path, ids, 2),
             success_threshold=0.5)  # the same file read with another threshold is other outcomes
    _refused(state, InvalidArgumentError, "step must be an integer >= 1", update, state, 0, o)
    _refused(state, InvalidArgumentError, "success_threshold", update, state, 3, o, success_threshold=float("nan"))


BAD_OUTCOMES = [
    ('{"id": "q001", "n": 8, "s": 2}\n{"id": "nope", "n": 8, "s": 2}\n', ":2: unknown prompt id 'nope'"),
    ('{"id": "q001", "n": 2, "s": 3}\n', ":1: s = 3 successes is more than n = 2"),
    ('{"id": "q001", "n": -2, "s": 0}\n', ":1: n = -2 is negative"),
    ('{"id": "q001", "n": 2.5, "s": 0}\n', ":1: n must be an integer"),
    ('{"id": "q001", "n": NaN, "s": 0}\n', ":1: n must be an integer"),
    ('{"id": "q001", "n": 8, "s": 2}\n{"id": "q002", \n', ":2: malformed JSON"),
    ('{"id": "q001", "n": 8}\n', ":1: missing column 's'"),
    ("", "no outcome rows"),
]


@pytest.mark.parametrize("content,match", BAD_OUTCOMES)
def test_bad_outcomes_change_nothing(state, tmp_path, content, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    _refused(state, DataError, match, update, state, 1, path)
    assert StateDir.open(state).current_step == 0


def test_a_held_lock_times_out_clearly_and_changes_nothing(state, inputs, tmp_path):
    o = outcomes(tmp_path, inputs[2], 1)
    fd = os.open(state / ".lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _refused(state, StateError, "another update or rollback has held .lock for more than 0.2 s", update,
                 state, 1, o, lock_timeout=0.2)
        _refused(state, StateError, "held .lock", rollback, state, 0, lock_timeout=0)
    finally:
        os.close(fd)
    assert update(state, 1, o)["step"] == 1  # free again


def test_not_a_state_directory(tmp_path, inputs):
    with pytest.raises(ArtifactError, match="no such STATE directory"):
        State.open(tmp_path / "missing").status()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactError, match="not a graphdiff STATE directory"):
        update(tmp_path / "empty", 1, outcomes(tmp_path, inputs[2], 1))


# ------------------------------------------------------------------------------------ crash at any write

class Crash(BaseException):
    """Stands in for kill -9: raised at a pause point, past every cleanup that could run."""


@pytest.mark.parametrize("point,applied", [("artifact", False), ("log", False), ("current", True),
                                           ("prune", True)])
def test_a_crash_after_any_write_leaves_a_readable_state(state, inputs, tmp_path, monkeypatch, point, applied):
    ids = inputs[2]
    for t in (1, 2, 3):
        update(state, t, outcomes(tmp_path, ids, t))
    before = Estimator.load(state).predict()

    def crash(p):
        if p == point:
            raise Crash(p)

    monkeypatch.setattr(sdmod, "_pause", crash)
    with pytest.raises(Crash):
        update(state, 4, outcomes(tmp_path, ids, 4))
    monkeypatch.undo()

    ref = reference(inputs)
    for t in (1, 2, 3, 4):
        apply_ref(ref, ids, t)
    est = Estimator.load(state)
    status = State.open(state).status()
    if applied:  # CURRENT was replaced: step 4 is in, and applying it again is refused
        assert est.step_ == 4 and status["step"] == 4
        np.testing.assert_allclose(est.predict(), ref.predict(), atol=1e-6)
        assert update(state, 4, outcomes(tmp_path, ids, 4))["noop"]  # the crash came after the commit: the retry
        with pytest.raises(StateError, match="already applied from other outcomes"):  # is a no-op, other rows
            update(state, 4, outcomes(tmp_path, ids, 5))                              # are refused
    else:  # still at step 3, the debris above it is ignored, and re-running step 4 completes
        assert est.step_ == 3 and status["step"] == 3
        np.testing.assert_array_equal(est.predict(), before)
        assert status["retained"] == [0, 1, 2, 3] and [e["step"] for e in status["applied"]] == [0, 1, 2, 3]
        update(state, 4, outcomes(tmp_path, ids, 4))
        np.testing.assert_allclose(Estimator.load(state).predict(), ref.predict(), atol=1e-6)
    update(state, 5, outcomes(tmp_path, ids, 5))
    # the next writer swept every leftover: no staging, trash or temp names remain
    leftovers = [p.name for p in (state / "steps").iterdir() if p.name.startswith(".")]
    leftovers += [p.name for p in state.iterdir() if p.name.startswith(".") and p.name != ".lock"]
    assert leftovers == []
    assert StateDir.open(state).retained_steps() == [0, 3, 4, 5]
    assert [e["step"] for e in StateDir.open(state).log_entries()] == [0, 1, 2, 3, 4, 5]


def test_stale_staging_and_temp_files_are_ignored_then_cleaned(state, inputs, tmp_path):
    ids = inputs[2]
    update(state, 1, outcomes(tmp_path, ids, 1))
    # what a kill -9 inside write_artifact / atomic_write leaves: a half staging folder, a temp pointer
    shutil.copytree(state / "steps/00000001.zarr", state / "steps/.00000002.zarr.staging-999-abcd1234")
    shutil.rmtree(state / "steps/.00000002.zarr.staging-999-abcd1234/q")
    (state / ".CURRENT.x1y2z3.tmp").write_text('{"step": 2, "pa')
    (state / ".log.jsonl.x1y2z3.tmp").write_text("{")
    (state / "user-notes.txt").write_text("not ours")
    assert Estimator.load(state).step_ == 1 and State.open(state).status()["retained"] == [0, 1]
    update(state, 2, outcomes(tmp_path, ids, 2))
    assert sorted(p.name for p in state.iterdir()) == [".lock", "CURRENT", "log.jsonl", "model.zarr", "retention.json", "steps",
                                                       "user-notes.txt"]
    assert sorted(p.name for p in (state / "steps").iterdir()) == ["00000000.zarr", "00000001.zarr",
                                                                   "00000002.zarr"]


@pytest.mark.parametrize("tamper,words", [
    (lambda st: (st / "CURRENT").write_text('{"step": 2, "path": "steps/00000001.zarr"}\n'), "must name"),
    (lambda st: (st / "CURRENT").write_text('{"step": 2, "path": "../../../../etc"}\n'), "must name"),
    (lambda st: (st / "CURRENT").write_text('{"step": 2, "path": "/etc"}\n'), "must name"),
    (lambda st: (st / "log.jsonl").write_text(""), "the log lists no steps"),
    (lambda st: (st / "log.jsonl").write_text("".join(
        line + "\n" for line in (st / "log.jsonl").read_text().splitlines() if '"step": 1,' not in line)),
     "the log lists steps 0..2 (2 lines)"),
    (lambda st: (shutil.rmtree(st / "steps/00000002.zarr"),
                 shutil.copytree(st / "steps/00000001.zarr", st / "steps/00000002.zarr")),
     "holds step 1 but CURRENT says step 2"),
])
def test_a_tampered_current_log_or_step_is_refused_by_every_reader_and_writer(state, inputs, tmp_path, tamper,
                                                                                 words):
    """CURRENT must name its own step's folder (nothing outside the STATE is opened through it), the step
    folder must hold that step, and the log must list every step up to it: else every reader and update refuse."""
    ids = inputs[2]
    for t in (1, 2):
        update(state, t, outcomes(tmp_path, ids, t))
    tamper(state)
    before = tree_hash(state)
    checks = [lambda: Estimator.load(state), lambda: State.open(state).status(),
              lambda: update(state, 3, outcomes(tmp_path, ids, 3)),
              lambda: State.open(state, device="cpu").estimator()]  # predict, select, allocate
    for check in checks:
        with pytest.raises(ArtifactError, match=words.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
            check()
    assert tree_hash(state) == before


# --------------------------------------------------------------------------------- retention, rollback

def test_retention_keeps_the_last_states_plus_step_zero(state, inputs, tmp_path):
    ids = inputs[2]
    pruned = [update(state, t, outcomes(tmp_path, ids, t))["pruned"] for t in range(1, 7)]
    assert pruned == [[], [], [], [1], [2], [3]]  # keep = 3
    assert StateDir.open(state).retained_steps() == [0, 4, 5, 6]
    assert sorted(p.name for p in (state / "steps").iterdir()) == ["00000000.zarr", "00000004.zarr",
                                                                   "00000005.zarr", "00000006.zarr"]
    # the log still lists every applied step, each with its outcomes file's hash
    from graphdiff_cli.io.artifacts import hash_file

    log = StateDir.open(state).log_entries()
    assert [e["step"] for e in log] == list(range(7))
    assert all(e["outcomes_hash"] == hash_file(tmp_path / f"o{e['step']}.jsonl") for e in log[1:])


def test_rollback_then_update(state, inputs, tmp_path):
    ids = inputs[2]
    for t in range(1, 6):
        update(state, t, outcomes(tmp_path, ids, t))
    _refused(state, StateError, "state of step 1 was pruned; retained steps: 0, 3, 4, 5", rollback, state, 1)
    _refused(state, StateError, "step 7 has not been applied", rollback, state, 7)
    _refused(state, InvalidArgumentError, "to must be a step >= 0", rollback, state, -1)
    res = State.open(state).rollback(3)
    assert res["removed"] == [4, 5] and res["next_step"] == 4
    assert StateDir.open(state).retained_steps() == [0, 3]
    assert [e["step"] for e in StateDir.open(state).log_entries()] == [0, 1, 2, 3]
    ref = reference(inputs)
    for t in (1, 2, 3):
        apply_ref(ref, ids, t)
    np.testing.assert_allclose(Estimator.load(state).predict(), ref.predict(), atol=1e-6)
    _refused(state, StateError, "step 5 would skip step 4", update, state, 5, outcomes(tmp_path, ids, 5))
    # the resumed trainer sends different outcomes for step 4 this time
    other = write_outcomes(tmp_path / "o4b.jsonl", step_rows(ids, 4, seed=7))
    update(state, 4, other)
    index = {p: i for i, p in enumerate(ids)}
    rows = step_rows(ids, 4, seed=7)
    ref.update([index[r["id"]] for r in rows], [r["n"] for r in rows], [r["s"] for r in rows])
    np.testing.assert_allclose(Estimator.load(state).predict(), ref.predict(), atol=1e-6)
    assert StateDir.open(state).log_entries()[-1]["outcomes"] == str(other.resolve())
    # rolling back to the current step or to step 0 works
    assert State.open(state).rollback(4)["removed"] == []
    assert State.open(state).rollback(0)["removed"] == [3, 4]
    assert np.array_equal(Estimator.load(state).q_, reference(inputs).q_)


def test_a_crash_during_rollback_leaves_the_target_step(state, inputs, tmp_path, monkeypatch):
    ids = inputs[2]
    for t in range(1, 4):
        update(state, t, outcomes(tmp_path, ids, t))

    def crash(p):
        if p == "current":
            raise Crash(p)

    monkeypatch.setattr(sdmod, "_pause", crash)
    with pytest.raises(Crash):
        State.open(state).rollback(1)
    monkeypatch.undo()
    st = State.open(state).status()
    assert st["step"] == 1 and st["retained"] == [0, 1] and [e["step"] for e in st["applied"]] == [0, 1]
    update(state, 2, outcomes(tmp_path, ids, 2))
    assert StateDir.open(state).retained_steps() == [0, 1, 2]


# ------------------------------------------------------------------------------------------ init checks

def test_init_refuses_mismatched_inputs_and_a_used_out(tmp_path, inputs):
    graph, clusters, ids = inputs
    other_graph, _, _ = make_inputs(tmp_path / "other", seed=5)
    with pytest.raises(DataError, match="made from graph .* not from"):
        State.init(other_graph, clusters, tmp_path / "S1", durable=False)
    g_hash = read_artifact(graph, "graph").content_hash
    labels = read_artifact(clusters, "clusters").array("labels")
    swapped = list(ids)
    swapped[3], swapped[4] = swapped[4], swapped[3]
    bad = write_clusters(tmp_path / "swapped.zarr", swapped, labels, 4, g_hash)
    with pytest.raises(DataError, match=r"ids differ .* at row 3 \('q004' vs 'q003'\)"):
        State.init(graph, bad, tmp_path / "S2", durable=False)
    used = tmp_path / "used"
    used.mkdir()
    (used / "x").write_text("keep me")
    with pytest.raises(StateError, match="already exists and is not empty"):
        State.init(graph, clusters, used, durable=False)
    assert [p.name for p in used.iterdir()] == ["x"]
    assert not (tmp_path / "S1").exists() and not (tmp_path / "S2").exists()
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]


def test_config_file_then_flags(tmp_path, inputs):
    graph, clusters, _ = inputs
    cfg = tmp_path / "c.yaml"
    cfg.write_text("preset: paper\nbeta: 3.5\nmax-iters: 7\nwindow: 4\ngamma: 0.25\n")
    res = State.init(graph, clusters, tmp_path / "S", config=cfg, gamma=0.75, device="cpu", keep=2,
                     durable=False).created
    c = res["config"]
    assert (c["beta"], c["max_iters"], c["window"], c["gamma"], res["keep"]) == (3.5, 7, 4, 0.75, 2)
    assert c["schedule"] == "synchronous" and c["n_states"] == 4  # the file's preset, the flag's gamma
    assert StateDir.open(tmp_path / "S").model()[4] == c
    # a flag that cannot act under the (default) preset's evidence mixing is refused, naming the flag
    with pytest.raises(InvalidArgumentError, match=r"^--gamma: gamma = 0.75 has no effect here"):
        State.init(graph, clusters, tmp_path / "S4", gamma=0.75, durable=False)
    assert not (tmp_path / "S4").exists()
    for text, exc, match in [("betta: 1\n", InvalidArgumentError, r"c2\.yaml:1: unknown setting 'betta'"),
                             ("beta: 1\nmax_iters: 2.5\n", InvalidArgumentError, r":2: max_iters must be an integer"),
                             ("beta: [1\n", DataError, r"c2\.yaml:\d+: malformed YAML"),
                             ("- 1\n", InvalidArgumentError, "expected a mapping"),
                             ("epsilon: 1.5\n", InvalidArgumentError, r"c2\.yaml:1: epsilon must be < 1")]:
        (tmp_path / "c2.yaml").write_text(text)
        with pytest.raises(exc, match=match):
            State.init(graph, clusters, tmp_path / "S3", config=tmp_path / "c2.yaml", durable=False)
        assert not (tmp_path / "S3").exists()


def test_multi_chunk_arrays_round_trip_slab_by_slab(tmp_path):
    """Arrays larger than one 16 MiB chunk are written and read one chunk row at a time (bounded
    memory); every value, dtype and shape must come back, with 0-d, empty and text arrays beside them."""
    from graphdiff_cli.io.artifacts import write_artifact

    rng = np.random.default_rng(0)
    big = rng.random((40_000, 130), dtype=np.float32)  # 20.8 MB: two chunks, the second partial
    arrays = {"big": big, "ints": np.arange(5_000_000, dtype=np.int64)[::-1].copy(), "flag": np.array(True),
              "empty": np.zeros((0, 2, 3)), "names": np.array(["a", "bé", ""], dtype=object)}
    write_artifact(tmp_path / "a.zarr", "test-kind", arrays, durable=False)
    art = read_artifact(tmp_path / "a.zarr", "test-kind")
    assert art.group["big"].chunks[0] < big.shape[0] and art.group["ints"].chunks[0] < 5_000_000
    for name, want in arrays.items():
        got = art.array(name)
        assert got.shape == want.shape and got.dtype == want.dtype, name
        assert np.array_equal(got, want), name


def test_the_log_is_appended_and_a_torn_append_is_skipped_then_dropped(state, inputs, tmp_path):
    """Each update appends one line (the lines before it stay byte for byte); an append cut short by a crash
    (a last line without its newline, above CURRENT) is skipped by readers and dropped by the next update."""
    ids = inputs[2]
    update(state, 1, outcomes(tmp_path, ids, 1))
    log = state / "log.jsonl"
    before = log.read_bytes()
    inode = log.stat().st_ino
    update(state, 2, outcomes(tmp_path, ids, 2))
    after = log.read_bytes()
    assert after.startswith(before) and after.count(b"\n") == before.count(b"\n") + 1
    assert log.stat().st_ino == inode  # appended in place, not rewritten
    with open(log, "ab") as f:
        f.write(b'{"step": 3, "outcomes_hash": "abc", "sta')  # a kill -9 inside the next update's append
    assert [e["step"] for e in StateDir.open(state).log_entries()] == [0, 1, 2]
    assert State.open(state).status()["step"] == 2 and Estimator.load(state).step_ == 2
    update(state, 3, outcomes(tmp_path, ids, 3))
    text = log.read_text()
    assert text.endswith("\n") and [json.loads(x)["step"] for x in text.splitlines()] == [0, 1, 2, 3]


# ---------------------------------------------------------------------------- resident State

def test_resident_handoff_reads_the_state_once_and_matches_separate_updates(tmp_path, inputs):
    """One State over several steps: the STATE is read once, and every step's state and predictions are those
    of separate update/predict calls (fresh processes' worth of reloading) on a twin STATE."""
    graph, clusters, ids = inputs
    a, b = tmp_path / "A", tmp_path / "B"
    for s_ in (a, b):
        State.init(graph, clusters, s_, device="cpu", keep=3, durable=False)
    h = State.open(a, device="cpu", durable=False)
    for t in range(1, 5):
        o = outcomes(tmp_path, ids, t)
        res = h.update(t, o)
        update(b, t, o)
        pa, pb = h.predict(tmp_path / f"a{t}.csv"), State.open(b).predict(tmp_path / f"b{t}.csv")
        assert res["step"] == t and pa["step"] == pb["step"] == t
        assert (tmp_path / f"a{t}.csv").read_text() == (tmp_path / f"b{t}.csv").read_text()
    assert h.loads == 1
    sa, sb = Estimator.load(a).state_dict(), Estimator.load(b).state_dict()
    for k in ("q", "a", "b", "successes", "rollouts"):
        assert np.array_equal(np.asarray(sa[k]), np.asarray(sb[k])), k


def test_resident_handoff_reloads_when_another_writer_moves_current(state, inputs, tmp_path):
    ids = inputs[2]
    h = State.open(state, device="cpu", durable=False)
    h.update(1, outcomes(tmp_path, ids, 1))
    h.update(2, outcomes(tmp_path, ids, 2))
    assert h.loads == 1
    State.open(state).rollback(1)                      # another process rolls back ...
    update(state, 2, outcomes(tmp_path, ids, 2))    # ... and re-applies step 2 itself
    assert h.update(2, outcomes(tmp_path, ids, 2))["noop"]  # the same outcomes: a no-op, whoever applied them
    res = h.update(3, outcomes(tmp_path, ids, 3))   # the in-memory step 2 is not trusted: read again
    assert res["step"] == 3 and h.loads == 2
    ref = reference(inputs)
    for t in (1, 2, 3):
        apply_ref(ref, ids, t)
    np.testing.assert_allclose(Estimator.load(state).predict(), ref.predict(), rtol=1e-6, atol=1e-9)


def test_resident_handoff_forgets_its_estimator_when_a_commit_fails(state, inputs, tmp_path, monkeypatch):
    ids = inputs[2]
    h = State.open(state, device="cpu", durable=False)
    h.update(1, outcomes(tmp_path, ids, 1))

    def disk_full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(h.dir, "commit_step", disk_full)
    with pytest.raises(OSError):
        h.update(2, outcomes(tmp_path, ids, 2))   # the estimator in memory ran step 2; the STATE did not
    monkeypatch.undo()
    assert StateDir.open(state).current_step == 1
    h.update(2, outcomes(tmp_path, ids, 2))       # so it is read again, not reused one step ahead
    ref = reference(inputs)
    for t in (1, 2):
        apply_ref(ref, ids, t)
    np.testing.assert_allclose(Estimator.load(state).predict(), ref.predict(), rtol=1e-6, atol=1e-9)
    assert h.loads == 2


def test_a_state_made_with_keep_1_still_updates_and_keeps_two(tmp_path, inputs):
    """--keep 1 is refused now; a STATE an older graphdiff made with it keeps 2 instead of failing after CURRENT."""
    graph, clusters, ids = inputs
    st = tmp_path / "K1"
    State.init(graph, clusters, st, device="cpu", keep=2, durable=False)
    meta = st / "model.zarr" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["handoff"]["keep"] = 1
    from graphdiff_cli.io.artifacts import attrs_hash

    doc["attributes"]["graphdiff"]["attrs_hash"] = attrs_hash(doc["attributes"])  # as the old version wrote it
    meta.write_text(json.dumps(doc))
    for t in (1, 2, 3):
        update(st, t, outcomes(tmp_path, ids, t))
    assert StateDir.open(st).keep == 2 and StateDir.open(st).retained_steps() == [0, 2, 3]
