"""verl 0.9 with dynamic sampling (``algorithm.filter_groups.enable=true``): graphdiff chooses every dispatch
(the step's first batch and every refill), every generated group - trained, DAPO-evicted or discarded as
surplus - is applied to the STATE in its step, and the step's metrics count them.

Generation is played by an in-process TransferQueue and agent loop (``_TQ``, ``_Loop``): groups finish a few
per poll, so refills and the in-flight cap matter. With verl 0.9 importable (a side environment: ray,
transfer_queue, ...), the run goes through verl's real ``ReplayBuffer.sample``, ``PPOTrainer.step``,
``_next_train_batch`` / ``_submit_batch_to_rollout``, ``StatefulDataLoader`` and ``collate_fn``; without it
(CI), through ``_SyncDapoBuffer``, verl 0.9.1's sync DAPO loop reduced to what graphdiff relies on.
"""

from __future__ import annotations

import uuid
from collections import defaultdict, deque
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from graphdiff_cli.core import decisions as dec
from graphdiff_cli.errors import InvalidArgumentError, StateError
from graphdiff_cli.integrations.verl import (DispatchChooser, GeneratedGroupsMixin, GraphdiffCurriculumSampler,
                                             apply_generated, check_v1_config, dynamic_sampling,
                                             outcomes_from_fields)

TBS, ROLLOUT_N, CAP = 4, 4, 2  # train_batch_size, rollout.n, max_inflight_gen_batches


def _reward(index: str, j: int) -> float:
    kind = int(index[1:]) % 3  # 0: always solved, 1: never solved (both evicted by DAPO), 2: half
    return 1.0 if kind == 0 else 0.0 if kind == 1 else float(j % 2)


class _TQ:
    """TransferQueue's kv API as verl's replay buffer and trainer call it, in process."""

    def __init__(self, loop):
        self.tags, self.fields, self.loop = defaultdict(dict), defaultdict(dict), loop

    def kv_list(self, partition_id=None):
        self.loop.progress(self)  # generation advances between the buffer's polls
        parts = [partition_id] if partition_id else list(self.tags)
        return {p: {k: dict(t) for k, t in self.tags[p].items()} for p in parts}

    def kv_batch_put(self, keys, partition_id, tags=None, fields=None):
        for j, key in enumerate(keys):
            self.tags[partition_id].setdefault(key, {}).update(tags[j] if tags else {})

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        return {f: [self.fields[partition_id][k][f] for k in keys] for f in select_fields}

    def kv_clear(self, partition_id, keys):
        for key in keys:
            self.tags[partition_id].pop(key, None)
            self.fields[partition_id].pop(key, None)


class _Loop:
    """The agent loop: ``n = prompt.pop("__rollout_n__", rollout.n)`` sessions per prompt (agent_loop_tq.py),
    finishing ``per_poll`` groups at each poll of the buffer."""

    def __init__(self, per_poll=3):
        self.pending, self.per_poll = deque(), per_poll
        self.dispatched: list[list[str]] = []
        self.rollouts: dict[int, int] = defaultdict(int)
        self.groups: dict[int, int] = defaultdict(int)
        self.max_inflight = 0
        self.step = 0

    def generate_sequences(self, batch):
        index = [str(i) for i in list(batch["index"])]
        ns = list(batch["__rollout_n__"]) if "__rollout_n__" in batch.keys() else [ROLLOUT_N] * len(index)
        self.dispatched.append(index)
        self.pending.extend(zip(list(batch["uid"]), index, (int(n) for n in ns)))
        self.max_inflight = max(self.max_inflight, len(self.pending))

    def progress(self, tq):
        for _ in range(min(self.per_poll, len(self.pending))):
            uid, index, n = self.pending.popleft()
            for j in range(n):
                key = f"{uid}_{j}_0"
                tq.tags["train"][key] = {"status": "success", "global_steps": self.step}
                tq.fields["train"][key] = {"index": index, "rm_scores": torch.tensor([0.0, _reward(index, j)])}
            tq.tags["train"][uid]["status"] = "finished"
            self.rollouts[self.step] += n
            self.groups[self.step] += 1


