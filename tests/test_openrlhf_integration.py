"""OpenRLHF's reward-function path: examples/openrlhf/reward_func.py loaded as OpenRLHF 0.11 loads it
(``importlib`` from the file path, one copy per process), called once per rollout from three worker
processes at once, while this test plays OpenRLHF's samples generator: waves of B prompt groups of n
rollouts that pass dynamic filtering (strictly 0 < mean < 1; a filtered group replaced by the next
prompt), and a short last wave when the episode's prompts run out. OpenRLHF itself needs vLLM and a GPU.

Checked: one STATE step per wave, each with exactly that wave's groups (the filtered ones too), applied
by whichever process completed the wave; evaluation rows not recorded; an unknown id refused and the
refusal kept (OpenRLHF swallows exceptions); a crash between moving a wave out and applying it is
finished exactly once by the next call; rows of a wave's file or of a close that are not rollouts set
aside by file and line; a crashed run's rollouts never mixed into a resumed run's wave. Recorders that
stand for several processes of one run share a run id, as a Ray job's engines do.
"""

from __future__ import annotations

import json
import multiprocessing
import re
import zlib
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from _handoff_fixtures import make_inputs
from _openrlhf_worker import call as _call
from _openrlhf_worker import load_reward_func
from graphdiff_cli.errors import DataError, RewardWarning, StateError
from graphdiff_cli.integrations.openrlhf import StepRecorder, parse_label
from graphdiff_cli.io.state_dir import StateDir
from graphdiff_cli.state import State

B, N_SAMPLES, N_PROMPTS = 4, 4, 40


def _answer(pid: str, j: int, step: int) -> bool:
    """Whether rollout j of prompt pid is correct: a fixed per-prompt rate, so some groups are all-wrong
    or all-right (filtered) and most are mixed."""
    level = (zlib.crc32(pid.encode()) % 5) / 4  # 0, .25, .5, .75, 1
    return (zlib.crc32(f"{pid}|{j}|{step}".encode()) % 100) < 100 * level


@pytest.fixture()
def state(tmp_path):
    graph, clusters, ids = make_inputs(tmp_path, n=N_PROMPTS, k_states=4, prefix="p")
    State.init(graph, clusters, tmp_path / "STATE", device="cpu", durable=False)
    return tmp_path / "STATE", ids


