"""Rewards that are not 0/1: never thresholded at a silent default.

Without ``--success-threshold`` an outcomes file whose rewards are not all 0/1 is refused in one line
naming the file and the row, and the STATE is left as it was; with a threshold, a step whose rewards all
fall below it (or all at or above it) is applied with one warning (``warnings`` in the result, a line on
stderr). The same rule in the trainer integrations' ``count_outcomes``. 0/1 rewards and ``id, n, s`` rows
need no threshold and give no warning.
"""

from __future__ import annotations

import json
import os
import subprocess
import warnings

import numpy as np
import pytest

from _handoff_fixtures import GRAPHDIFF, make_inputs, tree_hash, write_outcomes
from graphdiff_cli import State
from graphdiff_cli.errors import DataError, RewardWarning
from graphdiff_cli.integrations.tracking import count_outcomes


@pytest.fixture
def state(tmp_path):
    graph, clusters, ids = make_inputs(tmp_path, n=24, k_states=2, k_nn=4)
    root = tmp_path / "STATE"
    State.init(graph, clusters, root, device="cpu", durable=False)
    return root, ids


def _rollouts(ids, rewards):
    return [{"id": pid, "reward": r} for pid, r in zip(ids, rewards)]


# --------------------------------------------------------------------------------- State.update


def test_state_update_refuses_continuous_rewards_without_a_threshold_and_changes_nothing(state, tmp_path):
    root, ids = state
    path = write_outcomes(tmp_path / "o.jsonl", _rollouts([ids[0]] * 4, [0.7] * 4))
    before = tree_hash(root)
    st = State.open(root, device="cpu", durable=False)
    with pytest.raises(DataError, match=rf"^{path}:1: reward 0.7 is not 0 or 1; pass success_threshold=X"):
        st.update(1, path)
    assert tree_hash(root) == before and st.step == 0
    # with the threshold chosen the same file is a step (below it: every rollout a failure, said in one warning)
    res = st.update(1, path, success_threshold=0.8)
    assert (res["rollouts"], res["successes"], res["success_threshold"]) == (4, 0, 0.8)
    assert res["warnings"] == [f"step 1: {path}: all 4 rewards are below success_threshold 0.8 (the highest is "
                               "0.7): every rollout counts as a failure"]


def test_state_update_warns_when_every_reward_is_at_or_above_the_threshold(state, tmp_path):
    root, ids = state
    st = State.open(root, device="cpu", durable=False)
    res = st.update(1, _rollouts([ids[0], ids[0], ids[1]], [0.7, 0.9, 0.5]), success_threshold=0.5)
    assert res["successes"] == 3 and len(res["warnings"]) == 1
    assert "all 3 rewards are at or above success_threshold 0.5 (the lowest is 0.5)" in res["warnings"][0]
    # a threshold that splits the step: no warning
    res = st.update(2, _rollouts([ids[0], ids[0], ids[1]], [0.7, 0.2, 0.5]), success_threshold=0.5)
    assert res["successes"] == 2 and res["warnings"] == []


def test_binary_rewards_and_counts_need_no_threshold(state):
    root, ids = state
    st = State.open(root, device="cpu", durable=False)
    res = st.update(1, _rollouts([ids[0]] * 4 + [ids[1]] * 2, [1, 0, 1.0, True, False, 0]))
    assert (res["rollouts"], res["successes"], res["success_threshold"], res["warnings"]) == (6, 3, None, [])
    res = st.update(2, _rollouts([ids[0]] * 4, [0, 0, 0, 0]))  # a hard batch: all failed, nothing to say
    assert res["successes"] == 0 and res["warnings"] == []
    res = st.update(3, [{"id": ids[2], "n": 8, "s": 0}])
    assert res["schema"] == "counts" and res["warnings"] == []


# ------------------------------------------------------------------------------ graphdiff update


def _cli(*argv):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(GRAPHDIFF.parents[2]),
                                                                  os.environ.get("PYTHONPATH", "")) if p)}
    return subprocess.run([str(GRAPHDIFF), *map(str, argv)], capture_output=True, text=True, timeout=300, env=env)