class _SyncDapoBuffer:
    """verl 0.9.1's sync ReplayBuffer with DAPO (replay_buffer.py ``sample``), reduced: finished groups whose
    rewards are all equal are evicted (``_evict_terminal_groups`` -> ``_clear_groups``) for 2k refill credits,
    dispatched within ``max_inflight_gen_batches x train_batch_size`` pending or running prompts; once enough
    groups are sampleable the in-flight ones are drained, the oldest selected and the surplus cleared."""

    def __init__(self, tq, refill_fn, train_batch_size, max_inflight_gen_batches):
        self.tq, self.refill_fn = tq, refill_fn
        self.cap = max_inflight_gen_batches * train_batch_size
        self.partitions = defaultdict(dict)

    def _sync(self):
        self.partitions.clear()
        self.status, self.steps = {}, {}
        for pid, items in self.tq.kv_list().items():
            for key, tag in items.items():
                if tag.get("is_prompt"):
                    self.status[key], self.steps[key] = tag["status"], tag["global_steps"]
                else:
                    self.partitions[pid][key] = tag

    def _zero_variance(self):
        done = {u for u, st in self.status.items() if st == "finished"}
        out = set()
        for uid in done:
            keys = [k for k in self.partitions["train"] if k.split("_")[0] == uid]
            values = [float(v.sum()) for v in self.tq.kv_batch_get(keys, "train", ["rm_scores"])["rm_scores"]]
            if len(values) > 1 and np.std(values) == 0.0:
                out.add(uid)
        return out

    def _evict_terminal_groups(self, global_steps, partition_id, eviction_reasons):
        self._clear_groups(partition_id, eviction_reasons)
        return eviction_reasons

    def _clear_groups(self, partition_id, uids):
        keys = [k for k in self.partitions[partition_id] if k.split("_")[0] in uids]
        self.tq.kv_clear(partition_id, [*uids, *keys])
        for key in keys:
            del self.partitions[partition_id][key]
        for uid in uids:
            self.status.pop(uid, None)

    def sample(self, global_steps, partition_id, batch_size):
        credit, draining, metrics = 0, False, defaultdict(int)
        while True:
            self._sync()
            evicted = self._evict_terminal_groups(global_steps, partition_id, self._zero_variance())
            metrics["training/filter_groups/evicted_samples"] += len(evicted)
            ready = {u for u, st in self.status.items() if st == "finished"}
            inflight = sum(st in ("pending", "running") for st in self.status.values())
            if len(ready) >= batch_size:
                draining, credit = True, 0
            elif not draining:
                credit += 2 * len(evicted)
            if not draining and credit > 0:
                count = min(credit, max(0, self.cap - inflight))
                if count > 0:
                    self.refill_fn(count)
                    credit -= count
                    continue
            if len(ready) >= batch_size and inflight == 0:
                chosen = sorted(ready, key=lambda u: self.steps[u])[:batch_size]
                self._clear_groups(partition_id, ready - set(chosen))
                metrics["training/filter_groups/discarded_surplus_samples"] += len(ready) - len(chosen)
                self.tq.kv_clear(partition_id, chosen)  # _materialize_batch: the prompts' status keys go
                keys = [k for k in self.partitions[partition_id] if k.split("_")[0] in chosen]
                return SimpleNamespace(partition_id=partition_id, keys=keys,
                                       tags=[self.partitions[partition_id][k] for k in keys]), dict(metrics)


class _Buffer(GeneratedGroupsMixin, _SyncDapoBuffer):
    def graphdiff_kv_get(self, **kwargs):
        return self.tq.kv_batch_get(**kwargs)