def test_waves_from_several_processes_become_one_step_each(state):
    root, ids = state
    env = {"GRAPHDIFF_STATE": str(root), "GRAPHDIFF_BATCH_SIZE": str(B), "GRAPHDIFF_N_SAMPLES": str(N_SAMPLES),
           "GRAPHDIFF_FILTER_RANGE": "0,1", "GRAPHDIFF_EPISODE_PROMPTS": str(N_PROMPTS),
           "GRAPHDIFF_RUN_ID": "job-1"}  # in OpenRLHF the Ray job id, which every engine of a run shares
    order = [str(x) for x in np.random.default_rng(0).permutation(ids)]
    expected: list[dict[str, int]] = []  # per wave: prompt id -> successes
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(3, mp_context=spawn, initializer=load_reward_func, initargs=(env,)) as pool:
        eval_label = json.dumps({"id": ids[0], "answer": "yes", "eval": True})
        assert pool.submit(_call, "... yes", "q", eval_label).result() == 1.0  # evaluation: scored, not recorded
        step, cursor = 1, 0
        while cursor < len(order):  # one training step per wave, as OpenRLHF's generator does
            wave: dict[str, int] = {}
            passing, launch = 0, B
            while launch and cursor < len(order):
                # launch as many groups as are missing; their rollouts run at once, in any order, across
                # the processes; a filtered group is replaced only once it is complete (as in OpenRLHF)
                groups = order[cursor:cursor + launch]
                cursor += len(groups)
                hits = {pid: [_answer(pid, j, step) for j in range(N_SAMPLES)] for pid in groups}
                calls = [(f"answer {'yes' if h else 'no'}", "q", json.dumps({"id": pid, "answer": "yes"}))
                         for pid in groups for h in hits[pid]]
                calls = [calls[k] for k in np.random.default_rng([step, cursor]).permutation(len(calls))]
                rewards = list(pool.map(_call, *zip(*calls)))
                assert sum(rewards) == sum(sum(h) for h in hits.values())
                for pid in groups:
                    wave[pid] = sum(hits[pid])
                    passing += 0 < wave[pid] < N_SAMPLES
                launch = B - passing
            expected.append(wave)
            step += 1
    sd = StateDir.open(root)
    assert sd.current_step == len(expected) >= 3
    log = sd.log_entries()
    folder = root.parent / "STATE.openrlhf"
    for t, wave in enumerate(expected, start=1):
        [step_file] = folder.glob(f"step_{t:08d}-*.jsonl")  # one file per step, named by its content
        rows = [json.loads(x) for x in step_file.read_text().splitlines()]
        assert {r["id"]: (r["n"], r["s"]) for r in rows} == {pid: (N_SAMPLES, s) for pid, s in wave.items()}
        assert log[t]["rollouts"] == N_SAMPLES * len(wave) and log[t]["successes"] == sum(wave.values())
    assert any(not 0 < s < N_SAMPLES for w in expected for s in w.values())  # filtered groups were counted
    assert len(expected[-1]) < B or sum(0 < s < N_SAMPLES for s in expected[-1].values()) == B
    assert not (folder / "closing.json").exists()
    assert [p.name for p in folder.glob("pending-*")] == [f"pending-{len(expected) + 1:08d}.jsonl"]
    assert (folder / f"pending-{len(expected) + 1:08d}.jsonl").read_text() == ""
    assert not (folder / "ERROR").exists()


def test_an_unknown_id_is_refused_and_the_refusal_kept(state):
    root, ids = state
    rec = StepRecorder(root, batch_size=2, n_samples=2, durable=False)
    with pytest.raises(DataError, match="unknown prompt id 'nope'"):
        rec.record("nope", 1.0)
    error = root.parent / "STATE.openrlhf" / "ERROR"
    assert "unknown prompt id 'nope'" in error.read_text()
    with pytest.raises(StateError, match="stopped earlier: .*unknown prompt id 'nope'"):
        rec.record(ids[0], 1.0)  # OpenRLHF would swallow the first error: every later call fails too
    error.unlink()
    assert rec.record(ids[0], 1.0) is None
    rec._groups = lambda: (_ for _ in ()).throw(RuntimeError("something\n  unexpected"))
    with pytest.raises(RuntimeError):  # anything unexpected is kept too, in one line
        rec.record(ids[0], 1.0)
    assert error.read_text() == "RuntimeError: something unexpected\n"
    del rec._groups
    error.unlink()
    (root.parent / "STATE.openrlhf" / "pending-00000001.jsonl").write_text(
        json.dumps({"id": ids[0], "reward": 1.0, "score": 1.0}) + "\n")
    with pytest.raises(DataError, match="more than n_samples = 2"):
        for _ in range(2):
            rec.record(ids[0], 0.0)


