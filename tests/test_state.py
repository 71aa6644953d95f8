"""``graphdiff_cli.State``, the public object for a STATE: the in-memory calls a Python trainer makes (rows
instead of files, ids instead of id files), one transaction per write, and equality with the CLI's files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from _handoff_fixtures import make_inputs, step_rows, tree_hash, write_outcomes
from _tolerances import FLOAT64
from graphdiff_cli import State
from graphdiff_cli.errors import (AlreadyAppliedError, ArtifactError, DataError, InvalidArgumentError, StateError,
                                  StepGapError)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("state-inputs"))


@pytest.fixture
def st(tmp_path, inputs):
    graph, clusters, _ = inputs
    return State.init(graph, clusters, tmp_path / "STATE", device="cpu", keep=3, durable=False)


def test_open_refuses_what_is_not_a_state(tmp_path):
    with pytest.raises(ArtifactError, match="no such STATE directory"):
        State.open(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ArtifactError, match="not a graphdiff STATE directory"):
        State.open(tmp_path / "plain")


def test_rows_in_memory_are_the_same_step_as_a_file(tmp_path, inputs):
    """update(t, rows) writes the rows to STATE.outcomes/step_T.jsonl and applies them as update(t, file) does."""
    graph, clusters, ids = inputs
    a = State.init(graph, clusters, tmp_path / "A", device="cpu", durable=False)
    b = State.init(graph, clusters, tmp_path / "B", device="cpu", durable=False)
    for t in (1, 2):
        rows = step_rows(ids, t)
        ra = a.update(t, rows)
        rb = b.update(t, write_outcomes(tmp_path / f"o{t}.jsonl", rows))
        assert ra["outcomes_hash"] == rb["outcomes_hash"] and ra["rollouts"] == rb["rollouts"]
        logged = Path(ra["outcomes"])
        assert logged.parent == (tmp_path / "A.outcomes").resolve()
        assert logged.name.startswith(f"step_{t:08d}-{ra['outcomes_hash']}-") and logged.is_file()
    ea, eb = a.estimates(), b.estimates()
    assert ea["id"] == eb["id"] == ids
    for col in ("p", "mean", "variance", "p_zero_variance", "n_seen"):
        np.testing.assert_array_equal(ea[col], eb[col])
    assert a.loads == 1  # resident: read once at the first update, never again


def test_an_empty_step_still_advances_and_bad_rows_change_nothing(st, tmp_path):
    res = st.update(1, [])  # reused generations: no rollouts this step
    assert res["step"] == 1 and res["rollouts"] == 0
    before = tree_hash(st.path)
    with pytest.raises(DataError, match="unknown prompt id 'nope'"):
        st.update(2, [{"id": "nope", "n": 8, "s": 1}])
    with pytest.raises(InvalidArgumentError, match="list of row dicts"):
        st.update(2, [("q000", 8, 1)])
    with pytest.raises(StateError, match="step 3 would skip step 2"):
        st.update(3, [{"id": "q000", "n": 8, "s": 1}])
    assert tree_hash(st.path) == before and st.step == 1


def test_estimates_select_allocate_take_lists_of_ids(st, inputs):
    _, _, ids = inputs
    st.update(1, step_rows(ids, 1))
    e = st.estimates(["q003", "q001"])
    assert e["id"] == ["q003", "q001"] and e["p"].shape == (2,)
    with pytest.raises(DataError, match="unknown prompt id 'zz'"):
        st.estimates(["zz"])
    sel = st.select(ids[:20], 5, "target", seed=1)
    assert len(sel["ids"]) == 5 and set(sel["ids"]) <= set(ids[:20]) and sel["out"] is None
    with pytest.raises(DataError, match="repeats"):
        st.select(["q000", "q000"], 1, "uniform")
    alloc = st.allocate(ids[:10], 80, "variance")
    assert sum(alloc["counts_by_id"].values()) == 80 and list(alloc["counts_by_id"]) == ids[:10]


def test_select_to_a_file_matches_the_result(st, tmp_path, inputs):
    _, _, ids = inputs
    pool = tmp_path / "pool.txt"
    pool.write_text("".join(f"{i}\n" for i in ids[:30]))
    res = st.select(pool, 6, "thompson", tmp_path / "batch.txt", seed=3)
    assert (tmp_path / "batch.txt").read_text().split() == res["ids"]
    assert st.select(ids[:30], 6, "thompson", seed=3)["ids"] == res["ids"]  # a file or a list: the same pool


def test_retire_by_list_skips_the_prompts_and_rollback_undoes_it(st, inputs):
    _, _, ids = inputs
    st.update(1, step_rows(ids, 1))
    res = st.retire(["q002", "q005"])
    assert res["version"] == "1.1" and res["ids_file"] is None
    assert "q002" not in st.estimates()["id"] and len(st.estimates()["id"]) == len(ids) - 2
    with pytest.raises(DataError, match="'q002' is already retired"):
        st.retire(["q002"])
    st.rollback("1.0")
    assert len(st.estimates()["id"]) == len(ids)


def test_a_failed_transaction_leaves_the_state_and_forgets_the_resident_estimator(st, inputs):
    _, _, ids = inputs
    st.update(1, step_rows(ids, 1))
    before = tree_hash(st.path)
    est = st.estimator()
    with pytest.raises(RuntimeError, match="trainer died"):
        with st.transaction(lock_timeout=1) as txn:
            est.update(np.array([0]), np.array([8]), np.array([8]))  # the resident estimator moves ahead ...
            raise RuntimeError("trainer died")                         # ... and the write never commits
    assert tree_hash(st.path) == before
    assert st.estimator() is not est and st.estimator().step_ == 1 and st.loads == 2  # read again, not reused
    with st.transaction() as txn:
        pass
    assert not txn.committed and tree_hash(st.path) == before  # a transaction that commits nothing writes nothing


def test_one_transaction_commits_one_version(st, inputs):
    with pytest.raises(StateError, match="one transaction commits one version"):
        with st.transaction() as txn:
            txn.commit_revision({"event": "retire", "ids_file": None, "ids_hash": "x", "prompts": 0, "n_retired": 0})
            txn.commit_revision({"event": "retire", "ids_file": None, "ids_hash": "y", "prompts": 0, "n_retired": 0})
    assert st.version == (0, 1)  # the first commit stands: it was complete before the second was refused


def test_another_writer_is_seen(st, tmp_path, inputs):
    """Two State objects on one STATE: each follows what the other committed (CURRENT is the truth)."""
    _, _, ids = inputs
    other = State.open(st.path, device="cpu", durable=False)
    st.update(1, step_rows(ids, 1))
    assert other.update(1, step_rows(ids, 1))["noop"]  # the same rows again: nothing to do
    before = tree_hash(st.path.parent)
    with pytest.raises(AlreadyAppliedError, match="step 1 is already applied from other outcomes"):
        other.update(1, step_rows(ids, 1, seed=9))
    assert tree_hash(st.path.parent) == before  # the applied step's outcomes file is never replaced
    other.update(2, step_rows(ids, 2))
    assert st.estimator().step_ == 2 and st.status()["step"] == 2
    assert json.loads((st.path / "CURRENT").read_text())["step"] == 2
    assert repr(st) == f"State({str(st.path)!r}, step 2)"


def test_retention_keeps_checkpoint_steps_and_can_change_after_init(tmp_path, inputs):
    """The last --keep steps and every multiple of --keep-every stay, so a trainer resuming from a checkpoint
    taken every C steps finds its step; changed at any time, it prunes by the new rule at once."""
    graph, clusters, ids = inputs
    st = State.init(graph, clusters, tmp_path / "S", device="cpu", keep=2, keep_every=3, durable=False)
    for t in range(1, 9):
        st.update(t, step_rows(ids, t))
    assert st.dir.retained_steps() == [0, 3, 6, 7, 8]
    status = st.status()
    assert (status["keep"], status["keep_every"]) == (2, 3) and status["disk_bytes"]["steps"] > 0
    st.rollback(3)  # the checkpoint the trainer resumed from, five steps back
    assert st.step == 3 and st.estimator().step_ == 3
    for t in range(4, 8):
        st.update(t, step_rows(ids, t, seed=1))
    res = st.retention(keep_every=0)
    assert res["pruned"] == [3] and res["previous"] == {"keep": 2, "keep_every": 3, "snapshot_every": 50}
    assert st.dir.retained_steps() == [0, 6, 7] and json.loads((st.path / "retention.json").read_text()) == \
        {"keep": 2, "keep_every": 0, "snapshot_every": 50}
    with pytest.raises(StateError, match="state of step 3 was pruned"):
        st.rollback(3)
    with pytest.raises(InvalidArgumentError, match="^keep must be an integer >= 2"):
        st.retention(keep=1)
    with pytest.raises(InvalidArgumentError, match="^keep_every must be an integer >= 0"):
        st.retention(keep_every=-5)
    assert json.loads((st.path / "retention.json").read_text())["keep_every"] == 0  # refusals change nothing


def test_retention_of_a_state_made_before_it_existed(tmp_path):
    """A STATE written by the previous release has no retention.json: its init --keep and every 50th step."""
    import shutil
    from pathlib import Path

    legacy = Path(__file__).parent / "data" / "legacy_79a4679" / "STATE"
    shutil.copytree(legacy, tmp_path / "S")
    st = State.open(tmp_path / "S")
    res = st.retention()
    assert res["keep_every"] == 50 and res["keep"] >= 2 and not (tmp_path / "S" / "retention.json").exists()


def test_a_damaged_retention_file_is_reported_and_never_stops_a_step(st, inputs):
    _, _, ids = inputs
    (st.path / "retention.json").write_text("{keep: five}")
    res = st.verify()
    assert not res["intact"] and any("damaged retention file" in p for p in res["problems"])
    assert st.update(1, step_rows(ids, 1))["step"] == 1  # pruning is housekeeping: the step still commits
    with pytest.raises(ArtifactError, match=r"damaged retention file.*State\.retention\(keep=N"):
        st.status()
    st.retention(keep=3, keep_every=10)  # rewriting it mends it
    assert st.verify()["intact"] and st.status()["keep"] == 3


def test_an_outcomes_file_replaced_while_it_is_read_is_applied_and_logged_as_the_bytes_parsed(st, tmp_path, inputs,
                                                                                              monkeypatch):
    """The documented way to replace a step file is a rename over it; one arriving mid-parse must not get the
    old rows logged under the new file's hash (the file is read once: what is parsed is what is hashed)."""
    import hashlib

    import graphdiff_cli.io.outcomes as outcomes_mod

    _, _, ids = inputs
    path = write_outcomes(tmp_path / "o1.jsonl", step_rows(ids, 1))
    old = path.read_bytes()
    newer = write_outcomes(tmp_path / "o1.new.jsonl", step_rows(ids, 1, seed=5))
    real = outcomes_mod.read_rows

    def read_rows_then_redeliver(*a, **k):
        for i, row in enumerate(real(*a, **k)):
            if i == 0:
                os.replace(newer, path)  # the trainer re-delivers step 1 while graphdiff parses it
            yield row

    monkeypatch.setattr(outcomes_mod, "read_rows", read_rows_then_redeliver)
    res = st.update(1, path)
    assert res["outcomes_hash"] == hashlib.sha256(old).hexdigest()[:16] != hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    assert res["rollouts"] == sum(r["n"] for r in step_rows(ids, 1))
    monkeypatch.undo()
    # the re-delivered file is now other outcomes for an applied step: refused, never silently skipped
    with pytest.raises(AlreadyAppliedError):
        st.update(1, path)