def _state(tmp_path):
    from _handoff_fixtures import make_inputs

    from graphdiff_cli import State

    graph, clusters, ids = make_inputs(tmp_path, n=30, k_states=3)
    State.init(graph, clusters, tmp_path / "STATE", device="cpu", durable=False)
    return tmp_path / "STATE", ids


def _check_run(loop, chooser, applied, verl_metrics, state_dir, steps):
    """What every run must show, whichever buffer ran it."""
    # every dispatch (first batches and refills) rolled out exactly graphdiff's choice, in order
    chosen = [[chooser.sampler.row_ids[r] for r in d["chosen"]] for d in chooser.dispatches]
    assert loop.dispatched == chosen and len(chosen) > steps  # refills happened
    for step in range(1, steps + 1):
        m = applied[step - 1]["metrics"]
        mine = [d for d in chooser.dispatches if d["step"] == step]
        # every generated group and rollout of the step is in the STATE's step, evicted ones included
        assert m["graphdiff/groups_generated"] == loop.groups[step] == sum(d["chosen"].size for d in mine)
        assert m["graphdiff/rollouts"] == loop.rollouts[step] == applied[step - 1]["n"].sum()
        assert m["graphdiff/groups_trained"] == TBS
        assert m["graphdiff/groups_evicted"] == verl_metrics[step - 1].get(
            "training/filter_groups/evicted_samples", 0)
        assert m["graphdiff/groups_discarded"] == verl_metrics[step - 1].get(
            "training/filter_groups/discarded_surplus_samples", 0)
        assert m["graphdiff/skipped"] == sum(d["skipped"].size for d in mine)
        assert m["graphdiff/prompts_dispatched"] == loop.groups[step] and m["graphdiff/step"] == step
        # a step's groups are distinct prompts: none generated twice in one step
        ids = applied[step - 1]["ids"]
        assert len(ids) == len(set(ids)) == loop.groups[step]
    assert sum(a["metrics"]["graphdiff/groups_evicted"] for a in applied) > 0
    assert loop.max_inflight <= CAP * TBS
    from graphdiff_cli import State

    assert State.open(state_dir, device="cpu").step == steps
    from graphdiff_cli.io.state_dir import StateDir  # the test reads the log file; integrations never do

    log = StateDir.open(state_dir).log_entries()[-steps:]
    assert [e["rollouts"] for e in log] == [loop.rollouts[t] for t in range(1, steps + 1)]


def _sampler(state_dir, ids, **options):
    ds = SimpleNamespace(dataframe={"extra_info": [{"index": i} for i in ids]})
    sampler = GraphdiffCurriculumSampler(ds, {"train_batch_size": TBS}, options={
        "state": str(state_dir), "strategy": "target", "pool_factor": 2, "seed": 3, "group_size": ROLLOUT_N,
        **options}, batch_size=TBS)
    sampler.planned = deque()
    return sampler


@pytest.mark.parametrize("allocate", [None, "vip"])
def test_dynamic_sampling_on_a_verl_shaped_buffer(tmp_path, allocate):
    state_dir, ids = _state(tmp_path)
    sampler = _sampler(state_dir, ids, allocate=allocate, allocate_min=2, allocate_max=8)
    chooser = DispatchChooser(sampler, ROLLOUT_N)
    loop = _Loop()
    tq = _TQ(loop)
    rows = iter(sampler)

    def dispatch(k):  # the trainer's _next_train_batch + _submit_batch_to_rollout, per prompt
        sampler.planned.extend(chooser.choose(k, loop.step).tolist())
        index = [sampler.row_ids[next(rows)] for _ in range(k)]
        batch = {"uid": [str(uuid.uuid4()) for _ in index], "index": index}
        if allocate:
            batch["__rollout_n__"] = chooser.rollout_counts(index)
        tq.kv_batch_put(batch["uid"], "train", [{"is_prompt": True, "status": "pending", "global_steps": loop.step}
                                                for _ in index])
        loop.generate_sequences(batch)
        return k

    buffer = _Buffer(tq, dispatch, TBS, CAP)
    verl_metrics = []
    for step in (1, 2, 3):
        loop.step = step
        dispatch(TBS)
        batch, metrics = buffer.sample(step, "train", TBS)
        verl_metrics.append(metrics)
        data = tq.kv_batch_get(batch.keys, "train", ["index", "rm_scores"])
        trained = outcomes_from_fields(data["index"], data["rm_scores"], batch.tags, sampler.success_threshold)
        apply_generated(sampler, trained, buffer.graphdiff_take(), chooser.step_counts(step))
        tq.kv_clear("train", batch.keys)
    _check_run(loop, chooser, sampler.applied, verl_metrics, state_dir, 3)
    if allocate:  # per-prompt counts through __rollout_n__, each dispatch's budget k x rollout.n
        for d in chooser.dispatches:
            assert d["rollout_n"].sum() == d["chosen"].size * ROLLOUT_N and d["rollout_n"].min() >= 2
        assert any(len(set(d["rollout_n"].tolist())) > 1 for d in chooser.dispatches)