@pytest.mark.parametrize("crash", ["closing written", "next wave written", "episode written", "applied"])
def test_a_crash_anywhere_in_a_close_leaves_the_wave_applied_once(state, monkeypatch, crash):
    import graphdiff_cli.integrations.openrlhf as O

    root, ids = state
    rec = StepRecorder(root, batch_size=1, n_samples=2, durable=False, run="job-1")
    rec.record(ids[3], 1.0)  # a rollout of a group that stays incomplete: it must survive the close
    rec.record(ids[1], 1.0)
    writes = {"closing written": 1, "next wave written": 2, "episode written": 3}
    real_write, real_apply, calls = O.atomic_write_text, rec.target.apply, []

    def write(path, text):
        real_write(path, text)
        calls.append(path)
        if len(calls) == writes.get(crash):
            raise KeyboardInterrupt  # the process dies right after this write

    def apply(*a, **k):
        real_apply(*a, **k)
        raise KeyboardInterrupt  # dies after the STATE moved, before the close is tidied up

    monkeypatch.setattr(O, "atomic_write_text", write)
    if crash == "applied":
        monkeypatch.setattr(rec.target, "apply", apply)
    with pytest.raises(KeyboardInterrupt):
        rec.record(ids[1], 0.0)  # completes ids[1]'s group: wave 1 closes
    monkeypatch.undo()
    folder = root.parent / "STATE.openrlhf"
    assert (folder / "closing.json").exists()
    fresh = StepRecorder(root, batch_size=1, n_samples=2, durable=False, run="job-1")  # another engine process
    assert fresh.record(ids[3], 0.0) == 2  # finishes wave 1, then ids[3]'s group (kept) completes wave 2
    sd = StateDir.open(root)
    log = sd.log_entries()
    assert sd.current_step == 2 and [(e["rollouts"], e["successes"]) for e in log[1:]] == [(2, 1), (2, 1)]
    [step_file] = folder.glob("step_00000001-*.jsonl")
    rows = [json.loads(x) for x in step_file.read_text().splitlines()]
    assert rows == [{"id": ids[1], "n": 2, "s": 1}]
    assert not (folder / "closing.json").exists() and not (folder / "ERROR").exists()


def test_an_append_cut_short_is_dropped_not_merged(state):
    root, ids = state
    rec = StepRecorder(root, batch_size=1, n_samples=2, durable=False, run="job-1")
    rec.record(ids[1], 1.0)
    path = root.parent / "STATE.openrlhf" / "pending-00000001.jsonl"
    with open(path, "a") as f:
        f.write('{"id": "' + ids[1] + '", "rew')  # a process killed mid-append
    other = StepRecorder(root, batch_size=1, n_samples=2, durable=False, run="job-1")  # another engine process
    assert other.record(ids[1], 0.0) == 1
    assert StateDir.open(root).log_entries()[1]["rollouts"] == 2


def test_a_crashed_runs_rollouts_are_set_aside_not_mixed_into_the_resumed_wave(state, capsys):
    """A run killed mid-wave leaves pending-<T>.jsonl; the resumed run (another run id: the Ray job, or
    GRAPHDIFF_RUN_ID) generates wave T afresh. Its first rollout sets the old file aside as stale-...; the
    wave is closed from the new run's rollouts only (the old ones neither counted nor "more than n")."""
    root, ids = state
    crashed = StepRecorder(root, batch_size=2, n_samples=2, durable=False, run="job-1")
    crashed.record(ids[0], 1.0)
    crashed.record(ids[0], 1.0)
    crashed.record(ids[1], 0.0)  # killed here: wave 1 half recorded
    folder = root.parent / "STATE.openrlhf"
    resumed = StepRecorder(root, batch_size=2, n_samples=2, durable=False, run="job-2")
    assert resumed.record(ids[0], 0.0) is None
    assert "begun by another run (job-1)" in capsys.readouterr().err
    stale = folder / "stale-job-1-pending-00000001.jsonl"
    assert [json.loads(x)["run"] for x in stale.read_text().splitlines()] == ["job-1"] * 3
    resumed.record(ids[0], 1.0)
    resumed.record(ids[1], 1.0)
    assert resumed.record(ids[1], 1.0) == 1
    entry = StateDir.open(root).log_entries()[1]
    assert entry["rollouts"] == 4  # the new run's four, none of the crashed run's three
    rows = {r["id"]: (r["n"], r["s"]) for r in map(json.loads, next(folder.glob("step_00000001-*.jsonl"))
                                                   .read_text().splitlines())}
    assert rows == {ids[0]: (2, 1), ids[1]: (2, 2)}


