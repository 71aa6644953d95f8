"""graphdiff's prime-rl task sampler (``integrations/prime_rl.py``).

prime-rl is not on PyPI and needs verifiers' v1 runtime, so these tests drive the sampler the way prime-rl does
on objects shaped exactly like its own, read from PrimeIntellect-ai/prime-rl@559b44772e471d1538537b8805cc77f3824a5e64
(src/prime_rl/orchestrator/curriculum/base.py ``Curriculum.on_result``: ``sampler.observe(group)`` for every
group, then the gates; samplers/base.py ``TaskSampler``; samplers/pool.py for the traces a sampler reads;
train_source.py ``TrainSource.curricula``/``next_task``) and PrimeIntellect-ai/verifiers@a60a606ecc4d309247edf9ff92c3eabca362781f
(verifiers/v1/task.py ``Task.key``/``Task.data``; episode.py ``Episode.task``/``traces``; trace.py
``Trace.reward``/``has_error``/``agent.trainable``).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from _handoff_fixtures import make_inputs

from graphdiff_cli import State
from graphdiff_cli.errors import DataError, InvalidArgumentError, StateError
from graphdiff_cli.integrations.prime_rl import GraphdiffTaskSampler, install

N, G, B = 48, 4, 6


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("prime-rl-inputs"), n=N)


@pytest.fixture
def state_path(inputs, tmp_path):
    graph, clusters, _ = inputs
    State.init(graph, clusters, tmp_path / "STATE", device="cpu", durable=False)
    return tmp_path / "STATE"


class Task:
    """verifiers.v1 Task: ``data`` (a model; a dict here) and ``key`` (its content hash unless overridden)."""

    def __init__(self, pid):
        self.data = {"prompt": f"question {pid}", "info": {"id": pid}}
        self.key = f"hash-of-{pid}"


def _group(task, rewards, errors=()):
    """A finalized group: one Episode per rollout, each with one trace of a trainable agent."""
    trace_task = SimpleNamespace(key=task.key)
    return [SimpleNamespace(task=trace_task, traces=[SimpleNamespace(reward=r, has_error=i in errors,
                                                                     agent=SimpleNamespace(trainable=True))])
            for i, r in enumerate(rewards)]


def _p(task) -> float:
    return (0.0, 0.35, 0.65, 1.0)[int(task.data["info"]["id"][1:]) % 4]


def _curriculum_on_result(sampler, gate, group):
    """prime-rl's Curriculum.on_result: observe first, then the gates (AND)."""
    sampler.observe(group)
    return gate(group)


def test_tasks_are_chosen_by_block_and_every_observed_group_reaches_the_state(inputs, state_path):
    ids = inputs[2]
    tasks = [Task(pid) for pid in ids]
    sampler = GraphdiffTaskSampler(tasks, {"state": str(state_path), "id_field": "info.id", "groups_per_step": B,
                                           "group_size": G, "explore": 0})
    assert sampler.ids == ids  # ids mapped from task.data.info.id, not from the hash key
    st = State.open(state_path, device="cpu")
    rng = np.random.default_rng(0)
    admitted = 0
    for step in (1, 2, 3):
        chosen = [next(sampler) for _ in range(B)]
        d = sampler.rows.chooser.decisions[-1]
        assert d.estimator_step == step - 1  # each block sees every step applied before it
        assert [tasks.index(t) for t in chosen] == d.chosen.tolist() and set(d.chosen) <= set(d.pool)
        for t in chosen:
            rewards = [float(rng.random() < _p(t)) for _ in range(G)]
            admitted += _curriculum_on_result(sampler, lambda g: len({e.traces[0].reward for e in g}) > 1,
                                              _group(t, rewards))
        assert st.step == step  # B groups in: one STATE step
        assert sampler.steps.applied[-1]["ids"] == [t.data["info"]["id"] for t in chosen]
        assert sampler.steps.applied[-1]["n"].tolist() == [G] * B
    assert admitted < 3 * B  # the gate dropped zero-variance groups; their outcomes were applied all the same
    m = sampler.metrics()
    assert m["step"] == 3 and m["groups"] == B and "mean_p" in m and not any(k.startswith("graphdiff/") for k in m)