def test_prefilter_skips_likely_all_equal_prompts_with_greso_floor():
    pzv = np.array([0.0] * 500 + [1.0] * 500)
    keep = dec.prefilter_zero_variance(pzv, seed=1)
    assert keep[:500].all() and 0 < keep[500:].sum() < 20  # kept with GRESO's 1% exploration
    assert (dec.prefilter_zero_variance(pzv, seed=1) == keep).all()
    assert not dec.prefilter_zero_variance(pzv, min_keep=0.0, seed=1)[500:].any()
    with pytest.raises(InvalidArgumentError, match="p_zero_variance must be"):
        dec.prefilter_zero_variance(np.array([1.5]))


def test_dispatch_choice_skips_before_generation_and_never_repeats_in_a_step(tmp_path):
    state_dir, ids = _state(tmp_path)
    sampler = _sampler(state_dir, ids)
    chooser = DispatchChooser(sampler, ROLLOUT_N)
    # make some prompts certain: many all-correct groups, so their p_zero_variance is high
    sampler.apply(ids[:15], np.full(15, 40), np.full(15, 40))
    first = chooser.choose(4, step=2)
    second = chooser.choose(4, step=2)
    assert not set(first) & set(second)
    skipped = np.concatenate([d["skipped"] for d in chooser.dispatches])
    assert skipped.size > 0 and (skipped < 15).all()  # only the certain ones were skipped
    with pytest.raises(InvalidArgumentError, match="only 22 of the data set"):
        chooser.choose(23, step=2)
    assert chooser.choose(23, step=3).size == 23  # a new step starts from the whole data set
    sampler.planned.clear()
    with pytest.raises(StateError, match="had not chosen"):
        next(iter(sampler))


def test_v1_config_allows_dynamic_sampling_and_refuses_a_custom_sampler():
    ok = {"data": {"dataloader_num_workers": 0}, "algorithm": {"filter_groups": {"enable": True}},
          "trainer": {"v1": {"sampler": {"sync_refill_failed_groups": True}}}}
    check_v1_config(ok)
    assert dynamic_sampling(ok) and not dynamic_sampling({"algorithm": {}, "trainer": {}})
    with pytest.raises(InvalidArgumentError, match="remove trainer.v1.sampler.custom_sampler"):
        check_v1_config({**ok, "trainer": {"v1": {"sampler": {"custom_sampler": {"path": "x.py", "name": "B"}}}}})
    with pytest.raises(InvalidArgumentError, match="allocation"):
        check_v1_config({**ok, "graphdiff": {"allocate": "most"}})


