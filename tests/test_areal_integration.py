"""graphdiff's AReaL dynamic filter (``integrations/areal.py``).

AReaL 1.0.4 does not import without ray, sglang/vllm clients and a CUDA torch, so AReaL's path is replayed on
objects shaped exactly like its own, read from the ``areal`` 1.0.4 wheel: areal/api/workflow_api.py
(``RolloutWorkflow.arun_episode(engine, data)``, abstract), areal/workflow/rlvr.py (a result is a dict of
tensors with batch dim 1, ``rewards`` among them), areal/infra/remote_inf_engine.py (``GroupedRolloutWorkflow``:
``gather`` of n episodes joined by ``concat_padded_tensors``), areal/utils/data.py (``concat_padded_tensors``:
tensors concatenated along dim 0, other values kept from the first dict, all dicts with the same keys),
areal/infra/workflow_executor.py (``should_accept_fn(traj)`` on every non-None group).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod

import numpy as np
import pytest
import torch
from _handoff_fixtures import make_inputs

from graphdiff_cli import State
from graphdiff_cli.errors import DataError, InvalidArgumentError
from graphdiff_cli.integrations.areal import ID_KEY, GraphdiffAReaL

N, G, B = 48, 4, 6


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("areal-inputs"), n=N)


@pytest.fixture
def state_path(inputs, tmp_path):
    graph, clusters, _ = inputs
    State.init(graph, clusters, tmp_path / "STATE", device="cpu", durable=False)
    return tmp_path / "STATE"


class RolloutWorkflow(ABC):
    @abstractmethod
    async def arun_episode(self, engine, data):
        raise NotImplementedError


class CoinWorkflow(RolloutWorkflow):
    """An RLVR-shaped workflow: one rollout, reward 1 with the row's probability (``p``)."""

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)

    async def arun_episode(self, engine, data):
        reward = float(self.rng.random() < data["p"])
        res = {"input_ids": torch.ones(5, dtype=torch.int32), "rewards": torch.tensor(reward)}
        return {k: v.unsqueeze(0) for k, v in res.items()}


def concat_padded_tensors(dicts):
    assert all(set(d) == set(dicts[0]) for d in dicts)
    return {k: torch.cat([d[k] for d in dicts]) if torch.is_tensor(v) else v for k, v in dicts[0].items()}


async def grouped(workflow, data, n):
    results = await asyncio.gather(*[workflow.arun_episode(None, data) for _ in range(n)])
    return concat_padded_tensors([r for r in results if r is not None])


def _rows(ids):
    return [{"id": pid, "prompt": f"question {pid}", "p": (0.0, 0.35, 0.65, 1.0)[i % 4]} for i, pid in enumerate(ids)]


def test_every_group_is_recorded_with_its_row_id_and_only_groups_with_signal_train(inputs, state_path):
    ids = inputs[2]
    rows = _rows(ids)
    gd = GraphdiffAReaL(rows, {"state": str(state_path), "groups_per_step": B, "group_size": G})
    wf = gd.workflow(CoinWorkflow())
    assert isinstance(wf, RolloutWorkflow) and wf.rng is wf.graphdiff_inner.rng  # AReaL's isinstance check holds
    sampler = gd.sampler()
    order = iter(sampler)
    accepted = []
    for step in (1, 2):
        chosen = [next(order) for _ in range(B)]
        assert gd.rows.chooser.decisions[-1].estimator_step == step - 1
        for r in chosen:
            traj = asyncio.run(grouped(wf, rows[r], G))
            assert traj[ID_KEY] == ids[r] and traj["rewards"].shape == (G,)
            ok = gd.should_accept(traj)
            assert ID_KEY not in traj  # the trained batch never sees the id
            assert ok == (0 < int(traj["rewards"].sum()) < G)
            accepted.append(ok)
        assert State.open(state_path).step == step
        assert gd.steps.applied[-1]["ids"] == [ids[r] for r in chosen]
    assert not all(accepted) and any(accepted)
    assert len(sampler) == N


def test_filter_off_accepts_all_and_bad_input_is_refused_in_one_line(inputs, state_path):
    ids = inputs[2]
    rows = _rows(ids)
    gd = GraphdiffAReaL(rows, {"state": str(state_path), "groups_per_step": 3, "filter": "false"})
    assert gd.should_accept({ID_KEY: ids[0], "rewards": torch.ones(G)}) is True
    with pytest.raises(DataError, match=r"^the trajectory has no graphdiff_prompt_id: pass the workflow through"):
        gd.should_accept({"rewards": torch.ones(G)})
    with pytest.raises(DataError, match=r"^prompt 'q001' got reward 2, not 0 or 1; set the integration's"):
        gd.should_accept({ID_KEY: ids[1], "rewards": torch.tensor([2.0, 0.0])})
    with pytest.raises(DataError, match=r"^an AReaL data row has no 'id'"):
        asyncio.run(gd.workflow(CoinWorkflow()).arun_episode(None, {"prompt": "x", "p": 0.5}))
    assert gd.steps.groups == 1 and State.open(state_path).step == 0
    with pytest.raises(InvalidArgumentError, match=r"^set graphdiff AReaL option groups_per_step"):
        GraphdiffAReaL(rows, {"state": str(state_path)})
    with pytest.raises(InvalidArgumentError, match=r"^graphdiff AReaL option filter must be true or false, got 'x'$"):
        GraphdiffAReaL(rows, {"state": str(state_path), "groups_per_step": 3, "filter": "x"})
    with pytest.raises(DataError, match=r"'zzz'"):  # a row id the STATE lacks is refused at start-up
        GraphdiffAReaL(rows + [{"id": "zzz", "p": 0.5}], {"state": str(state_path), "groups_per_step": 3})


def test_a_success_threshold_counts_graded_rewards(inputs, state_path):
    ids = inputs[2]
    gd = GraphdiffAReaL(_rows(ids), {"state": str(state_path), "groups_per_step": 1, "success_threshold": 0.5})
    assert gd.should_accept({ID_KEY: ids[0], "rewards": torch.tensor([0.9, 0.2, 0.5, -1.0])}) is True
    a = gd.steps.applied[-1]
    assert a["ids"] == [ids[0]] and a["n"].tolist() == [4] and a["s"].tolist() == [2]
