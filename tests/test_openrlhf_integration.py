"""OpenRLHF's reward-function path: examples/openrlhf/reward_func.py loaded as OpenRLHF 0.11 loads it
(``importlib`` from the file path, one copy per process), called once per rollout from three worker
processes at once, while this test plays OpenRLHF's samples generator: waves of B prompt groups of n
rollouts that pass dynamic filtering (strictly 0 < mean < 1; a filtered group replaced by the next
prompt), and a short last wave when the episode's prompts run out. OpenRLHF itself needs vLLM and a GPU.

Checked: one STATE step per wave, each with exactly that wave's groups (the filtered ones too), applied
by whichever process completed the wave; evaluation rows not recorded; an unknown id refused and the
refusal kept (OpenRLHF swallows exceptions); a crash between moving a wave out and applying it is
finished exactly once by the next call.
"""

from __future__ import annotations

import importlib.util
import json
import os
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from _handoff_fixtures import make_inputs
from graphdiff_cli.errors import DataError, StateError
from graphdiff_cli.integrations.openrlhf import StepRecorder, parse_label
from graphdiff_cli.io.state_dir import StateDir
from graphdiff_cli.stages.handoff import init_state

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "openrlhf" / "reward_func.py"
B, N_SAMPLES, N_PROMPTS = 4, 4, 40

_reward_func = None


def _load_reward_func(env: dict) -> None:
    """Pool initializer: what OpenRLHF's SingleTurnAgentExecutor does in each vLLM engine process."""
    global _reward_func
    os.environ.update(env)
    spec = importlib.util.spec_from_file_location("reward_func", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _reward_func = module.reward_func


def _call(query: str, prompt: str, label: str) -> float:
    out = _reward_func([query], [prompt], [label])
    return float(out["rewards"][0])


def _answer(pid: str, j: int, step: int) -> bool:
    """Whether rollout j of prompt pid is correct: a fixed per-prompt rate, so some groups are all-wrong
    or all-right (filtered) and most are mixed."""
    level = (zlib.crc32(pid.encode()) % 5) / 4  # 0, .25, .5, .75, 1
    return (zlib.crc32(f"{pid}|{j}|{step}".encode()) % 100) < 100 * level


@pytest.fixture()
def state(tmp_path):
    graph, clusters, ids = make_inputs(tmp_path, n=N_PROMPTS, k_states=4, prefix="p")
    init_state(graph, clusters, tmp_path / "STATE", device="cpu", durable=False)
    return tmp_path / "STATE", ids


def test_waves_from_several_processes_become_one_step_each(state):
    root, ids = state
    env = {"GRAPHDIFF_STATE": str(root), "GRAPHDIFF_BATCH_SIZE": str(B), "GRAPHDIFF_N_SAMPLES": str(N_SAMPLES),
           "GRAPHDIFF_FILTER_RANGE": "0,1", "GRAPHDIFF_EPISODE_PROMPTS": str(N_PROMPTS)}
    order = [str(x) for x in np.random.default_rng(0).permutation(ids)]
    expected: list[dict[str, int]] = []  # per wave: prompt id -> successes
    with ProcessPoolExecutor(3, initializer=_load_reward_func, initargs=(env,)) as pool:
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
        rows = [json.loads(x) for x in (folder / f"step_{t:08d}.jsonl").read_text().splitlines()]
        assert {r["id"]: (r["n"], r["s"]) for r in rows} == {pid: (N_SAMPLES, s) for pid, s in wave.items()}
        assert log[t]["rollouts"] == N_SAMPLES * len(wave) and log[t]["successes"] == sum(wave.values())
    assert any(not 0 < s < N_SAMPLES for w in expected for s in w.values())  # filtered groups were counted
    assert len(expected[-1]) < B or sum(0 < s < N_SAMPLES for s in expected[-1].values()) == B
    assert not (folder / "closing.json").exists() and (folder / "pending.jsonl").read_text() == ""
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
    with pytest.raises(DataError, match="more than n_samples = 2"):
        for _ in range(2):
            rec.record(ids[0], 0.0)


def test_a_crash_between_moving_and_applying_a_wave_is_finished_once(state, monkeypatch):
    root, ids = state
    rec = StepRecorder(root, batch_size=1, n_samples=2, durable=False)
    real_apply = rec.target.apply
    monkeypatch.setattr(rec.target, "apply", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    rec.record(ids[1], 1.0)
    with pytest.raises(KeyboardInterrupt):  # the process dies after closing.json, before the STATE moved
        rec.record(ids[1], 0.0)
    folder = root.parent / "STATE.openrlhf"
    assert (folder / "closing.json").exists() and StateDir.open(root).current_step == 0
    monkeypatch.setattr(rec.target, "apply", real_apply)
    fresh = StepRecorder(root, batch_size=1, n_samples=2, durable=False)  # e.g. another engine process
    assert fresh.record(ids[2], 1.0) is None  # finishes step 1 first, then records its own rollout
    sd = StateDir.open(root)
    assert sd.current_step == 1 and sd.log_entries()[1]["rollouts"] == 2 and sd.log_entries()[1]["successes"] == 1
    assert not (folder / "closing.json").exists()
    assert fresh.record(ids[2], 1.0) == 2  # ids[2]'s group completes step 2 (no filter: every group passes)


def test_labels_and_settings():
    assert parse_label('{"id": 17, "answer": "4"}') == ("17", {"id": 17, "answer": "4"})
    assert parse_label({"id": "a"})[0] == "a"
    with pytest.raises(DataError, match="holds no JSON object with an \"id\""):
        parse_label("42")
    with pytest.raises(Exception, match="set GRAPHDIFF_STATE, GRAPHDIFF_BATCH_SIZE, GRAPHDIFF_N_SAMPLES"):
        StepRecorder.from_env()