def test_dynamic_sampling_through_verl_itself(tmp_path, monkeypatch):
    v1 = pytest.importorskip("verl.trainer.ppo.v1", reason="verl >= 0.9 is not installed (its v1 trainer needs "
                                                          "ray and transfer_queue); the run above is verl-shaped")
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import replay_buffer as rb
    from verl.trainer.ppo.v1 import trainer_base

    from graphdiff_cli.integrations import verl_v1

    state_dir, ids = _state(tmp_path)
    loop = _Loop()
    tq = _TQ(loop)
    for module in (rb, trainer_base, verl_v1):
        monkeypatch.setattr(module, "tq", tq)
    config = OmegaConf.create({
        "data": {"train_batch_size": TBS, "gen_batch_size": None, "dataloader_num_workers": 0},
        "algorithm": {"filter_groups": {"enable": True, "metric": "reward", "max_inflight_gen_batches": CAP}},
        "reward": {"reward_model": {"enable": False}},
        "actor_rollout_ref": {"rollout": {"n": ROLLOUT_N}},
        "trainer": {"v1": {"trainer_mode": "graphdiff", "sampler": {
            "max_off_policy_threshold": None, "max_off_policy_strategy": "drop", "sampler_kwargs": {}}}},
        "graphdiff": {"state": str(state_dir), "strategy": "target", "pool_factor": 2, "seed": 3,
                      "allocate": "vip", "allocate_min": 2, "allocate_max": 8}})
    trainer = object.__new__(verl_v1.GraphdiffPPOTrainer)  # verl's __init__ starts Ray workers
    trainer.config, trainer.trainer_mode, trainer.parameter_sync_step = config, "sync", 1
    trainer.agent_loop_manager = loop
    trainer.replay_buffer = trainer._build_replay_buffer()  # verl resolves the DAPO arguments
    assert isinstance(trainer.replay_buffer, rb.ReplayBuffer) and trainer.replay_buffer.filter_groups_metric == "reward"
    assert trainer.replay_buffer.max_inflight_gen_batches == CAP and trainer.replay_buffer.gen_batch_size == 1
    trainer.replay_buffer.poll_interval = 0.0
    rows = _Rows(ids)

    def base_init(self):  # what verl's _init_dataloader leaves: datasets, and gen_batch_size=1 under DAPO
        self.train_dataset, self.train_dataloader = rows, None
        self.config.data.gen_batch_size = 1

    monkeypatch.setattr(v1.PPOTrainer, "_init_dataloader", base_init)

    def sample_only(self, metrics, timing_raw, sample_batch_size):  # _step_once's step 1; the rest needs GPUs
        batch, m = self.replay_buffer.sample(global_steps=self.global_steps, partition_id="train",
                                             batch_size=sample_batch_size)
        metrics.update(m)
        verl_metrics.append(m)
        return batch

    monkeypatch.setattr(v1.PPOTrainer, "_step_once", sample_only)
    trainer._init_dataloader()
    verl_metrics = []
    for step in (1, 2, 3):
        trainer.global_steps = loop.step = step
        metrics = {}
        batch = trainer.step(metrics, {})  # verl's PPOTrainer.step: prepare_step, sample, then graphdiff's apply
        assert metrics["graphdiff/groups_trained"] == TBS
        tq.kv_clear(keys=batch.keys, partition_id=batch.partition_id)  # fit()'s cleanup
    chooser = trainer.graphdiff_dispatch
    _check_run(loop, chooser, trainer.graphdiff_sampler.applied, verl_metrics, state_dir, 3)
    for d in chooser.dispatches:  # the agent loop rolled out the allocation it read from __rollout_n__
        assert d["rollout_n"].sum() == d["chosen"].size * ROLLOUT_N


class _Rows(torch.utils.data.Dataset):
    """A data set as verl's RLHFDataset presents itself to the sampler and to collate_fn."""

    def __init__(self, indexes):
        self.dataframe = {"extra_info": [{"index": i} for i in indexes]}
        self.indexes = list(indexes)

    def __len__(self):
        return len(self.indexes)

    def __getitem__(self, r):
        return {"input_ids": torch.tensor([r, r]), "index": self.indexes[r], "raw_prompt": f"p{r}"}
