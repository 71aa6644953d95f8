"""graphdiff's SkyRL trainer mixin (``integrations/skyrl.py``).

SkyRL's trainer needs ray and vLLM, so the mixin runs on a base class shaped exactly like SkyRL's, read from
NovaSky-AI/SkyRL@a9564572eb8e91076be43c1bd5e4615e3de17265: skyrl/train/trainer.py (``RayPPOTrainer``: ``cfg``,
``train_dataset``, ``global_step`` from 1, ``all_metrics``, ``handle_dynamic_sampling(generator_output, uids)
-> (output, uids, keep_sampling)``, ``_build_train_dataloader_and_compute_training_steps``), skyrl/train/utils/
trainer_utils.py (``handle_filter_sampling``: groups with reward std 0 dropped, batches collected until
``train_batch_size`` prompts), skyrl/train/dataset/dataset.py (``PromptDataset``: ``dataframe``, ``__getitem__``
-> (messages, env_class, extras, ``str(item)``), ``collate_fn``), skyrl/train/generators/utils.py
(``prepare_generator_input``: one uid per rollout, the prompt's), skyrl/train/generators/base.py
(``GeneratorOutput["rewards"]``). ``torchdata``'s ``StatefulDataLoader`` is torch's ``DataLoader`` here.
"""

from __future__ import annotations

import sys
from collections import Counter
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest
import torch
from _handoff_fixtures import make_inputs

from graphdiff_cli import State
from graphdiff_cli.errors import DataError, InvalidArgumentError, StateError
from graphdiff_cli.integrations.skyrl import GraphdiffSkyRL

N, G, B = 48, 4, 6


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("skyrl-inputs"), n=N)


@pytest.fixture
def state_path(inputs, tmp_path, monkeypatch):
    graph, clusters, _ = inputs
    State.init(graph, clusters, tmp_path / "STATE", device="cpu", durable=False)
    module = ModuleType("torchdata.stateful_dataloader")
    module.StatefulDataLoader = torch.utils.data.DataLoader
    monkeypatch.setitem(sys.modules, "torchdata", ModuleType("torchdata"))
    monkeypatch.setitem(sys.modules, "torchdata.stateful_dataloader", module)
    return tmp_path / "STATE"


class PromptDataset:
    def __init__(self, rows):
        self.dataframe = rows

    def __getitem__(self, item):
        row = dict(self.dataframe[item])
        return row.pop("prompt"), None, row, str(item)

    def __len__(self):
        return len(self.dataframe)

    def collate_fn(self, items):
        return [{"prompt": p, "env_class": e, "env_extras": x, "uid": u} for p, e, x, u in items]


class RayPPOTrainer:
    def __init__(self, rows):
        self.cfg = SimpleNamespace(trainer=SimpleNamespace(train_batch_size=B, epochs=1, max_training_steps=None),
                                   generator=SimpleNamespace(n_samples_per_prompt=G))
        self.train_dataset = PromptDataset(rows)
        self.global_step = 1
        self.all_metrics = {}
        self.collected = 0

    def _build_train_dataloader_and_compute_training_steps(self):
        self.train_dataloader = "skyrl's own"

    def handle_dynamic_sampling(self, generator_output, uids):
        by_uid = {}
        for uid, r in zip(uids, generator_output["rewards"]):
            by_uid.setdefault(uid, []).append(r)
        self.collected += sum(np.std(v) > 0 for v in by_uid.values())
        keep_sampling = self.collected < B
        if not keep_sampling:
            self.collected = 0
        return generator_output, uids, keep_sampling


def _rows(ids):
    return [{"prompt": f"question {pid}", "extra_info": {"index": pid}} for pid in ids]


def _trainer(ids, **options):
    class Trainer(GraphdiffSkyRL, RayPPOTrainer):
        graphdiff_options = {"id_field": "extra_info.index", **options}

    return Trainer(_rows(ids))