def test_errored_traces_are_no_rollouts_and_bad_input_is_refused_in_one_line(inputs, state_path):
    tasks = [Task(pid) for pid in inputs[2]]
    sampler = GraphdiffTaskSampler(tasks, {"state": str(state_path), "id_field": "info.id", "groups_per_step": 2})
    sampler.observe(_group(tasks[0], [1.0, 0.0, 1.0], errors={2}))
    assert sampler.steps.rows == [(0, "q000", 1.0), (0, "q000", 0.0)]
    with pytest.raises(DataError, match=r"^prompt 'q001' got reward 0\.5, not 0 or 1; set the integration's "
                                        r"success_threshold"):
        sampler.observe(_group(tasks[1], [0.5, 1.0]))
    with pytest.raises(DataError, match="task key 'elsewhere', not a task of this taskset"):
        sampler.observe(_group(SimpleNamespace(key="elsewhere"), [1.0]))
    assert sampler.steps.groups == 1 and State.open(state_path).step == 0  # nothing refused was kept
    with pytest.raises(InvalidArgumentError, match="groups_per_step"):
        GraphdiffTaskSampler(tasks, {"state": str(state_path)})
    with pytest.raises(InvalidArgumentError, match="needs a finite taskset"):
        GraphdiffTaskSampler(iter(tasks), {"state": str(state_path), "groups_per_step": 2})
    with pytest.raises(DataError, match=r"taskset rows 0 and 1 share the id 'same'"):
        twins = [Task("q000"), Task("q001")]
        for t in twins:
            t.data["info"]["id"] = "same"
        GraphdiffTaskSampler(twins, {"state": str(state_path), "id_field": "info.id", "groups_per_step": 2})


def test_task_keys_are_the_default_ids_and_unknown_ones_are_refused(inputs, state_path):
    tasks = [Task(pid) for pid in inputs[2]]  # keys are hashes, not ids the STATE knows
    with pytest.raises(DataError, match=r"hash-of-q000"):
        GraphdiffTaskSampler(tasks, {"state": str(state_path), "groups_per_step": 2})
    for t in tasks:
        t.key = t.data["info"]["id"]  # a Task subclass whose key is the data set's durable id
    assert GraphdiffTaskSampler(tasks, {"state": str(state_path), "groups_per_step": 2}).ids == inputs[2]


def test_resume_keeps_pending_groups_and_the_block_and_refuses_a_state_at_another_step(inputs, state_path):
    tasks = [Task(pid) for pid in inputs[2]]
    opts = {"state": str(state_path), "id_field": "info.id", "groups_per_step": 4, "group_size": 2}
    a = GraphdiffTaskSampler(tasks, opts)
    first = [next(a) for _ in range(4)]
    for t in first:
        a.observe(_group(t, [1.0, 0.0]))
    nxt = [next(a) for _ in range(2)]
    a.observe(_group(nxt[0], [1.0, 1.0]))
    saved = json.loads(json.dumps(a.state_dict()))  # prime-rl checkpoints it with the orchestrator
    assert saved["graphdiff_step"] == 1 and saved["pending"] == [["q%03d" % tasks.index(nxt[0]), 1.0]] * 2
    b = GraphdiffTaskSampler(tasks, opts)
    b.load_state_dict(saved)
    assert [next(b) for _ in range(2)] == [next(a) for _ in range(2)]  # the rest of the same block
    for t in (nxt[1], *[next(b) for _ in range(2)]):
        b.observe(_group(t, [0.0, 1.0]))
    assert State.open(state_path).step == 2 and b.steps.applied[-1]["n"].sum() == 8  # the pending group counted
    with pytest.raises(StateError, match=r"STATE is at step 2 but prime-rl's checkpoint resumes after step 1.*"
                                         r"graphdiff rollback --to 1"):
        GraphdiffTaskSampler(tasks, opts).load_state_dict(saved)


def test_install_replaces_the_env_sampler_of_a_train_source(inputs, state_path):
    tasks = [Task(pid) for pid in inputs[2]]
    for t in tasks:
        t.key = t.data["info"]["id"]
    source = SimpleNamespace(curricula={"math": SimpleNamespace(sampler=SimpleNamespace(tasks=tuple(tasks)))})
    sampler = install(source, "math", state=str(state_path), groups_per_step=3)
    assert source.curricula["math"].sampler is sampler and next(sampler) in tasks
    with pytest.raises(InvalidArgumentError, match=r"no training env 'code' in the TrainSource \(envs: math\)"):
        install(source, "code", state=str(state_path), groups_per_step=3)
    with pytest.raises(InvalidArgumentError, match=r"^unknown graphdiff prime-rl option grups \(known: state, "):
        install(source, "math", state=str(state_path), grups=3)
