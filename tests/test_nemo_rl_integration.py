"""graphdiff around NeMo-RL's dynamic sampling (``integrations/nemo_rl.py``).

NeMo-RL needs Megatron/vLLM and ray, so its GRPO loop is replayed on a module shaped exactly like its own, read
from NVIDIA-NeMo/RL@7ea279abfbeb698b092856d0dab61e7cf39bc909: nemo_rl/algorithms/grpo.py (``grpo_train`` calls
the module-level ``dynamic_sampling(repeated_batch, std, baseline, num_gen_batches, master_config, timer,
batch_cache)`` on every generation batch and goes on generating while ``is_batch_complete`` is false;
``dynamic_sampling`` keeps groups with std != 0 in ``batch_cache`` until ``num_prompts_per_step`` x
``num_generations_per_prompt`` rollouts are in, and returns ``(batch, is_batch_complete, batch_cache, metrics)``),
nemo_rl/data/interfaces.py (``DatumSpec``: ``idx``, ``extra_env_info``), ``repeat_interleave`` of the prompts
(one entry per rollout) and ``total_reward`` / ``unshaped_total_reward``.
"""

from __future__ import annotations

from types import ModuleType, SimpleNamespace

import numpy as np
import pytest
import torch
from _handoff_fixtures import make_inputs

from graphdiff_cli import State
from graphdiff_cli.errors import DataError, InvalidArgumentError
from graphdiff_cli.integrations.nemo_rl import GraphdiffDynamicSampling, install

N, G, P = 48, 4, 5


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("nemo-inputs"), n=N)


@pytest.fixture
def state_path(inputs, tmp_path):
    graph, clusters, _ = inputs
    State.init(graph, clusters, tmp_path / "STATE", device="cpu", durable=False)
    return tmp_path / "STATE"


def _grpo_module():
    grpo = ModuleType("nemo_rl.algorithms.grpo")

    def dynamic_sampling(repeated_batch, std, baseline, num_gen_batches, master_config, timer, batch_cache=None):
        if not master_config.grpo.use_dynamic_sampling:
            return repeated_batch, True, batch_cache, {}
        keep = [j for j, s in enumerate(std.tolist()) if s != 0.0]
        kept = {k: [v[j] for j in keep] for k, v in repeated_batch.items()}
        batch_cache = kept if batch_cache is None else {k: batch_cache[k] + kept[k] for k in kept}
        need = master_config.grpo.num_prompts_per_step * master_config.grpo.num_generations_per_prompt
        if len(batch_cache["idx"]) < need:
            return batch_cache, False, batch_cache, {}
        return {k: v[:need] for k, v in batch_cache.items()}, True, batch_cache, {"num_discarded": 0}

    grpo.dynamic_sampling = dynamic_sampling
    return grpo


def _config(ds=True):
    return SimpleNamespace(grpo=SimpleNamespace(use_dynamic_sampling=ds, num_prompts_per_step=P,
                                                num_generations_per_prompt=G))


def _batch(rows, rng, p):
    """A repeated batch: each prompt's entry repeated G times, a 0/1 reward per rollout."""
    reps = [r for r in rows for _ in range(G)]
    rewards = torch.tensor([float(rng.random() < p[r]) for r in reps])
    std = torch.tensor([float(rewards[i * G:(i + 1) * G].std()) for i in range(len(rows)) for _ in range(G)])
    return {"idx": reps, "extra_env_info": [{"id": f"q{r:03d}", "ground_truth": "1"} for r in reps],
            "total_reward": rewards}, std


def _train_step(grpo, config, rng, p, order):
    """grpo_train's inner loop for one step: generate batches until dynamic sampling says complete."""
    cache, generated, batches = None, [], 0
    while True:
        rows = [next(order) for _ in range(P)]
        generated += rows
        batch, std = _batch(rows, rng, p)
        batches += 1
        batch, complete, cache, metrics = grpo.dynamic_sampling(batch, std, None, batches, config, None, cache)
        if complete:
            return generated, metrics


