"""graphdiff's choice reaching what OpenRLHF generates (``PromptChooser`` in place of the prompt loader),
with dynamic filtering on, while the example reward function records every generated group.

The trainer side is OpenRLHF 0.11's own ``SamplesGenerator`` (wave of ``rollout.batch_size`` prompts, one
replacement per filtered group) and ``PromptDataset``: the real source files when ``GRAPHDIFF_OPENRLHF_SRC``
names an unpacked 0.11.x wheel's ``openrlhf`` folder or OpenRLHF is importable, else a reduced copy
(tests/_openrlhf_shapes.py). The engine is played in-process: each request's n rollouts go through
examples/openrlhf/reward_func.py loaded as OpenRLHF loads it. ``PPOTrainer.fit``'s loop is reduced to what
touches the loader (generate_samples until exhausted, ``state_dict`` after each step).
"""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
import sys
import zlib
from types import SimpleNamespace

import numpy as np
import pytest

from _handoff_fixtures import make_inputs
from _openrlhf_shapes import Ref, openrlhf_classes
from _openrlhf_worker import EXAMPLE
from graphdiff_cli.errors import DataError, InvalidArgumentError, StateError
from graphdiff_cli.integrations import openrlhf as orl
from graphdiff_cli.integrations.dynamic_sampling import CandidateDraw
from graphdiff_cli.integrations.tracking import StateTarget
from graphdiff_cli.state import State

B, N, N_PROMPTS = 4, 4, 40


def _kind(pid: str) -> int:
    return int(pid[1:]) % 4  # 0: always solved, 1: never solved (both filtered), 2 and 3: half (the topics of make_inputs)


def _correct(pid: str, j: int, salt: int) -> bool:
    k = _kind(pid)
    return k == 0 or (k >= 2 and zlib.crc32(f"{pid}|{j}|{salt}".encode()) % 2 == 0)


class _Engine:
    """One vLLM engine as SamplesGenerator calls it; each request's rollouts scored by the example file."""

    def __init__(self, reward_func, state):
        self.reward_func, self.state, self.requests = reward_func, state, []

    @property
    def get_num_unfinished_requests(self):
        return SimpleNamespace(remote=lambda: Ref(0))

    @property
    def generate_responses(self):
        return SimpleNamespace(remote=self._generate)

    def _generate(self, prompt, label, num_samples, **_):
        pid = json.loads(label)["id"]
        self.requests.append((State.open(self.state).step, pid))  # the STATE step when it was generated
        out = []
        for j in range(num_samples):
            text = f"answer {'yes' if _correct(pid, j, len(self.requests)) else 'no'}"
            r = float(self.reward_func([text], [prompt], [label])["rewards"][0])
            out.append({"observation_tokens": [1, 2, 3], "action_ranges": [(1, 3)], "reward": r, "scores": r,
                        "rollout_log_probs": None, "prompt": prompt, "label": label, "extra_logs": {}})
        return Ref(out)


def _args(filtering=True, **train):
    return SimpleNamespace(
        rollout=SimpleNamespace(batch_size=B, n_samples_per_prompt=N, vllm_generate_batch_size=B),
        algo=SimpleNamespace(dynamic_filtering_enable=filtering, dynamic_filtering_range=(0.0, 1.0),
                             advantage=SimpleNamespace(is_correction_level="off")),
        vllm=SimpleNamespace(enable_sleep=False), train=SimpleNamespace(async_enable=False, agent_func_path=None, **train),
        data=SimpleNamespace(input_key="prompt", label_key="label", apply_chat_template=False, image_key="images"))