def test_the_same_outcomes_sent_as_the_next_step_are_applied_with_a_warning(st, tmp_path, inputs):
    _, _, ids = inputs
    path = write_outcomes(tmp_path / "o.jsonl", step_rows(ids, 1))
    assert st.update(1, path)["warnings"] == []
    res = st.update(2, path)
    assert res["step"] == 2 and len(res["warnings"]) == 1 and "the same outcomes as step 1 was applied from" in res["warnings"][0]


def test_retire_applies_the_ids_it_hashed(st, tmp_path, monkeypatch):
    import hashlib

    import graphdiff_cli.io.readers as readers

    ids_file = tmp_path / "gone.txt"
    ids_file.write_text("q001\nq002\n")
    old = ids_file.read_bytes()
    real = readers.read_id_file

    def read_then_redeliver(*a, **k):
        ids_file.write_text("q003\n")  # replaced after graphdiff read it, before it parses under the lock
        return real(*a, **k)

    monkeypatch.setattr(readers, "read_id_file", read_then_redeliver)
    res = st.retire(ids_file)
    assert res["ids_hash"] == hashlib.sha256(old).hexdigest()[:16] and res["prompts"] == 2
    assert set(st.estimates()["id"]) & {"q001", "q002"} == set() and "q003" in st.estimates()["id"]