def _generate(batch, rng, p=0.5):
    uids = [prompt["uid"] for prompt in batch for _ in range(G)]
    return {"rewards": [float(rng.random() < p) for _ in uids]}, uids


def test_every_generation_batch_reaches_the_state_as_the_steps_outcomes(inputs, state_path):
    ids = inputs[2]
    trainer = _trainer(ids, state=str(state_path))
    trainer._build_train_dataloader_and_compute_training_steps()
    assert trainer.total_training_steps == N // B
    rng = np.random.default_rng(1)
    loader = iter(trainer.train_dataloader)
    all_rounds = []
    for step in (1, 2):
        trainer.global_step = step
        generated, rounds = [], 0
        while True:
            batch = next(loader)
            out, uids = _generate(batch, rng)
            generated += [ids[int(b["uid"])] for b in batch]
            rounds += 1
            if not trainer.handle_dynamic_sampling(out, uids)[2]:
                break
        st = State.open(state_path)
        assert st.step == step
        applied = trainer.graphdiff()["steps"].applied[-1]
        seen = Counter(generated)  # a prompt drawn again by a refill batch counts once, with both groups
        assert applied["ids"] == list(seen) and applied["n"].tolist() == [G * k for k in seen.values()]
        assert trainer.all_metrics["graphdiff/step"] == step and trainer.all_metrics["graphdiff/groups"] == B * rounds
        all_rounds.append(rounds)
    assert max(all_rounds) > 1  # a refill batch (filter: too few groups with signal) was part of a step


def test_the_loader_hands_out_blocks_chosen_from_the_estimates(inputs, state_path):
    ids = inputs[2]
    trainer = _trainer(ids, state=str(state_path), explore=0)
    trainer._build_train_dataloader_and_compute_training_steps()
    batch = next(iter(trainer.train_dataloader))
    assert len(batch) == B and all(b["env_extras"]["extra_info"]["index"] == ids[int(b["uid"])] for b in batch)
    off = _trainer(ids, state=str(state_path), choose="false")
    off._build_train_dataloader_and_compute_training_steps()
    assert off.train_dataloader == "skyrl's own"


def test_bad_input_is_refused_in_one_line(inputs, state_path):
    ids = inputs[2]
    trainer = _trainer(ids, state=str(state_path))
    with pytest.raises(DataError, match=r"^prompt 'q000' got reward 3, not 0 or 1"):
        trainer.handle_dynamic_sampling({"rewards": [[1.0, 2.0], [0.0, 0.0]]}, ["0", "0"])  # per-token rewards summed
    with pytest.raises(InvalidArgumentError, match=r"^SkyRL uid 'abc/0' is not a row number: generator\."
                                                   r"step_wise_trajectories is not supported"):
        trainer.handle_dynamic_sampling({"rewards": [1.0]}, ["abc/0"])
    with pytest.raises(DataError, match=r"^SkyRL passed 2 uids for 1 rollouts$"):
        trainer.handle_dynamic_sampling({"rewards": [1.0]}, ["0", "0"])
    with pytest.raises(InvalidArgumentError, match=r"^unknown graphdiff_options\.stat "):
        _trainer(ids, stat=str(state_path)).graphdiff()
    rows_missing = _rows(ids)
    rows_missing[3] = {"prompt": "x", "extra_info": {}}
    bad = _trainer(ids, state=str(state_path))
    bad.train_dataset = PromptDataset(rows_missing)
    with pytest.raises(DataError, match=r"^SkyRL training data set row 3 has no 'extra_info.index'"):
        bad.graphdiff()
    trainer.global_step = 5  # a resume whose STATE was not rolled back with the checkpoint
    with pytest.raises(StateError, match=r"trainer step 5 cannot follow estimator step 0"):
        trainer.handle_dynamic_sampling({"rewards": [1.0, 0.0] * 3 * G}, [str(i) for i in range(B) for _ in range(G)])