def _engine(state) -> _Engine:
    """The example reward function loaded as OpenRLHF's engine loads it (its recorder reads the environment)."""
    spec = importlib.util.spec_from_file_location("reward_func", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return _Engine(module.reward_func, state)


@pytest.fixture()
def run(tmp_path, monkeypatch):
    graph, clusters, ids = make_inputs(tmp_path, n=N_PROMPTS, k_states=4, prefix="p")
    State.init(graph, clusters, tmp_path / "STATE", device="cpu", durable=False)
    env = {"GRAPHDIFF_STATE": str(tmp_path / "STATE"), "GRAPHDIFF_BATCH_SIZE": str(B), "GRAPHDIFF_N_SAMPLES": str(N),
           "GRAPHDIFF_FILTER_RANGE": "0,1", "GRAPHDIFF_EPISODE_PROMPTS": str(N_PROMPTS)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rng = random.Random(0)
    generator_cls, dataset_cls, where = openrlhf_classes(monkeypatch, rng)
    print("trainer side:", where)
    rows = [{"prompt": f"question {pid}?", "label": json.dumps({"id": pid, "answer": "yes"})} for pid in ids]
    args = _args()
    strategy = SimpleNamespace(args=args, is_rank_0=lambda: True, print=lambda *a: None)
    dataset = dataset_cls(rows, None, strategy)
    engine = _engine(tmp_path / "STATE")
    return SimpleNamespace(root=tmp_path / "STATE", ids=ids, args=args, strategy=strategy, dataset=dataset,
                           engine=engine, generator_cls=generator_cls)


def _fit(run, loader, episodes=1, max_steps=None):
    """PPOTrainer.fit's loop, reduced to what touches the prompt loader; returns the trained prompt ids per step."""
    gen = run.generator_cls(run.strategy, loader, None, None, [run.engine])
    trained, states = [], []
    for _ in range(episodes):
        while True:
            samples, _, _, exhausted = gen.generate_samples(max_len=64)
            if samples:
                trained.append([json.loads(s.labels[0])["id"] for s in samples])
                states.append(loader.state_dict())
                if max_steps and len(trained) == max_steps:
                    return trained, states
            if exhausted:
                break
    return trained, states


def test_the_next_wave_generates_graphdiffs_choice_and_every_rollout_is_applied(run):
    loader = orl.PromptChooser.from_trainer(run.dataset, run.args)
    trained, _ = _fit(run, loader, episodes=2)
    requests = run.engine.requests
    # what the engine generated is, in order, what the chooser drew: wave by wave, refills included
    assert [pid for _, pid in requests] == [pid for d in loader.dispatches for pid in d["ids"]]
    # each wave's first draw is the pre-filter's draw on the STATE after the previous wave (not a shuffle)
    firsts = [d for d in loader.dispatches if d["number"] == 0]
    assert len(firsts) == len(trained) >= 10
    last = firsts[-2]  # the last full wave, recomputed on a copy of the STATE rolled back to its step
    shutil.copytree(run.root, run.root.parent / "COPY")
    State.open(run.root.parent / "COPY").rollback(last["step"])
    check = StateTarget(run.root.parent / "COPY")
    expect = CandidateDraw(check, check.nodes(loader.row_ids), B, N, "prefilter").draw([0, last["step"], 0])
    assert [loader.row_ids[r] for r in expect.chosen] == last["ids"] and last["step"] > 5
    # every dispatch was made on the STATE of its wave: step t while wave t + 1 was generated
    assert [s for s, _ in requests] == [d["step"] for d in loader.dispatches for _ in d["ids"]]
    # one STATE step per wave, counting every generated rollout (filtered groups too)
    st = State.open(run.root)
    assert st.step == len(trained)
    log = [json.loads(x) for x in (run.root / "log.jsonl").read_text().splitlines()]
    assert sum(e.get("rollouts", 0) for e in log) == N * len(requests)
    assert any(_kind(pid) in (0, 1) for _, pid in requests)  # filtered groups were generated and counted
    # the trainer trained on B groups with signal each full wave (dynamic filtering kept its promise)
    assert all(_kind(pid) >= 2 for step in trained for pid in step)
    # each episode handed out exactly the data set's count of prompts
    assert len(requests) == 2 * N_PROMPTS
    # learning from what it generated: in the second episode the pre-filter skips prompts it saw all-equal,
    # so fewer zero-variance prompts are generated than the half that OpenRLHF's shuffle generates per episode
    second = [pid for _, pid in requests[N_PROMPTS:]]
    assert sum(_kind(pid) in (0, 1) for pid in second) / len(second) < 0.3
    assert sum(len(d["skipped"]) for d in loader.dispatches) > 0


def test_without_filtering_each_wave_is_the_strategys_choice_and_resume_keeps_the_position(run, monkeypatch):
    monkeypatch.delenv("GRAPHDIFF_FILTER_RANGE")
    args = _args(filtering=False)
    run.strategy.args, run.engine = args, _engine(run.root)
    loader = orl.PromptChooser.from_trainer(run.dataset, args, choose="target")
    trained, states = _fit(run, loader, max_steps=3)
    assert [len(t) for t in trained] == [B * N] * 3 and len(run.engine.requests) == 3 * B
    shutil.copytree(run.root, run.root.parent / "COPY")
    State.open(run.root.parent / "COPY").rollback(2)  # the STATE the third wave was chosen on
    check = StateTarget(run.root.parent / "COPY")
    chooser = orl.BatchChooser(check, check.nodes(loader.row_ids), B, "target", 4.0, 0, 0.5, N)
    assert [loader.row_ids[r] for r in chooser.choose(check.step, 0)] == loader.dispatches[-1]["ids"]
    assert states[-1] == {"graphdiff_prompt_chooser": {"position": 3 * B, "prompts": N_PROMPTS, "state_step": 3}}
    # a checkpoint of an earlier step while the STATE went on (restored without a rollback): refused
    early = {"graphdiff_prompt_chooser": {**states[-1]["graphdiff_prompt_chooser"], "state_step": 2}}
    with pytest.raises(StateError, match=r"STATE is at step 3 but OpenRLHF's checkpoint resumes after step 2: "
                                         r"its steps 3..3 would count twice; roll the STATE back \(graphdiff "
                                         r"rollback --to 2\)"):
        orl.PromptChooser.from_trainer(run.dataset, args, choose="target").load_state_dict(early)
    # a resumed trainer (fresh process, loader state from its checkpoint) hands out the rest of the episode
    resumed = orl.PromptChooser.from_trainer(run.dataset, args, choose="target")
    resumed.load_state_dict(states[-1])
    more, _ = _fit(run, resumed)
    assert len(more) == (N_PROMPTS - 3 * B) // B and len(run.engine.requests) == N_PROMPTS
    assert State.open(run.root).step == 3 + len(more)
    with pytest.raises(StateError, match="not written by graphdiff's prompt chooser"):
        resumed.load_state_dict({"_iterator_finished": False})


def test_a_stopped_recorder_stops_the_trainer_too(run):
    loader = orl.PromptChooser.from_trainer(run.dataset, run.args)
    folder = run.root.parent / "STATE.openrlhf"
    (folder / "ERROR").write_text("DataError: unknown prompt id 'x'\n")
    with pytest.raises(StateError, match="recorder stopped: DataError: unknown prompt id 'x'"):
        next(iter(loader))


@pytest.mark.parametrize("change, message", [
    (lambda a, e: setattr(a.train, "async_enable", True), "synchronous trainer only"),
    (lambda a, e: setattr(a.train, "agent_func_path", "agent.py"), "agent_func_path"),
    (lambda a, e: setattr(a.rollout, "batch_size", 8), "GRAPHDIFF_BATCH_SIZE=4 but the trainer's value is 8"),
    (lambda a, e: setattr(a.algo, "dynamic_filtering_range", (0.1, 0.9)), "GRAPHDIFF_FILTER_RANGE=0.1,0.9"),
    (lambda a, e: e.setenv("GRAPHDIFF_EPISODE_PROMPTS", "41"), "GRAPHDIFF_EPISODE_PROMPTS=41 but .* 40"),
    (lambda a, e: e.delenv("GRAPHDIFF_EPISODE_PROMPTS"), "set GRAPHDIFF_EPISODE_PROMPTS=40"),
    (lambda a, e: e.setenv("GRAPHDIFF_CHOOSE", "target"), "not one of prefilter, uniform .with dynamic"),
    (lambda a, e: setattr(a.algo, "dynamic_filtering_enable", False), "FILTER_RANGE is set but"),
])
def test_settings_that_disagree_with_the_trainer_are_refused_in_one_line(run, monkeypatch, change, message):
    change(run.args, monkeypatch)
    with pytest.raises(InvalidArgumentError, match=message) as err:
        orl.PromptChooser.from_trainer(run.dataset, run.args)
    assert "\n" not in str(err.value)


def test_data_set_rows_without_a_usable_id_are_refused(run):
    run.dataset.labels[1] = run.dataset.labels[0]
    with pytest.raises(DataError, match="on several rows"):
        orl.PromptChooser.from_trainer(run.dataset, run.args)
    run.dataset.labels[1] = json.dumps({"id": run.ids[1], "eval": True})
    with pytest.raises(DataError, match="marked \"eval\""):
        orl.PromptChooser.from_trainer(run.dataset, run.args)


def test_install_replaces_prepare_datasets_when_the_trainer_module_is_imported(run, tmp_path, monkeypatch):
    """The Ray worker_process_setup_hook path: install() before the import, then OpenRLHF's PPOTrainer.__init__
    calling ``prepare_datasets(strategy, tokenizer)`` gets a PromptChooser (a stand-in trainer module here)."""
    pkg = tmp_path / "fake" / "openrlhf" / "trainer"
    pkg.mkdir(parents=True)
    for d in (pkg.parent, pkg):
        (d / "__init__.py").write_text("")
    (pkg / "ppo_trainer.py").write_text(
        "from types import SimpleNamespace\n"
        "DATASET = None\n"
        "def prepare_datasets(strategy, tokenizer):\n"
        "    return SimpleNamespace(dataset=DATASET), None, 123\n")
    for name in [m for m in sys.modules if m == "openrlhf" or m.startswith("openrlhf.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path / "fake"))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(orl, "_ORIGINAL", {})
    orl.install()
    orl.install()  # idempotent
    import openrlhf.trainer.ppo_trainer as m

    assert m.prepare_datasets is orl.graphdiff_prepare_datasets
    m.DATASET = run.dataset
    loader, eval_loader, max_steps = m.prepare_datasets(run.strategy, None)
    assert isinstance(loader, orl.PromptChooser) and (eval_loader, max_steps) == (None, 123)
    assert len(loader) == N_PROMPTS
