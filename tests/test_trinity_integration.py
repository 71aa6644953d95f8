"""graphdiff's Trinity-RFT task selector (``integrations/trinity.py``).

The first part runs everywhere (CI has no Trinity): the selector on Trinity-shaped objects (a data source
with ``.dataset``, a ``DataSelectorConfig``-shaped config, experiences with ``eid.batch``, ``reward`` and
``info["task_index"]``) against a real STATE directory. The second part needs trinity-rft 0.6 (checked with
0.6.0 in a side environment: the wheel with ``--no-deps`` plus omegaconf and ray; its selector, operator,
reader, task scheduler and experience modules import there) and drives graphdiff through Trinity's real
registries, ``TaskFileReader``, ``TasksetScheduler``, ``create_operators`` and ``Experience``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from _handoff_fixtures import make_inputs

from graphdiff_cli import State
from graphdiff_cli.core import decisions as dec
from graphdiff_cli.errors import DataError, InvalidArgumentError, StateError
from graphdiff_cli.integrations.ids import trainer_ids
from graphdiff_cli.integrations.trinity import (OPERATOR_PATH, SELECTOR_PATH, GraphdiffSelector, collect_outcomes,
                                                taskset_ids)

N = 48


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("trinity-inputs"), n=N)


@pytest.fixture
def state_path(inputs, tmp_path):
    graph, clusters, _ = inputs
    State.init(graph, clusters, tmp_path / "STATE", device="cpu", durable=False)
    return tmp_path / "STATE"


def _rows(ids):
    return [{"id": pid, "question": f"question {pid}", "answer": "1"} for pid in ids]


def _config(state, **kwargs):
    return SimpleNamespace(selector_type=SELECTOR_PATH, seed=7, feature_keys=[],
                           kwargs={"state": str(state), "group_size": 4, **kwargs})


def _true_p(pid: str) -> float:
    return (0.0, 0.35, 0.65, 1.0)[int(pid[1:]) % 4]  # the fixture's four topics, two of them all-equal


def _experiences(selector, indices, step, taskset_id=0, n=4, seed=0):
    rng = np.random.default_rng([seed, step])
    return [SimpleNamespace(eid=SimpleNamespace(batch=step), info={"task_index": {"taskset_id": taskset_id,
                                                                                  "index": r}},
                            reward=float(rng.random() < _true_p(selector.row_ids[r])))
            for r in indices for _ in range(n)]


def _selector(state, ids, **kwargs):
    return GraphdiffSelector(SimpleNamespace(dataset=_rows(ids), dataset_size=len(ids)), _config(state, **kwargs))


# ------------------------------------------------------------------------------------- Trinity-shaped


def test_each_read_is_graphdiffs_choice_and_each_step_one_state_step(inputs, state_path):
    ids = inputs[2]
    sel = _selector(state_path, ids[::-1], strategy="target", explore=0)  # row r holds id ids[N - 1 - r]
    sel.load_state_dict({"current_index": 0})  # what Trinity's TasksetScheduler passes on a fresh run
    st = State.open(state_path, device="cpu")
    generated = 0
    for step in (1, 2, 3):
        indices = sel.get_indices(8)
        d = sel.decisions[-1]
        assert len(indices) == 8 == len(set(indices)) and set(indices) <= set(d.pool.tolist())
        # target rule with no exploration: the 8 of the pool whose mean is closest to 0.5, at the STATE's step
        est = st.estimates([sel.row_ids[r] for r in d.pool])
        dist = np.abs(est["mean"] - 0.5)
        assert d.estimator_step == step - 1
        assert np.sort(dist[np.isin(d.pool, indices)]).max() <= np.sort(dist)[7] + 1e-12
        exps = _experiences(sel, indices, step)
        generated += len(exps)
        metric = collect_outcomes(exps)
        assert list(metric) == [0] and metric[0]["step"] == step and metric[0]["indices"] == indices
        sel.feedback(**metric[0])  # how TasksetScheduler.feedback calls it
        assert st.step == step
        assert sel.applied[-1]["ids"] == [sel.row_ids[r] for r in indices]
    assert sum(int(a["n"].sum()) for a in sel.applied) == generated == 3 * 8 * 4
    assert st.estimates(ids)["n_seen"].sum() >= generated  # every rollout reached the STATE
    assert sel.state_dict() == {"current_index": 3, "graphdiff_step": 3, "graphdiff_reads": 3}
    # a second read with no outcome in between draws a new pool (seeded by the read number)
    a, b = sel.get_indices(8), sel.get_indices(8)
    assert not np.array_equal(sel.decisions[-1].pool, sel.decisions[-2].pool) and a != b


def test_steps_without_feedback_are_empty_state_steps_and_a_step_twice_is_refused(inputs, state_path):
    sel = _selector(state_path, inputs[2])
    idx = sel.get_indices(4)
    sel.feedback(**collect_outcomes(_experiences(sel, idx, 1))[0])
    sel.feedback(**collect_outcomes(_experiences(sel, idx, 3))[0])  # explorer step 2 finished no task
    assert State.open(state_path).step == 3
    assert [a["step"] for a in sel.applied] == [1, 2, 3] and sel.applied[1]["n"].size == 0
    with pytest.raises(StateError, match=r"explorer step 3 but the STATE is already at step 3.*--to 2"):
        sel.feedback(**collect_outcomes(_experiences(sel, idx, 3))[0])
    assert State.open(state_path).step == 3


def test_resume_checks_the_state_against_the_checkpoint(inputs, state_path):
    ids = inputs[2]
    sel = _selector(state_path, ids)
    for step in (1, 2):
        sel.feedback(**collect_outcomes(_experiences(sel, sel.get_indices(6), step))[0])
    saved = json.loads(json.dumps(sel.state_dict()))  # Trinity writes it into explorer_meta.json
    sel.feedback(**collect_outcomes(_experiences(sel, sel.get_indices(6), 3))[0])  # a step after the checkpoint
    again = _selector(state_path, ids)
    with pytest.raises(StateError, match=rf"STATE is at step 3 but Trinity resumes .* at step 2: graphdiff rollback "
                                         rf"--state {state_path} --to 2"):
        again.load_state_dict(saved)
    State.open(state_path).rollback(2)
    again.load_state_dict(saved)
    assert again.reads == 2
    again.feedback(**collect_outcomes(_experiences(again, again.get_indices(6), 3))[0])
    assert State.open(state_path).step == 3
    fresh = _selector(state_path, ids)
    with pytest.raises(StateError, match="STATE is at step 3 but Trinity starts at step 0"):
        fresh.load_state_dict({"current_index": 0})
    with pytest.raises(StateError, match="not written by graphdiff's selector"):
        fresh.load_state_dict({"current_index": 64})  # a checkpoint of another selector


def test_pass_rate_calculator_feedback_and_its_limits(inputs, state_path):
    sel = _selector(state_path, inputs[2])
    idx = sel.get_indices(3)
    sel.feedback(indices=idx, values=[0.0, 0.5, 1.0])  # pass_rate_calculator's fields, group_size 4
    a = sel.applied[-1]
    assert a["step"] == 1 and a["n"].tolist() == [4, 4, 4] and a["s"].tolist() == [0, 2, 4]
    with pytest.raises(DataError, match=r"mean reward 0.7 over group_size 4 rollouts.*graphdiff_outcomes"):
        sel.feedback(indices=idx[:1], values=[0.7])
    with pytest.raises(DataError, match="not a row of this taskset's 48"):
        sel.feedback(indices=[N], values=[1.0])
    thr = _selector(state_path, inputs[2], success_threshold=0.5)
    with pytest.raises(InvalidArgumentError, match="success_threshold needs each rollout's reward"):
        thr.feedback(indices=idx, values=[0.0, 0.5, 1.0])
    assert State.open(state_path).step == 1


def test_rewards_that_are_not_0_1_need_a_threshold(inputs, state_path):
    sel = _selector(state_path, inputs[2])
    idx = sel.get_indices(2)
    with pytest.raises(DataError, match=r"got reward 0.7, not 0 or 1; set the integration's success_threshold"):
        sel.feedback(indices=idx, values=[0.7, 0.7], rewards=[[0.7, 0.7], [0.7, 0.7]], step=1)
    thr = _selector(state_path, inputs[2], success_threshold=0.6)
    thr.feedback(indices=idx, values=[0.5, 0.5], rewards=[[0.7, 0.3], [0.2, 0.9]], step=1)
    assert thr.applied[-1]["s"].tolist() == [1, 1] and State.open(state_path).step == 1


def test_prefilter_skips_what_the_state_predicts_all_equal(inputs, state_path):
    ids = inputs[2]
    st = State.open(state_path, device="cpu")
    for step in range(1, 6):  # topics 0 and 3 always all-wrong / all-right
        st.update(step, [{"id": pid, "n": 4, "s": int(4 * _true_p(pid))} for pid in ids])
    pzv = st.estimates(ids, group_size=4)["p_zero_variance"]
    easy = {r for r, pid in enumerate(ids) if _true_p(pid) in (0.0, 1.0)}
    assert pzv[sorted(easy)].min() > pzv[[r for r in range(N) if r not in easy]].max()
    sel = _selector(state_path, ids, prefilter=True, prefilter_min_keep=0.0, strategy="uniform", pool_factor=4)
    sel.load_state_dict({"current_index": 0, "graphdiff_step": 5, "graphdiff_reads": 0})
    off = _selector(state_path, ids, strategy="uniform", pool_factor=4)
    on_hits = off_hits = 0
    for _ in range(5):
        on_hits += len(easy & set(sel.get_indices(6)))
        off_hits += len(easy & set(off.get_indices(6)))
        skipped = sel.decisions[-1].extra["skipped"]
        assert not set(skipped.tolist()) & set(sel.decisions[-1].chosen.tolist())
    assert on_hits < off_hits


def test_options_and_ids_refused_in_one_line(inputs, state_path):
    ids = inputs[2]
    ds = SimpleNamespace(dataset=_rows(ids))
    cases = [
        (SimpleNamespace(seed=0, feature_keys=[], kwargs={"state": str(state_path)}), "set data_selector.kwargs.group_size"),
        (_config(state_path, pool=4), "unknown data_selector.kwargs for graphdiff: pool"),
        (SimpleNamespace(seed=0, feature_keys=["a", "b"], kwargs={}), "feature_keys belongs to Trinity's difficulty_based"),
        (_config(state_path, strategy="hardest"), "selection"),
        (_config(state_path, prefilter="maybe"), "prefilter must be true or false"),
    ]
    for config, message in cases:
        with pytest.raises(InvalidArgumentError, match=message) as info:
            GraphdiffSelector(ds, config)
        assert "\n" not in str(info.value)
    for rows, message in [(_rows(ids[:3]) + [{"question": "x"}], "taskset row 3 has no 'id'"),
                          (_rows([ids[0], ids[1], ids[0]]), "taskset rows 0 and 2 share the id"),
                          (_rows(ids[:3] + ["nope"]), "nope")]:
        with pytest.raises(DataError, match=message):
            GraphdiffSelector(SimpleNamespace(dataset=rows), _config(state_path))
    with pytest.raises(DataError, match="several explorer steps"):
        collect_outcomes([SimpleNamespace(eid=SimpleNamespace(batch=b), reward=1.0,
                                          info={"task_index": {"taskset_id": 0, "index": 0}}) for b in (1, 2)])


def test_nested_ids_match_graphdiff_ids_trinity(tmp_path):
    rows = [{"extra_info": {"index": i}, "prompt": f"q{i}"} for i in (7, 8, 9)]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = trainer_ids(path, trainer="trinity", id_field="extra_info.index")
    assert res["ok"] and [r["id"] for r in res["first_rows"]] == taskset_ids(rows, "extra_info.index") == ["7", "8", "9"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": 3.0, "prompt": "x"}) + "\n")
    assert trainer_ids(bad, trainer="trinity")["mismatches"]["rows"] == [
        {"row": 1, "trainer_id": "3.0", "graphdiff_id": "3"}]


def test_graphdiff_imports_without_trinity_and_says_so_when_it_is_needed():
    code = ("import sys; sys.modules['trinity'] = None\n"
            "import graphdiff_cli.integrations.trinity as t\n"
            "from graphdiff_cli.errors import BackendError\n"
            "for f in (lambda: t.GraphdiffOutcomes, t.register):\n"
            "    try: f()\n"
            "    except BackendError as e: print(repr(str(e)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    lines = [eval(line) for line in out.splitlines()]  # noqa: S307 - reprs of our own messages
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert lines[0].startswith("the graphdiff_outcomes operator needs Trinity-RFT's trinity.buffer.operators (")
    assert lines[1].startswith("Trinity-RFT cannot be imported (ModuleNotFoundError: ")


# ------------------------------------------------------------------------------ Trinity's real classes

REASON = ("trinity-rft is not installed (CI); run these in a side environment: pip install trinity-rft==0.6.0 "
          "--no-deps omegaconf ray")


def _trinity():
    return pytest.importorskip("trinity.buffer.task_scheduler", reason=REASON)


def test_trinitys_registries_resolve_graphdiff():
    _trinity()
    from trinity.buffer.operators import EXPERIENCE_OPERATORS, ExperienceOperator
    from trinity.buffer.selector import SELECTORS
    from trinity.common.constants import SELECTOR_METRIC

    from graphdiff_cli.integrations import trinity as gt

    assert gt.SELECTOR_METRIC == SELECTOR_METRIC
    assert SELECTORS.get(SELECTOR_PATH) is GraphdiffSelector  # the dotted name a config writes: no plugin
    op = EXPERIENCE_OPERATORS.get(OPERATOR_PATH)
    assert issubclass(op, ExperienceOperator) and op is gt.GraphdiffOutcomes
    gt.register()
    gt.register()  # twice: no "already registered"
    assert SELECTORS.get("graphdiff") is GraphdiffSelector and EXPERIENCE_OPERATORS.get("graphdiff_outcomes") is op


def _trinity_config(tmp_path, state, ids, batch_size=6, **kwargs):
    from trinity.common.config import Config, DataSelectorConfig, TasksetConfig

    data = tmp_path / "tasks"
    data.mkdir(exist_ok=True)
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(ids)))
    config = Config()
    config.buffer.batch_size = batch_size
    config.buffer.total_epochs = 10
    selector = DataSelectorConfig(selector_type=SELECTOR_PATH, seed=3,
                                  kwargs={"state": str(state), "group_size": 4, **kwargs})
    taskset = TasksetConfig(name="math", path=str(data), split="train", data_selector=selector,
                            batch_size=batch_size, total_epochs=10, enable_progress_bar=False,
                            default_workflow_type="simple_workflow")
    taskset.format.prompt_key, taskset.format.response_key = "question", "answer"
    config.buffer.explorer_input.tasksets = [taskset]
    return config


def _real_experiences(tasks, step, names, seed=0):
    import torch
    from trinity.common.experience import EID, Experience

    rng = np.random.default_rng([seed, step])
    out = []
    for task in tasks:
        for run in range(4):
            reward = float(rng.random() < _true_p(names[task.index["index"]]))
            out.append(Experience(eid=EID(batch=step, task=0, run=run), tokens=torch.tensor([1, 2, 3]),
                                  prompt_length=2, reward=reward, info={"task_index": dict(task.index)}))
    return out


def test_trinitys_task_scheduler_reads_graphdiffs_choice_and_feeds_back_each_step(inputs, state_path, tmp_path):
    from graphdiff_cli.integrations import trinity as gt

    ts = _trinity()
    from trinity.buffer.operators import create_operators
    from trinity.buffer.operators.mappers.pass_rate_calculator import PassRateCalculator
    from trinity.common.config import OperatorConfig

    ids = inputs[2]
    config = _trinity_config(tmp_path, state_path, ids)
    scheduler = ts.TasksetScheduler({}, config)  # a fresh run: Trinity calls load_state_dict({"current_index": 0})
    selector = scheduler.tasksets[0].reader.selector
    assert isinstance(selector, GraphdiffSelector)
    gt.register()
    [operator] = create_operators([OperatorConfig(name="graphdiff_outcomes")])
    st = State.open(state_path, device="cpu")
    generated = 0
    for step in (1, 2):
        tasks = asyncio.run(scheduler.read())
        chosen = selector.decisions[-1].chosen.tolist()
        assert [t.index["index"] for t in tasks] == chosen  # the rows Trinity rolls out are graphdiff's choice
        assert [t.raw_task["id"] for t in tasks] == [ids[r] for r in chosen]
        exps = _real_experiences(tasks, step, selector.row_ids)
        generated += len(exps)
        _, metrics = asyncio.run(operator.process(exps))
        scheduler.feedback({**metrics, "rollout/finished_task_count": 6.0})
        assert st.step == step
    assert sum(int(a["n"].sum()) for a in selector.applied) == generated == 2 * 6 * 4
    # resume as Trinity does: a new scheduler from the explorer state it saved
    saved = json.loads(json.dumps({"latest_iteration": 2, "taskset_states": scheduler.state_dict()}))
    resumed = ts.TasksetScheduler(saved, config)
    assert resumed.tasksets[0].reader.selector.reads == 2
    asyncio.run(resumed.read())
    st.update(3, [{"id": ids[0], "n": 4, "s": 1}])  # the STATE moved on past the checkpoint
    with pytest.raises(StateError, match=f"graphdiff rollback --state {state_path} --to 2"):
        ts.TasksetScheduler(json.loads(json.dumps(saved)), config)
    # Trinity's own pass_rate_calculator: mean rewards x group_size
    st.rollback(2)
    again = ts.TasksetScheduler(json.loads(json.dumps(saved)), config)
    tasks = asyncio.run(again.read())
    exps = _real_experiences(tasks, 3, selector.row_ids)
    _, metrics = PassRateCalculator().process(exps)
    again.feedback(metrics)
    sel = again.tasksets[0].reader.selector
    assert st.step == 3 and int(sel.applied[-1]["n"].sum()) == len(exps)
    assert int(sel.applied[-1]["s"].sum()) == int(sum(e.reward for e in exps))


EXAMPLE = __import__("pathlib").Path(__file__).resolve().parents[1] / "examples" / "trinity" / "grpo_graphdiff.yaml"


def test_the_example_config_names_the_selector_and_operator_with_valid_options():
    import yaml

    from graphdiff_cli.integrations.trinity import selector_options

    cfg = yaml.safe_load(EXAMPLE.read_text())
    [taskset] = cfg["buffer"]["explorer_input"]["tasksets"]
    sel = taskset["data_selector"]
    assert sel["selector_type"] == SELECTOR_PATH
    opts = selector_options(SimpleNamespace(feature_keys=[], kwargs=sel["kwargs"]))
    assert opts["group_size"] == cfg["algorithm"]["repeat_times"] and opts["prefilter"] is True
    assert cfg["data_processor"]["experience_pipeline"]["operators"][0]["name"] == OPERATOR_PATH


def test_the_example_config_loads_into_trinitys_config():
    pytest.importorskip("trinity.common.config", reason=REASON)
    from trinity.buffer.operators import EXPERIENCE_OPERATORS
    from trinity.buffer.selector import SELECTORS
    from trinity.common.config import load_config

    from graphdiff_cli.integrations import trinity as gt

    config = load_config(str(EXAMPLE))
    [taskset] = config.buffer.explorer_input.tasksets
    assert SELECTORS.get(taskset.data_selector.selector_type) is GraphdiffSelector
    assert gt.selector_options(taskset.data_selector)["strategy"] == "target"
    [op] = config.data_processor.experience_pipeline.operators
    assert EXPERIENCE_OPERATORS.get(op.name) is gt.GraphdiffOutcomes