def test_labels_and_settings():
    assert parse_label('{"id": 17, "answer": "4"}') == ("17", {"id": 17, "answer": "4"})
    assert parse_label({"id": "a"})[0] == "a"
    with pytest.raises(DataError, match="holds no JSON object with an \"id\""):
        parse_label("42")
    with pytest.raises(DataError, match="duplicate key 'id' in a JSON object"):  # json.loads would take "p2"
        parse_label('{"id": "p1", "answer": "4", "id": "p2"}')
    with pytest.raises(Exception, match="set GRAPHDIFF_STATE, GRAPHDIFF_BATCH_SIZE, GRAPHDIFF_N_SAMPLES"):
        StepRecorder.from_env()


def test_a_reward_that_is_not_0_or_1_is_refused_at_once_without_a_threshold(state):
    """No GRAPHDIFF_SUCCESS_THRESHOLD: the first reward that is not 0/1 stops the recorder (before any wave
    closes on a silent threshold); with one, the same reward is recorded."""
    root, ids = state
    rec = StepRecorder(root, batch_size=2, n_samples=2, durable=False, run="job-1")
    rec.record(ids[0], 1.0)
    with pytest.raises(DataError, match=rf"^prompt '{ids[0]}' got reward 0.7, not 0 or 1; set "
                                        "GRAPHDIFF_SUCCESS_THRESHOLD"):
        rec.record(ids[0], 0.7)
    error = root.parent / "STATE.openrlhf" / "ERROR"
    assert "got reward 0.7, not 0 or 1" in error.read_text()
    error.unlink()
    rec = StepRecorder(root, batch_size=1, n_samples=2, success_threshold=0.5, durable=False, run="job-1")
    with pytest.warns(RewardWarning, match="all 2 rewards are at or above success_threshold 0.5"):
        assert rec.record(ids[0], 0.7) == 1  # the group (1.0, 0.7) completes the wave: step 1, 2 successes
    assert State.open(root).status()["step"] == 1


def _killed_after_writing_the_close(rec, pid):
    """``rec.record(pid, 1.0)`` completes a wave, and the process dies right after writing its closing.json."""
    real = rec._finish_closing
    rec._finish_closing = lambda: (_ for _ in ()).throw(KeyboardInterrupt) if (
        rec.folder / "closing.json").exists() else real()
    with pytest.raises(KeyboardInterrupt):
        rec.record(pid, 1.0)


def test_a_crashed_runs_close_is_set_aside_after_a_rollback_to_the_resumed_checkpoint(state, capsys):
    """A run killed mid-close of wave 3 leaves closing.json; its checkpoint of step 1 is resumed, and the STATE
    rolled back to 1 as the chooser's refusal says. The resumed run (another run id) used to stop for good on
    'another writer moved the STATE' (an ERROR file); the crashed run's close is now set aside as stale and the
    resumed run's waves 2 and 3 are applied from its own rollouts only."""
    root, ids = state
    crashed = StepRecorder(root, batch_size=1, n_samples=2, durable=False, run="job-1")
    for t in (1, 2):
        crashed.record(ids[t], 1.0)
        assert crashed.record(ids[t], 0.0) == t
    crashed.record(ids[3], 1.0)
    _killed_after_writing_the_close(crashed, ids[3])  # the close of wave 3
    folder = root.parent / "STATE.openrlhf"
    assert (folder / "closing.json").exists()
    State.open(root, durable=False).rollback(1)  # resumed from the checkpoint of step 1
    resumed = StepRecorder(root, batch_size=1, n_samples=2, durable=False, run="job-2")
    resumed.record(ids[5], 0.0)
    assert "close of wave 3 was begun by another run (job-1)" in capsys.readouterr().err
    assert resumed.record(ids[5], 1.0) == 2
    resumed.record(ids[6], 1.0)
    assert resumed.record(ids[6], 1.0) == 3
    log = StateDir.open(root).log_entries()
    assert [e["step"] for e in log] == [0, 1, 2, 3] and [(e["rollouts"], e["successes"]) for e in log[2:]] == [(2, 1), (2, 2)]
    assert (folder / "stale-job-1-closing-00000003.json").exists() and not (folder / "ERROR").exists()