def test_two_writers_of_one_step_never_replace_the_file_the_log_names(tmp_path, inputs):
    """Review finding: rows are written under a content-addressed name, so the loser of a race for step 1 (or
    a second STATE sharing the outcomes folder) cannot overwrite the winner's logged file."""
    import hashlib

    graph, clusters, ids = inputs
    a = State.init(graph, clusters, tmp_path / "S", device="cpu", durable=False)
    b = State.open(tmp_path / "S", device="cpu", durable=False)
    res = a.update(1, step_rows(ids, 1))
    with pytest.raises(AlreadyAppliedError):
        b.update(1, step_rows(ids, 1, seed=3))
    logged = Path(res["outcomes"])
    assert hashlib.sha256(logged.read_bytes()).hexdigest()[:16] == res["outcomes_hash"]
    assert b.update(1, step_rows(ids, 1))["noop"]  # the winner's rows again: a no-op for anyone
    assert len(list(logged.parent.iterdir())) == 1  # the refused and the re-sent rows were not kept
    State.init(graph, clusters, tmp_path / "T", device="cpu", durable=False)
    other = State.open(tmp_path / "T", device="cpu", durable=False, outcomes_dir=logged.parent)
    other.update(1, step_rows(ids, 1, seed=4))  # another STATE, the same folder
    assert hashlib.sha256(logged.read_bytes()).hexdigest()[:16] == res["outcomes_hash"]
    with pytest.raises(DataError, match="outcome rows hold numbers and strings"):
        a.update(2, [{"id": "q000", "n": np.array([8]), "s": 1}])