def test_every_generation_batch_is_recorded_and_each_trained_step_is_one_state_step(inputs, state_path):
    grpo = _grpo_module()
    wrapper = install({"state": str(state_path)}, module=grpo)
    assert grpo.dynamic_sampling is wrapper
    rng = np.random.default_rng(0)
    p = [(0.0, 0.35, 0.65, 1.0)[i % 4] for i in range(N)]
    order = iter(list(range(N)) * 4)
    batches = 0
    for step in (1, 2):
        generated, metrics = _train_step(grpo, _config(), rng, p, order)
        batches += len(generated) // P
        assert State.open(state_path).step == step
        a = wrapper.steps.applied[-1]
        assert a["ids"] == [f"q{r:03d}" for r in generated] and a["n"].tolist() == [G] * len(generated)
        assert metrics["graphdiff/step"] == step and metrics["graphdiff/groups"] == len(generated)
        assert metrics["num_discarded"] == 0  # NeMo-RL's own metrics are kept
    assert batches > 2  # dropped groups made NeMo-RL generate again, and those groups were applied too
    with pytest.raises(InvalidArgumentError, match="already installed"):
        install({"state": str(state_path)}, module=grpo)


def test_without_dynamic_sampling_each_generation_batch_is_a_step(inputs, state_path):
    grpo = _grpo_module()
    wrapper = install({"state": str(state_path)}, module=grpo)
    rng = np.random.default_rng(0)
    for step in (1, 2, 3):
        generated, metrics = _train_step(grpo, _config(False), rng, [0.5] * N, iter(range(P * step, N)))
        assert generated == list(range(P * step, P * step + P)) and State.open(state_path).step == step
        assert metrics["graphdiff/groups"] == P and wrapper.steps.applied[-1]["ids"][0] == f"q{P * step:03d}"


def test_shaped_rewards_are_read_raw_and_bad_input_is_refused_in_one_line(inputs, state_path, monkeypatch):
    ds = GraphdiffDynamicSampling(_grpo_module().dynamic_sampling, {"state": str(state_path)})
    batch = {"idx": [0, 0], "extra_env_info": [{"id": "q000"}] * 2, "total_reward": torch.tensor([0.8, -0.3]),
             "unshaped_total_reward": torch.tensor([1.0, 0.0])}
    assert ds.groups(batch) == [("q000", [1.0, 0.0])]
    batch = {"idx": [0, 0], "extra_env_info": [{"ground_truth": "1"}] * 2, "total_reward": torch.tensor([1.0, 0.0])}
    with pytest.raises(DataError, match=r"^rollout 0 of NeMo-RL's batch has no extra_env_info\['id'\]: return each"):
        ds(batch, torch.zeros(2), None, 1, _config(), None)
    batch = {"idx": [1, 1], "extra_env_info": [{"id": "q001"}] * 2, "total_reward": torch.tensor([0.5, 1.0])}
    with pytest.raises(DataError, match=r"^prompt 'q001' got reward 0\.5, not 0 or 1"):
        ds(batch, torch.zeros(2), None, 1, _config(), None)
    by_index = GraphdiffDynamicSampling(None, {"state": str(state_path), "id_field": "idx"})
    assert by_index.groups(batch) == [("1", [0.5, 1.0])]
    with pytest.raises(DataError, match="'1'"):  # data set index 1 is not an id of this STATE (q001 is)
        by_index(batch, torch.zeros(2), None, 1, _config(), None)
    monkeypatch.delenv("GRAPHDIFF_STATE", raising=False)
    with pytest.raises(InvalidArgumentError, match=r"^set graphdiff NeMo-RL option state \(or GRAPHDIFF_STATE\)"):
        GraphdiffDynamicSampling(None, {})
    assert ds.steps.groups == 0 and State.open(state_path).step == 0