def test_a_crashed_runs_close_is_never_applied_by_the_resumed_run(state, capsys):
    """bench/chaos.py's resume part (seed 0, trial 0): a run killed right after writing the close of wave 2 (the
    STATE still at 1, its checkpoint of step 1 the newest) is resumed from that checkpoint. The resumed run
    generates wave 2 afresh; applying the crashed run's close too made the log 1..4 for three waves (the resumed
    run's wave 2 became step 3). The crashed close is set aside even though the STATE is where it would apply."""
    root, ids = state
    crashed = StepRecorder(root, batch_size=1, n_samples=2, durable=False, run="job-1")
    crashed.record(ids[1], 1.0)
    assert crashed.record(ids[1], 0.0) == 1
    crashed.record(ids[2], 1.0)
    _killed_after_writing_the_close(crashed, ids[2])  # the close of wave 2
    assert State.open(root).step == 1
    resumed = StepRecorder(root, batch_size=1, n_samples=2, durable=False, run="job-2")
    resumed.record(ids[5], 0.0)
    assert "close of wave 2 was begun by another run (job-1)" in capsys.readouterr().err
    assert resumed.record(ids[5], 0.0) == 2
    resumed.record(ids[6], 1.0)
    assert resumed.record(ids[6], 1.0) == 3
    log = StateDir.open(root).log_entries()
    assert [e["step"] for e in log] == [0, 1, 2, 3]
    assert [(e["rollouts"], e["successes"]) for e in log[1:]] == [(2, 1), (2, 0), (2, 2)]
    assert (root.parent / "STATE.openrlhf" / "stale-job-1-closing-00000002.json").exists()


def test_the_episode_count_follows_the_state_through_a_rollback(state):
    """The recorder counts the episode's prompts to close its short last wave. After a resume from the
    checkpoint of step 1 (the STATE rolled back from 2), the count is the one at step 1, not the crashed run's:
    with 5 prompts an episode and waves of 2, the waves are 2, 2, 1 whether or not the run was resumed."""
    root, ids = state
    crashed = StepRecorder(root, batch_size=2, n_samples=1, durable=False, run="job-1", episode_prompts=5)
    for t, pids in ((1, ids[0:2]), (2, ids[2:4])):
        crashed.record(pids[0], 1.0)
        assert crashed.record(pids[1], 0.0) == t
    State.open(root, durable=False).rollback(1)  # the checkpoint of step 1 is resumed
    resumed = StepRecorder(root, batch_size=2, n_samples=1, durable=False, run="job-2", episode_prompts=5)
    assert resumed.record(ids[2], 1.0) is None  # with the crashed run's count (4) this closed a wave of one
    assert resumed.record(ids[3], 1.0) == 2
    assert resumed.record(ids[4], 0.0) == 3  # the episode's fifth prompt: the short last wave
    assert resumed.record(ids[5], 1.0) is None and resumed.record(ids[6], 1.0) == 4  # a new episode
    log = StateDir.open(root).log_entries()
    assert [e["rollouts"] for e in log[1:]] == [2, 2, 1, 2]