def test_rows_for_a_gap_are_refused_before_anything_is_written(st, inputs):
    _, _, ids = inputs
    with pytest.raises(StepGapError):
        st.update(3, step_rows(ids, 3))
    assert not st.outcomes_dir.exists() or not any(st.outcomes_dir.iterdir())


def test_the_repeat_warning_survives_a_retire_and_a_damaged_retention_file_warns(st, inputs):
    _, _, ids = inputs
    rows = step_rows(ids, 1)
    st.update(1, rows)
    st.retire(["q040"])
    assert any("the same outcomes as step 1" in w for w in st.update(2, rows)["warnings"])
    (st.path / "retention.json").write_text("{")
    assert any("damaged retention file" in w for w in st.update(3, step_rows(ids, 3))["warnings"])
    with pytest.raises(DataError, match="no ids given"):
        st.retire([])


def test_a_rollback_to_the_current_step_removes_nothing(st, inputs):
    _, _, ids = inputs
    for t in (1, 2, 3):
        st.update(t, step_rows(ids, t))
    assert st.rollback(1)["removed_versions"] == ["2", "3"]
    assert st.rollback(1)["removed_versions"] == []


def test_load_clusters_gives_the_estimators_labels_and_k(tmp_path):
    """The README's Estimator snippet: W from load_graph, labels and K from load_clusters (checked against the
    graph it was made from); the estimator built from them predicts what a STATE made from the same two does."""
    from _handoff_fixtures import make_inputs
    from graphdiff_cli import Estimator, load_clusters, load_graph

    graph, clusters, ids = make_inputs(tmp_path, n=40, k_states=4, prefix="p")
    w, gids = load_graph(graph)
    labels, k = load_clusters(clusters, graph=graph)
    assert k == 4 and labels.shape == (40,) and gids == ids and set(labels.tolist()) <= set(range(4))
    est = Estimator(w, labels, n_states=k, device="cpu")
    st = State.init(graph, clusters, tmp_path / "S", durable=False)
    # float64 to rounding (_tolerances.FLOAT64): the STATE's estimator is read back from disk and runs on its own
    # device ("auto": a GPU where there is one), so its sums may be ordered otherwise
    np.testing.assert_allclose(est.predict(), st.estimates(ids)["p"], **FLOAT64)
    other, _, _ = make_inputs(tmp_path / "other", n=40, k_states=4, prefix="p", seed=1)
    with pytest.raises(DataError, match="made from graph .*, not from .*; run graphdiff cluster on this graph"):
        load_clusters(clusters, graph=other)  # clusters not made from that graph


def test_status_reads_one_version_while_a_retire_commits_between_its_reads(st, inputs, monkeypatch):
    """status read CURRENT four times (its version, its path, the model, the artifact): a retire committed by
    another process between two of them gave a mixed report (revision 0 with the retire's retired count). It
    now reads CURRENT once and reports that version whole, whatever commits meanwhile."""
    from graphdiff_cli.io import state_dir

    _, _, ids = inputs
    st.update(1, step_rows(ids, 1))
    other = State.open(st.path, device="cpu", durable=False)
    reads, real = [], state_dir.read_pointer

    def read_pointer(root):  # another process's retire lands right after status's first read of CURRENT
        out = real(root)
        reads.append(out)
        if len(reads) == 1:
            other.retire(["q002", "q005"])
        return out

    monkeypatch.setattr(state_dir, "read_pointer", read_pointer)
    doc = st.status()
    monkeypatch.undo()
    assert (doc["step"], doc["revision"], doc["retired"], doc["current"]) == (1, 0, 0, "steps/00000001.zarr")
    assert doc["applied"][-1]["step"] == 1 and "revision" not in doc["applied"][-1]
    assert st.status()["revision"] == 1 and st.status()["retired"] == 2  # and the next status sees the retire