def test_cli_update_refuses_then_warns(state, tmp_path):
    root, ids = state
    path = write_outcomes(tmp_path / "o.csv", _rollouts([ids[0]] * 4, [0.7] * 4))
    before = tree_hash(root)
    res = _cli("update", "--state", root, "--step", 1, "--outcomes", path)
    assert res.returncode == 1, res
    assert res.stderr == (f"graphdiff: error: {path}:2: reward 0.7 is not 0 or 1; pass --success-threshold X (a "
                          "rollout with reward >= X is a success): graphdiff does not guess a threshold for rewards "
                          "that are not 0/1\n")
    assert tree_hash(root) == before
    res = _cli("update", "--state", root, "--step", 1, "--outcomes", path, "--success-threshold", "0.8", "--json")
    assert res.returncode == 0, res
    out = json.loads(res.stdout)
    assert (out["step"], out["successes"], out["rollouts"], out["success_threshold"]) == (1, 0, 4, 0.8)
    line = f"step 1: {path}: all 4 rewards are below --success-threshold 0.8 (the highest is 0.7): every rollout " \
           "counts as a failure"
    assert out["warnings"] == [line]
    assert f"graphdiff: warning: {line}\n" in res.stderr
    # binary rewards, no threshold: applied, no warning line
    ok = write_outcomes(tmp_path / "b.jsonl", _rollouts([ids[1]] * 3, [1, 0, 0]))
    res = _cli("update", "--state", root, "--step", 2, "--outcomes", ok)
    assert res.returncode == 0 and "warning" not in res.stderr and "1/3 successes" in res.stderr, res


# ------------------------------------------------------------------------- trainer integrations


def test_count_outcomes_applies_the_same_rule():
    rows = [(3, "a", 1.0), (3, "a", 0.0), (3, "b", 1.0), (3, "b", float("nan"))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 0/1 rewards, no threshold: no warning either
        ids, n, s = count_outcomes(rows)
    assert ids == ["a", "b"] and n.tolist() == [2, 1] and s.tolist() == [1, 1]
    with pytest.raises(DataError, match=r"^prompt 'b' got reward 0.7, not 0 or 1; set the integration's "
                                        r"success_threshold"):
        count_outcomes([(3, "a", 1.0), (3, "b", 0.7)])
    with pytest.warns(RewardWarning, match=r"^this step: all 2 rewards are below success_threshold 0.9 \(the "
                                           r"highest is 0.7\): every rollout counts as a failure$"):
        ids, n, s = count_outcomes([(3, "a", 0.7), (3, "b", 0.2)], threshold=0.9)
    assert s.tolist() == [0, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert count_outcomes([(3, "a", 0.7), (3, "b", 0.2)], threshold=0.5)[2].tolist() == [1, 0]


def test_trl_takes_the_threshold_from_its_options():
    from graphdiff_cli.core.graph import drop_self, exact_knn, mutual_knn_graph
    from graphdiff_cli.estimator import Estimator
    from graphdiff_cli.integrations.trl import GraphdiffTRL

    rng = np.random.default_rng(1)
    nbr, sim = drop_self(*exact_knn(rng.normal(size=(12, 4)), 4), 4)

    def run(**kwargs):
        gd = GraphdiffTRL(Estimator(mutual_knn_graph(nbr, sim), np.arange(12) % 2, 2, device="cpu"), **kwargs)
        gd._trainer = object()
        gd.reward(lambda prompts, completions, **kw: [0.7, 0.2, 0.9, 0.7])(
            prompts=["."] * 4, completions=["."] * 4, id=["1", "1", "5", "5"],
            trainer_state=type("S", (), {"global_step": 0}))
        return gd.apply_step(1)

    with pytest.raises(DataError, match="prompt '1' got reward 0.7, not 0 or 1"):
        run()
    entry = run(success_threshold=0.5)
    assert entry["n"].tolist() == [2, 2] and entry["s"].tolist() == [1, 2]