def test_a_crashed_close_that_already_moved_the_state_is_set_aside_and_its_wave_file_too(state, capsys):
    """The crashed run died after its close applied wave 2 as step 2, before tidying up (closing.json and
    pending-00000002.jsonl left). A resumed run (another id) never applies that close again; the step stays
    (the prompt chooser's resume check is what refuses it), its episode count is kept, its wave file is set
    aside, and the message says a resume from an earlier checkpoint must roll back."""
    root, ids = state
    crashed = StepRecorder(root, batch_size=1, n_samples=2, durable=False, run="job-1", episode_prompts=40)
    crashed.record(ids[1], 1.0)
    assert crashed.record(ids[1], 0.0) == 1
    crashed.record(ids[2], 1.0)
    real = crashed.target.apply

    def apply(*a, **k):
        real(*a, **k)
        raise KeyboardInterrupt  # died right after the STATE moved

    crashed.target.apply = apply
    with pytest.raises(KeyboardInterrupt):
        crashed.record(ids[2], 1.0)
    folder = root.parent / "STATE.openrlhf"
    assert State.open(root).step == 2 and (folder / "closing.json").exists()
    assert (folder / "pending-00000002.jsonl").exists()
    resumed = StepRecorder(root, batch_size=1, n_samples=2, durable=False, run="job-2", episode_prompts=40)
    resumed.record(ids[5], 0.0)
    err = capsys.readouterr().err
    assert "close of wave 2 was begun by another run (job-1)" in err and "had applied its wave as step 2" in err
    assert "GRAPHDIFF_RUN_ID, when set, must be new for each restart" in err
    assert not (folder / "pending-00000002.jsonl").exists() and (folder / "stale-job-1-pending-00000002.jsonl").exists()
    assert json.loads((folder / "episode.json").read_text())["by_step"] == {"1": 1, "2": 2}
    assert resumed.record(ids[5], 1.0) == 3
    assert [e["step"] for e in StateDir.open(root).log_entries()] == [0, 1, 2, 3]


def test_the_episode_file_keeps_only_the_steps_a_rollback_can_reach(state):
    root, ids = state
    # every step whole: no step is kept for a delta's sake (the counts follow the retained steps either way)
    State.open(root, durable=False).retention(keep=2, keep_every=4, snapshot_every=1)
    rec = StepRecorder(root, batch_size=1, n_samples=1, durable=False, run="job-1", episode_prompts=40)
    for t in range(1, 10):
        assert rec.record(ids[t], 1.0) == t
    counts = json.loads((root.parent / "STATE.openrlhf" / "episode.json").read_text())["by_step"]
    # written as wave 9 closed, when the STATE kept 0, 4, 7 and 8 (0: no count, a new episode): one count per
    # step a rollback can reach and the new one, not one per step of the run
    assert counts == {"4": 4, "7": 7, "8": 8, "9": 9}
    State.open(root, durable=False).rollback(4)
    assert rec._episode() == 4  # the count at the checkpoint's step