@pytest.mark.parametrize("reader, moment", [(r, m) for r in ("predict", "select", "allocate", "status", "verify")
                                             for m in ("after CURRENT", "after the log line")
                                             if (r, m) != ("verify", "after the log line")])  # it reads no one line
def test_a_reader_racing_a_rollback_says_what_the_rolled_back_state_says(tmp_path, inputs, monkeypatch, moment,
                                                                         reader):
    """A rollback from 5 to 3 committed by another process while a reader is between its read of CURRENT
    (step 5) and the step's folder or log line, which the rollback removes or cuts: the reader said "the log
    lists steps 0..3 ... damaged or edited" or "no such estimator-step artifact". It now reads again from the
    new CURRENT and says what a reader of the rolled-back STATE says; verify says intact."""
    from graphdiff_cli.io import state_dir

    graph, clusters, ids = inputs
    st = State.init(graph, clusters, tmp_path / "STATE", device="cpu", keep=10, durable=False)
    for t in range(1, 6):
        st.update(t, step_rows(ids, t))
    calls = {"predict": lambda s, out: s.predict(out) and Path(out).read_bytes(),
             "select": lambda s, out: s.select(ids[:12], 4)["ids"],
             "allocate": lambda s, out: s.allocate(ids[:12], 40)["counts_by_id"],
             "status": lambda s, out: {k: v for k, v in s.status().items() if k not in ("state", "disk_bytes")},
             "verify": lambda s, out: {k: v for k, v in s.verify().items() if k != "path"}}
    ref = tmp_path / "REF"
    import shutil

    shutil.copytree(st.path, ref)
    State.open(ref, durable=False).rollback(3)
    want = calls[reader](State.open(ref, device="cpu", durable=False), tmp_path / "want.jsonl")
    hit, real_pointer, real_entry = [], state_dir.read_pointer, state_dir.StateDir.log_entry

    def rollback_once():
        if not hit:
            hit.append(True)
            State.open(st.path, durable=False).rollback(3)  # another process, between two of the reader's reads

    def read_pointer(root):
        out = real_pointer(root)
        if moment == "after CURRENT" and Path(root) == st.path:
            rollback_once()
        return out

    def log_entry(self, version):
        out = real_entry(self, version)
        if moment == "after the log line":
            rollback_once()
        return out

    monkeypatch.setattr(state_dir, "read_pointer", read_pointer)
    monkeypatch.setattr(state_dir.StateDir, "log_entry", log_entry)
    reader_state = State.open(st.path, device="cpu", durable=False)
    got = calls[reader](reader_state, tmp_path / "got.jsonl")
    monkeypatch.undo()
    assert hit
    if reader == "status":
        got = {k: (v.replace(str(st.path), "S") if isinstance(v, str) else v) for k, v in got.items()}
        want = {k: (v.replace(str(ref), "S") if isinstance(v, str) else v) for k, v in want.items()}
    assert got == want
    assert State.open(st.path).status()["step"] == 3


def test_verify_racing_the_prune_after_a_commit_says_intact(tmp_path, inputs, monkeypatch):
    """An update renames CURRENT (step 4), then prunes step 2 (keep 2). A verify that started just after the
    rename listed step 2's folder and found it gone: "no such estimator-step artifact", with CURRENT unmoved
    during its check. verify now checks again when the STATE's folders changed under it."""
    import threading
    import time

    from graphdiff_cli.stages import verify as V

    graph, clusters, ids = inputs
    st = State.init(graph, clusters, tmp_path / "STATE", device="cpu", keep=2, keep_every=1000, durable=False)
    for t in (1, 2, 3):
        st.update(t, step_rows(ids, t))
    go = tmp_path / "go"
    monkeypatch.setenv("GRAPHDIFF_TEST_PAUSE_AFTER", "current")
    monkeypatch.setenv("GRAPHDIFF_TEST_PAUSE_FILE", str(go))
    writer = threading.Thread(target=lambda: State.open(st.path, device="cpu", durable=False).update(4, step_rows(ids, 4)))
    writer.start()
    while not Path(f"{go}.reached").exists():
        time.sleep(0.02)
    real, released = V.check_artifact, []

    def check_artifact(path, kind=None):  # the writer prunes while verify is at its first step folder
        if not released and "steps" in str(path):
            released.append(True)
            go.touch()
            writer.join()
        return real(path, kind)

    monkeypatch.setattr(V, "check_artifact", check_artifact)
    report = V.verify(st.path)
    assert released and report["intact"], report["problems"]
    assert "steps/00000002.zarr" not in report["checked"] and State.open(st.path).status()["step"] == 4
