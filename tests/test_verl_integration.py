"""The verl adapters: the curriculum sampler (verl <= 0.7) and the v1 trainer mode (verl 0.9).

Without verl installed the adapters are exercised through objects shaped like verl's (a dataset with a
``dataframe`` holding ``extra_info``, a batch with ``non_tensor_batch`` and ``batch`` as DataProto
has them in verl 0.7, the v1 trainer's ``index`` / ``rm_scores`` fields and tags); with verl 0.7
installed, against its ``AbstractCurriculumSampler`` and ``DataProto``; with verl 0.9, against its v1
trainer registry, ``PPOTrainerSync``, ``StatefulDataLoader`` and ``collate_fn`` (the TransferQueue read
is the one part replaced, as it needs a running Ray cluster).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from graphdiff_cli.core.graph import drop_self, exact_knn, mutual_knn_graph
from graphdiff_cli.errors import DataError, InvalidArgumentError, RewardWarning
from graphdiff_cli.estimator import Estimator
from graphdiff_cli.integrations.tracking import InMemoryTarget
from graphdiff_cli.integrations.verl import (GraphdiffCurriculumSampler, check_v1_config, outcomes_from_batch,
                                             outcomes_from_fields, data_source_ids)

N = 24


def _target():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 4)) + np.repeat(rng.normal(size=(3, 4)) * 3, N // 3, axis=0)
    nbr, sim = drop_self(*exact_knn(x, 5), 5)
    est = Estimator(mutual_knn_graph(nbr, sim), np.arange(N) // (N // 3), 3, device="cpu")
    return InMemoryTarget(est, ids=[str(100 + i) for i in range(N)])  # ids are extra_info.index values


def _dataset(indexes):
    return SimpleNamespace(dataframe={"extra_info": [{"index": i} if i is not None else {} for i in indexes]})


def _batch(index, rewards, uid=None):
    scores = torch.zeros(len(rewards), 5)
    scores[:, -1] = torch.tensor(rewards, dtype=torch.float32)  # verl puts the score on the last token
    ntb = {"index": np.array(index, dtype=object)}
    if uid is not None:
        ntb["uid"] = np.array(uid, dtype=object)
    return SimpleNamespace(non_tensor_batch=ntb, batch={"token_level_scores": scores})


def _config(**sampler):
    return {"train_batch_size": 4, "gen_batch_size": None, "dataloader_num_workers": 0,
            "sampler": {"class_path": "pkg://graphdiff_cli.integrations.verl",
                        "class_name": "GraphdiffCurriculumSampler", **sampler}}


def test_batches_follow_the_target_rule_and_updates_apply_one_step():
    target = _target()
    sampler = GraphdiffCurriculumSampler(_dataset(range(100, 100 + N)), _config(pool_factor=2, seed=4),
                                         target=target)
    assert len(sampler) == N // 4 * 4
    it = iter(sampler)
    first = [next(it) for _ in range(4)]
    d = sampler.chooser.decisions[0]
    assert d.estimator_step == 0 and sorted(first) == sorted(d.chosen.tolist()) and len(set(first)) == 4
    key = np.abs(d.p - 0.5)
    assert np.allclose(np.sort(key[np.isin(d.pool, d.chosen)]), np.sort(key)[:4])
    # step 1's batch: 4 prompts x 2 rollouts, rewards by index; uid is random per rollout and ignored
    index = [str(100 + r) for r in first for _ in range(2)]
    rewards = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    sampler.update(_batch(index, rewards, uid=[f"u{j}" for j in range(8)]))
    assert target.step == 1
    e = sampler.applied[0]
    assert e["ids"] == [str(100 + r) for r in first] and e["n"].tolist() == [2] * 4
    assert e["s"].tolist() == [1, 2, 0, 1]
    assert target.estimator().successes_[first].tolist() == [1, 2, 0, 1]
    # the step's graphdiff/... scalars for the trainer's logger: predicted before the outcomes, observed
    m = sampler.metrics
    assert m["graphdiff/mean_p"] == pytest.approx(d.p[np.isin(d.pool, first)].mean(), abs=1e-9)
    assert m["graphdiff/success_rate"] == 0.5 and m["graphdiff/effective"] == 0.5
    assert 0 < m["graphdiff/predicted_effective"] < 1 and m["graphdiff/step"] == 1 and m["graphdiff/prompts"] == 4
    assert m["graphdiff/kappa"] == target.estimator().kappa_ and e["metrics"] is m
    # the next batch is chosen only now, from the updated estimates (no read-ahead with num_workers=0)
    second = [next(it) for _ in range(4)]
    assert sampler.chooser.decisions[1].estimator_step == 1 and len(set(second)) == 4


def test_a_saved_position_resumes_with_the_same_choice():
    """state_dict / load_state_dict (what verl's StatefulDataLoader checkpoints): a resumed sampler continues
    mid-block with the block chosen before, then chooses the next blocks as an uninterrupted one would."""
    target = _target()
    ref = GraphdiffCurriculumSampler(_dataset(range(100, 100 + N)), _config(pool_factor=2, seed=4), target=target)
    want = list(iter(ref))[:14]
    first = GraphdiffCurriculumSampler(_dataset(range(100, 100 + N)), _config(pool_factor=2, seed=4), target=target)
    it = iter(first)
    got = [next(it) for _ in range(6)]  # one block of 4 and half the next
    saved = first.state_dict()
    assert saved["epoch"] == 0 and saved["batch"] == 1 and saved["row"] == 2 and len(saved["block"]) == 4
    # no update was applied here (the position is what is tested; the resume's step check has its own test)
    assert saved.pop("estimator_step") == 1
    resumed = GraphdiffCurriculumSampler(_dataset(range(100, 100 + N)), _config(pool_factor=2, seed=4), target=target)
    resumed.load_state_dict(saved)
    it = iter(resumed)
    got += [next(it) for _ in range(8)]
    assert got == want
    assert len(resumed.chooser.decisions) == 2  # blocks 2 and 3 only: nothing re-chosen to skip ahead


def test_a_resume_is_checked_against_the_state_step():
    """verl <= 0.7 saves its checkpoint after handing out step t's batch and before ``update`` applies it: the
    saved position carries the STATE step the resumed run must find (t). A STATE that went on past the
    checkpoint (restored without a rollback: the next steps would count twice) or that missed step t (the run
    stopped between the save and the update) is refused in one line; at the right step the resume goes on."""
    from graphdiff_cli.errors import StateError

    target = _target()
    sampler = GraphdiffCurriculumSampler(_dataset(range(100, 100 + N)), _config(pool_factor=2, seed=4), target=target)
    it = iter(sampler)
    for step in (1, 2, 3):
        rows = [next(it) for _ in range(4)]
        saved = sampler.state_dict()  # verl <= 0.7: _save_checkpoint, then sampler.update
        sampler.update(_batch([str(100 + r) for r in rows for _ in range(2)], [1.0, 0.0] * 4))
    assert target.step == 3 and saved["estimator_step"] == 3
    assert sampler.state_dict()["estimator_step"] == 3  # between steps: nothing handed out, nothing pending

    def resume(state):
        again = GraphdiffCurriculumSampler(_dataset(range(100, 100 + N)), _config(pool_factor=2, seed=4),
                                           target=target)
        again.load_state_dict(state)
        return again

    resume(saved)  # the STATE is at the checkpoint's step: accepted
    early = {**saved, "estimator_step": 2}  # a checkpoint of step 2, the STATE at 3: step 3 would count twice
    with pytest.raises(StateError, match=r"^the graphdiff STATE is at step 3 but verl's checkpoint resumes after "
                                         r"step 2: its steps 3..3 would count twice; roll the STATE back "
                                         r"\(graphdiff rollback --to 2\)"):
        resume(early)
    with pytest.raises(StateError, match=r"steps 4..4 were never applied"):
        resume({**saved, "estimator_step": 4})
    legacy = {k: v for k, v in saved.items() if k != "estimator_step"}  # written before graphdiff recorded it
    resume(legacy)


def test_outcomes_use_index_never_uid():
    ids, n, s = outcomes_from_batch(_batch(["7", "7", "9"], [1.0, 0.5, 2.0], uid=["a", "b", "c"]),
                                    success_threshold=1.0)
    assert ids == ["7", "9"] and n.tolist() == [2, 1] and s.tolist() == [1, 1]
    ids, n, s = outcomes_from_batch(_batch(["7", "7"], [0.5, 0.2]), success_threshold=0.5)
    assert s.tolist() == [1]
    ids, n, s = outcomes_from_batch(_batch(["7", "7", "9"], [1.0, 0.0, 1.0], uid=["a", "b", "c"]))
    assert n.tolist() == [2, 1] and s.tolist() == [1, 1]  # 0/1 scores need no threshold
    # scores that are not 0/1 with no success_threshold in the config: refused, never thresholded silently
    with pytest.raises(DataError, match=r"^prompt '7' got reward 0.5, not 0 or 1; set the integration's "
                                        r"success_threshold"):
        outcomes_from_batch(_batch(["7", "7"], [0.5, 0.2]))
    bad = SimpleNamespace(non_tensor_batch={"uid": np.array(["a"])}, batch={"token_level_scores": torch.ones(1, 2)})
    with pytest.raises(DataError, match="no non_tensor_batch\\['index'\\].*does not use 'uid'"):
        outcomes_from_batch(bad)


def test_dataset_id_pitfalls_are_refused():
    assert data_source_ids(_dataset([3, 1, 2])) == ["3", "1", "2"]
    with pytest.raises(DataError, match="row 1 has no extra_info.index; verl would silently use 0"):
        data_source_ids(_dataset([3, None, 2]))
    with pytest.raises(DataError, match="rows 0 and 2 share extra_info.index '3'"):
        data_source_ids(_dataset([3, 1, 3]))
    with pytest.raises(DataError, match="no extra_info column"):
        data_source_ids(SimpleNamespace(dataframe={"prompt": ["x"]}))
    with pytest.raises(DataError, match="unknown prompt id '999'"):
        GraphdiffCurriculumSampler(_dataset([100, 999]), _config(), target=_target())


def test_a_state_is_required(monkeypatch):
    monkeypatch.delenv("GRAPHDIFF_STATE", raising=False)
    with pytest.raises(InvalidArgumentError, match="set data.sampler.state"):
        GraphdiffCurriculumSampler(_dataset([100]), _config())


def test_state_directory_target(tmp_path):
    from _handoff_fixtures import make_inputs

    from graphdiff_cli.io.state_dir import StateDir
    from graphdiff_cli.state import State

    graph, clusters, ids = make_inputs(tmp_path, n=16, k_states=2)
    State.init(graph, clusters, tmp_path / "STATE", device="cpu", durable=False)
    ds = SimpleNamespace(dataframe={"extra_info": [{"index": i} for i in ids]})
    sampler = GraphdiffCurriculumSampler(ds, _config(state=str(tmp_path / "STATE")))
    rows = list(iter(sampler))[:4]
    sampler.update(_batch([ids[r] for r in rows], [1.0, 0.0, 1.0, 1.0]))
    sd = StateDir.open(tmp_path / "STATE")
    assert sd.current_step == 1
    entry = sd.log_entries()[-1]
    assert entry["rollouts"] == 4 and entry["successes"] == 3
    assert len(list((tmp_path / "STATE.outcomes").glob("step_00000001-*.jsonl"))) == 1
    # a step without rollouts still advances the STATE by one (an n = 0 row carries no evidence)
    sampler.target.apply(2, [], np.zeros(0), np.zeros(0))
    assert sd.current_step == 2 and sd.log_entries()[-1]["rollouts"] == 0


def test_with_verl_installed():
    verl = pytest.importorskip("verl", reason="verl is not installed; the adapter is tested on verl-shaped objects")
    from graphdiff_cli.integrations import verl as adapter

    if not adapter.VERL_HOOK:
        pytest.skip(f"verl {getattr(verl, '__version__', '?')} has no AbstractCurriculumSampler (removed in 0.8)")
    from verl import DataProto
    from verl.experimental.dataset.sampler import AbstractCurriculumSampler

    sampler = GraphdiffCurriculumSampler(_dataset(range(100, 100 + N)), _config(), target=_target())
    assert isinstance(sampler, AbstractCurriculumSampler)
    rows = list(iter(sampler))[:4]
    batch = DataProto.from_dict(tensors={"token_level_scores": torch.tensor([[0.0, 1.0]] * 4)},
                                non_tensors={"index": np.array([str(100 + r) for r in rows], dtype=object)})
    sampler.update(batch)
    assert sampler.applied[0]["s"].tolist() == [1, 1, 1, 1]


# ------------------------------------------------------------------------------------------ verl 0.9 (v1)

def test_v1_outcomes_skip_padding_and_sum_token_scores():
    scores = torch.zeros(5, 3)
    scores[:, -1] = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0])
    index = np.array([7, 7, 9, 9, 7], dtype=object)
    tags = [{}, {}, {"is_padding": False}, {}, {"is_padding": True}]  # the last row is verl's padding
    ids, n, s = outcomes_from_fields(index, scores, tags)
    assert ids == ["7", "9"] and n.tolist() == [2, 2] and s.tolist() == [1, 2]
    with pytest.warns(RewardWarning, match=r"^this step: all 1 rewards are at or above success_threshold 2 "):
        ids, n, s = outcomes_from_fields([np.int64(3)], [np.array([0.0, 2.0])], None, success_threshold=2.0)
    assert ids == ["3"] and s.tolist() == [1]
    with pytest.raises(DataError, match="2 tags for 5 rollouts"):
        outcomes_from_fields(index, scores, tags[:2])


def test_v1_config_checks():
    ok = {"data": {"dataloader_num_workers": 0}, "algorithm": {}, "trainer": {"v1": {"sampler": {}}}}
    check_v1_config(ok)
    with pytest.raises(InvalidArgumentError, match="dataloader_num_workers=0"):
        check_v1_config({**ok, "data": {"dataloader_num_workers": 8}})
    check_v1_config({**ok, "algorithm": {"filter_groups": {"enable": True}}})  # dynamic sampling: supported
    check_v1_config({**ok, "trainer": {"v1": {"sampler": {"sync_refill_failed_groups": True}}}})


def test_v1_module_without_verl_names_the_cause():
    try:
        import verl.trainer.ppo.v1  # noqa: F401
    except Exception:  # noqa: BLE001
        with pytest.raises(ImportError, match="needs verl >= 0.9 with its dependencies, and importing them failed"):
            import graphdiff_cli.integrations.verl_v1  # noqa: F401
    else:
        pytest.skip("verl's v1 trainer imports here: the real-class test below runs instead")


class _Rows(torch.utils.data.Dataset):
    """A data set as verl's RLHFDataset presents itself to the sampler and to collate_fn."""

    def __init__(self, indexes):
        self.dataframe = {"extra_info": [{"index": i} for i in indexes]}
        self.indexes = list(indexes)

    def __len__(self):
        return len(self.indexes)

    def __getitem__(self, r):
        return {"input_ids": torch.tensor([r, r]), "index": self.indexes[r], "raw_prompt": f"p{r}"}


def test_v1_trainer_with_verl_installed(monkeypatch):
    v1 = pytest.importorskip("verl.trainer.ppo.v1", reason="verl >= 0.9 is not installed (its v1 trainer needs "
                                                          "ray and transfer_queue); tested on verl-shaped objects")
    from omegaconf import OmegaConf

    from graphdiff_cli.integrations import verl_v1

    cls = v1.get_trainer_cls("graphdiff")
    assert cls is verl_v1.GraphdiffPPOTrainer and issubclass(cls, v1.PPOTrainerSync)
    target = _target()
    config = OmegaConf.create({"data": {"train_batch_size": 4, "gen_batch_size": None, "dataloader_num_workers": 0,
                                        "val_batch_size": None},
                               "algorithm": {}, "trainer": {"v1": {"trainer_mode": "graphdiff", "sampler": {}}},
                               "graphdiff": {"strategy": "target", "pool_factor": 2, "seed": 4}})
    trainer = object.__new__(cls)  # verl's __init__ starts Ray workers; the graphdiff parts are what is tested
    trainer.config = config
    trainer.replay_buffer = SimpleNamespace(graphdiff_take=list)  # nothing evicted without dynamic sampling
    rows = _Rows(range(100, 100 + N))

    def base_init(self):  # what verl's _init_dataloader leaves behind that graphdiff's reads
        self.train_dataset, self.train_dataloader = rows, None

    monkeypatch.setattr(v1.PPOTrainer, "_init_dataloader", base_init)
    monkeypatch.setattr(verl_v1, "GraphdiffCurriculumSampler",
                        lambda ds, data, options, batch_size: GraphdiffCurriculumSampler(
                            ds, data, target=target, options=options, batch_size=batch_size))
    trainer._init_dataloader()
    sampler = trainer.graphdiff_sampler
    assert sampler.batch_size == 4 and sampler.chooser.pool_factor == 2.0
    batch = next(iter(trainer.train_dataloader))  # verl's own StatefulDataLoader and collate_fn
    chosen = sampler.chooser.decisions[0].chosen
    assert sorted(batch["index"].tolist()) == sorted((100 + chosen).tolist())
    # one step: verl's step() runs (replaced here), then the step's outcomes are read and applied
    trainer.global_steps = 1
    trainer.on_train_begin()
    keys = [f"k{j}" for j in range(9)]
    tags = [{}] * 8 + [{"is_padding": True}]
    scores = torch.zeros(9, 2)
    scores[[0, 2, 3, 8], -1] = 1.0
    # the fields as verl's TransferQueue returns them: one dict per trajectory, responses of different lengths
    # (so rm_scores is a jagged nested tensor), the index a non-tensor stack
    from verl.utils import tensordict_utils as tu

    index = [str(100 + r) for r in chosen for _ in range(2)] + ["100"]
    fields = tu.list_of_dict_to_tensordict([
        {"index": pid, "rm_scores": torch.cat([torch.zeros(1 + j % 3), scores[j, -1:]])}
        for j, pid in enumerate(index)])
    assert fields["rm_scores"].is_nested
    meta = SimpleNamespace(keys=keys, tags=tags, partition_id="train")
    monkeypatch.setattr(v1.PPOTrainerSync, "step", lambda self, metrics, timing_raw: meta)
    monkeypatch.setattr(verl_v1.tq, "kv_batch_get", lambda keys, partition_id, select_fields: fields)
    metrics = {"actor/loss": 0.1}
    assert trainer.step(metrics, {}) is meta
    assert target.step == 1 and sampler.applied[0]["s"].tolist() == [1, 2, 0, 0]
    assert metrics["graphdiff/success_rate"] == 3 / 8 and metrics["graphdiff/effective"] == 0.25
    assert metrics["actor/loss"] == 0.1
    # a checkpoint of verl's loader carries the sampler's position: a new trainer resumes with the same block
    loader_state = trainer.train_dataloader.state_dict()
    again = object.__new__(cls)
    again.config = config
    again._init_dataloader()
    again.train_dataloader.load_state_dict(loader_state)
    nxt = next(iter(again.train_dataloader))["index"].tolist()
    assert len(again.graphdiff_sampler.chooser.decisions) == 1  # block 1 only: block 0 not re-chosen
    assert again.graphdiff_sampler.state_dict()["batch"] == 1 and again.graphdiff_sampler.epoch == 1
    uninterrupted = sampler.chooser.choose(0, 1)  # what the first trainer would draw next, same estimates
    assert [int(i) for i in nxt] == (100 + uninterrupted).tolist()
    # a resume whose STATE is not at the trainer's step is refused
    trainer.global_steps = 5
    with pytest.raises(Exception, match="rollback --to 4"):
        trainer.on_train_begin()
    with pytest.raises(InvalidArgumentError, match="dataloader_num_workers=0"):
        cls(OmegaConf.create({**OmegaConf.to_container(config), "data": {"dataloader_num_workers": 2}}))


def test_a_verl_that_fails_to_import_is_named_not_swallowed(tmp_path):
    """verl installed but broken (here: a dependency missing): building the sampler says so in one line."""
    import os
    import subprocess
    import sys

    fake = tmp_path / "verl"
    fake.mkdir()
    (fake / "__init__.py").write_text("import ray_is_not_installed_here\n")
    code = ("from types import SimpleNamespace\n"
            "from graphdiff_cli.errors import BackendError\n"
            "import graphdiff_cli.integrations.verl as v\n"
            "try:\n"
            "    v.GraphdiffCurriculumSampler(SimpleNamespace(dataframe={'extra_info': [{'index': 1}]}), {})\n"
            "except BackendError as e:\n"
            "    print('REFUSED', e)\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "REFUSED verl is installed but cannot be imported (ModuleNotFoundError: No module named " \
           "'ray_is_not_installed_here')" in out.stdout, out.stdout + out.stderr