def test_bad_pending_rows_are_set_aside_named_by_file_and_line_never_closed(state, capsys):
    """Lines of a wave's file that are not rollouts this recorder writes (garbage, a list, no id, an id the STATE
    lacks, a reward that is not a finite 0/1 without a threshold, a score that is not a number, another run's
    row) used to stop the recorder with a bare JSONDecodeError, TypeError or KeyError, or to be copied into the
    close and fail it there for good. Each is now named by its file and line on stderr, once however many
    processes read it, kept in rejected-<T>.jsonl and left out of the wave and of the rollouts carried on."""
    root, ids = state
    folder = root.parent / "STATE.openrlhf"
    rec = StepRecorder(root, batch_size=1, n_samples=2, durable=False, run="job-1")
    rec.record(ids[0], 1.0)
    bad = ["not json", "[1, 2]", json.dumps({"reward": 1.0, "run": "job-1"}),
           json.dumps({"id": "nope", "reward": 1.0, "run": "job-1"}),
           json.dumps({"id": ids[0], "reward": "NaN-string", "score": 1.0, "run": "job-1"}),
           '{"id": "%s", "reward": NaN, "run": "job-1"}' % ids[0],
           json.dumps({"id": ids[0], "reward": 0.5, "run": "job-1"}),  # no threshold: 0 or 1 only
           json.dumps({"id": ids[0], "reward": 1.0, "score": "high", "run": "job-1"}),
           json.dumps({"id": [ids[0]], "reward": 1.0, "run": "job-1"}),
           json.dumps({"id": ids[0], "reward": 10 ** 400, "run": "job-1"}),  # no float holds it
           json.dumps({"id": ids[0], "reward": 1.0, "run": "job-0"})]  # another run's rollout
    with open(folder / "pending-00000001.jsonl", "a") as f:
        f.write("".join(line + "\n" for line in bad))
    other = StepRecorder(root, batch_size=1, n_samples=2, durable=False, run="job-1")  # another engine process
    assert other.record(ids[1], 1.0) is None
    err = capsys.readouterr().err
    assert [f"pending-00000001.jsonl line {k}:" in err for k in range(2, 2 + len(bad))] == [True] * len(bad)
    assert "'NaN-string'" in err and "unknown prompt id 'nope'" in err and "rejected-00000001.jsonl" in err
    assert rec.record(ids[0], 0.0) == 1  # ids[0]'s group is its two good rollouts: wave 1 closes
    assert "pending-00000001.jsonl line" not in capsys.readouterr().err  # said once, not again by each process
    rejected = [json.loads(x) for x in (folder / "rejected-00000001.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rejected] == bad and rejected[0]["where"] == "pending-00000001.jsonl line 2"
    [step_file] = folder.glob("step_00000001-*.jsonl")
    assert [json.loads(x) for x in step_file.read_text().splitlines()] == [{"id": ids[0], "n": 2, "s": 1}]
    carried = [json.loads(x) for x in (folder / "pending-00000002.jsonl").read_text().splitlines()]
    assert carried == [{"id": ids[1], "reward": 1.0, "score": 1.0, "run": "job-1"}]
    assert not (folder / "ERROR").exists()
    # what the recorder writes itself is held to the same rule: a reward that is not a finite number is refused
    thr = StepRecorder(root, batch_size=1, n_samples=2, durable=False, run="job-1", success_threshold=0.5)
    with pytest.raises(DataError, match=rf"^prompt '{ids[2]}' got reward nan, not a finite number"):
        thr.record(ids[2], float("nan"))


def test_a_close_holding_bad_rows_sets_them_aside_and_finishes(state, capsys):
    """A closing.json holding a row that is not a rollout (written by an older version, which copied the wave's
    file into it unchecked) failed its close with "ValueError: Unknown format code 'g'" at every later call,
    ERROR removed or not. The close now checks its rows, sets the bad ones aside (named, in rejected-<T>.jsonl)
    and finishes."""
    root, ids = state
    folder = root.parent / "STATE.openrlhf"
    rec = StepRecorder(root, batch_size=1, n_samples=2, durable=False, run="job-1")
    rec.record(ids[3], 1.0)  # its group stays incomplete: carried on in the close's "rest"
    rec.record(ids[1], 1.0)
    _killed_after_writing_the_close(rec, ids[1])  # the close of wave 1
    closing = folder / "closing.json"
    doc = json.loads(closing.read_text())
    doc["rows"][1]["reward"] = "NaN-string"
    doc["rest"] += ["garbage", {"id": ids[3], "reward": 1.0, "score": 1.0, "run": ["job-1"]}]
    closing.write_text(json.dumps(doc) + "\n")
    fresh = StepRecorder(root, batch_size=1, n_samples=2, durable=False, run="job-1")
    assert fresh.record(ids[3], 0.0) == 2  # finishes wave 1 without the bad rows; ids[3]'s group closes wave 2
    err = capsys.readouterr().err
    assert "closing.json rows[1]:" in err and "'NaN-string'" in err and "closing.json rest[1]:" in err
    assert "closing.json rest[2]:" in err
    log = StateDir.open(root).log_entries()
    assert [(e["rollouts"], e["successes"]) for e in log[1:]] == [(1, 1), (2, 1)]
    assert len((folder / "rejected-00000001.jsonl").read_text().splitlines()) == 3
    assert not closing.exists() and not (folder / "ERROR").exists()


@pytest.mark.parametrize("text", ["not json\n", "[]\n", '{"step": "one", "rows": [], "rest": [], "episode": 0}\n'])
def test_a_close_that_cannot_be_read_is_named_and_removing_it_is_enough(state, text):
    root, ids = state
    folder = root.parent / "STATE.openrlhf"
    rec = StepRecorder(root, batch_size=1, n_samples=2, durable=False, run="job-1")
    rec.record(ids[1], 1.0)
    closing = folder / "closing.json"
    closing.write_text(text)
    with pytest.raises(DataError, match=r"closing\.json is not a close .*: remove it to go on"):
        rec.record(ids[1], 0.0)
    error = folder / "ERROR"
    assert "remove it to go on" in error.read_text() and len(error.read_text().splitlines()) == 1
    assert State.open(root).step == 0
    closing.unlink()
    error.unlink()
    assert rec.record(ids[1], 0.0) == 1  # wave 1 closed again from its file
    assert [(e["rollouts"], e["successes"]) for e in StateDir.open(root).log_entries()[1:]] == [(2, 1)]


@pytest.mark.parametrize("left", ["half a wave", "a close"])
def test_a_resumed_run_without_a_run_id_refuses_rollouts_it_cannot_place(state, monkeypatch, left):
    """Outside Ray and without GRAPHDIFF_RUN_ID rollouts carry no run, so a resumed run cannot tell the crashed
    run's half wave (or its close) from its own: it used to take them in (the crashed run's prompt carried into
    its next step). Its first call now refuses in one line, naming the files and GRAPHDIFF_RUN_ID, with the STATE
    and the files unchanged; once they are cleared, the run goes on."""
    monkeypatch.delenv("GRAPHDIFF_RUN_ID", raising=False)
    root, ids = state
    folder = root.parent / "STATE.openrlhf"
    crashed = StepRecorder(root, batch_size=1, n_samples=2, durable=False)
    assert crashed.run is None
    crashed.record(ids[0], 1.0)
    if left == "a close":
        _killed_after_writing_the_close(crashed, ids[0])
    named = ["closing.json"] if left == "a close" else ["pending-00000001.jsonl"]
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "lock"}
    resumed = StepRecorder(root, batch_size=1, n_samples=2, durable=False)
    with pytest.raises(StateError, match="set GRAPHDIFF_RUN_ID") as exc:
        resumed.record(ids[5], 1.0)
    assert "\n" not in str(exc.value) and all(name in str(exc.value) for name in named)
    error = folder / "ERROR"
    assert error.read_text().strip() == str(exc.value)
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.name not in ("lock", "ERROR")} == before
    assert State.open(root).step == 0
    for name in named + ["ERROR"]:  # the user clears what the message names
        (folder / name).unlink()
    (folder / "pending-00000001.jsonl").unlink(missing_ok=True)
    assert resumed.record(ids[5], 1.0) is None and resumed.record(ids[5], 0.0) == 1
    [step_file] = folder.glob("step_00000001-*.jsonl")
    assert [json.loads(x) for x in step_file.read_text().splitlines()] == [{"id": ids[5], "n": 2, "s": 1}]
    assert (folder / "pending-00000002.jsonl").read_text() == ""


def test_a_damaged_episode_count_is_named_and_removing_it_is_enough(state):
    root, ids = state
    rec = StepRecorder(root, batch_size=1, n_samples=2, durable=False, run="job-1", episode_prompts=3)
    rec.record(ids[0], 1.0)
    assert rec.record(ids[0], 0.0) == 1
    episode = root.parent / "STATE.openrlhf" / "episode.json"
    episode.write_text('{"by_step": {"1": "one"')
    fresh = StepRecorder(root, batch_size=1, n_samples=2, durable=False, run="job-1", episode_prompts=3)
    with pytest.raises(DataError, match=rf"^{re.escape(str(episode))}: damaged episode count \(JSONDecodeError\); remove it"):
        fresh.record(ids[1], 1.0)
    (root.parent / "STATE.openrlhf" / "ERROR").unlink(missing_ok=True)
    episode.unlink()
    fresh = StepRecorder(root, batch_size=1, n_samples=2, durable=False, run="job-1", episode_prompts=3)
    assert fresh.record(ids[1], 0.0) == 2  # with the rollout recorded before the refusal: the wave is whole
