"""graphdiff's slime hooks (``integrations/slime.py``).

slime is not installable here (Megatron, SGLang), so slime's calls are replayed on objects shaped exactly like
its own, read from THUDM/slime@624b824a898ab0ec1fcb4d373004c7f3852bf515: slime/rollout/sglang_rollout.py
(``generate_rollout_async``: every completed group goes to ``call_dynamic_filter(dynamic_filter, args, group)``,
dropped per ``should_drop_dynamic_filter_output``; ``process_func(args, all_samples, data_source)`` at the end),
slime/rollout/filter_hub/base_types.py (``call_dynamic_filter`` accepts a bool), slime/rollout/data_source.py
(``buffer_filter(args, None, self.buffer, num_samples)``; ``get_metadata``/``update_metadata``, the metadata saved
with the rollout checkpoint), slime/utils/types.py (``Sample.metadata``, ``Sample.get_reward_value(args)``).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from _handoff_fixtures import make_inputs

from graphdiff_cli import State
from graphdiff_cli.errors import DataError, InvalidArgumentError, StateError
from graphdiff_cli.integrations import slime

N, G = 48, 4


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_inputs(tmp_path_factory.mktemp("slime-inputs"), n=N)


@pytest.fixture
def state_path(inputs, tmp_path, monkeypatch):
    graph, clusters, _ = inputs
    State.init(graph, clusters, tmp_path / "STATE", device="cpu", durable=False)
    monkeypatch.setattr(slime, "_ADAPTERS", {})
    monkeypatch.setenv("GRAPHDIFF_STATE", str(tmp_path / "STATE"))
    return tmp_path / "STATE"


class Sample:
    def __init__(self, pid, reward, index):
        self.metadata, self.reward, self.index = {"id": pid}, reward, index

    def get_reward_value(self, args):
        return self.reward if not args.reward_key else self.reward[args.reward_key]


class DataSource:
    def __init__(self):
        self.metadata = {}

    def get_metadata(self):
        return self.metadata

    def update_metadata(self, metadata):
        self.metadata.update(metadata)


def _args(**kw):
    return SimpleNamespace(**{"reward_key": None, "n_samples_per_prompt": G,
                              "dynamic_sampling_filter_path": slime.FILTER_PATH,
                              "rollout_all_samples_process_path": slime.PROCESS_PATH, **kw})


def _group(pid, rewards, start=0):
    return [Sample(pid, r, start + i) for i, r in enumerate(rewards)]


def _rollout(args, groups, data_source):
    """sglang_rollout.generate_rollout_async's part that reaches the hooks: filter each group, process all."""
    fn = slime.dynamic_sampling_filter if args.dynamic_sampling_filter_path == slime.FILTER_PATH else None
    data = []
    for group in groups:
        out = fn(args, group) if fn is not None else True
        keep = out if isinstance(out, bool) else out.keep
        if keep:
            data.append(group)
    slime.all_samples_process(args, groups, data_source)
    return data


def test_each_rollout_is_one_state_step_with_every_group_and_the_filter_keeps_those_with_signal(inputs, state_path):
    ids = inputs[2]
    args, ds = _args(), DataSource()
    rng = np.random.default_rng(0)
    for step in (1, 2):
        rewards = [[1.0] * G, [0.0] * G] + [[float(rng.random() < 0.5) for _ in range(G)] for _ in range(6)]
        groups = [_group(pid, r) for pid, r in zip(ids[8 * step:8 * step + 8], rewards)]
        kept = _rollout(args, groups, ds)
        signal = [g for g in groups if 0 < sum(s.reward for s in g) < G]
        assert kept == signal and len(signal) < len(groups)  # zero-variance groups dropped...
        st = State.open(state_path)
        assert st.step == step and ds.metadata == {"graphdiff_step": step}
        applied = slime.adapter().steps.applied[-1]
        assert applied["ids"] == ids[8 * step:8 * step + 8] and applied["n"].tolist() == [G] * 8  # ...but applied
        assert applied["metrics"]["graphdiff/groups_without_signal"] == len(groups) - len(signal)


def test_without_graphdiffs_filter_the_process_hook_records_every_group(inputs, state_path, monkeypatch):
    ids = inputs[2]
    args, ds = _args(dynamic_sampling_filter_path=None), DataSource()
    monkeypatch.setenv("GRAPHDIFF_FILTER", "false")
    kept = _rollout(args, [_group(ids[0], [1.0] * G), _group(ids[1], [0.0, 1.0, 1.0, 0.0])], ds)
    assert len(kept) == 2
    a = slime.adapter().steps.applied[-1]
    assert a["ids"] == ids[:2] and a["s"].tolist() == [4, 2] and State.open(state_path).step == 1
    # with graphdiff's filter but GRAPHDIFF_FILTER=false every group is kept, and each is applied once
    assert len(_rollout(_args(), [_group(ids[2], [1.0] * G)], ds)) == 1
    assert slime.adapter().steps.applied[-1]["n"].tolist() == [G]


def test_buffer_filter_takes_the_groups_graphdiffs_rule_prefers(inputs, state_path, monkeypatch):
    ids = inputs[2]
    args, ds = _args(), DataSource()
    # teach the STATE: ids[0..3] always right, ids[4..7] always wrong, ids[8..11] half right
    groups = ([_group(p, [1.0] * G) for p in ids[0:4]] + [_group(p, [0.0] * G) for p in ids[4:8]]
              + [_group(p, [1.0, 0.0] * (G // 2)) for p in ids[8:12]])
    _rollout(args, groups, ds)
    monkeypatch.setenv("GRAPHDIFF_EXPLORE", "0")
    monkeypatch.setattr(slime, "_ADAPTERS", {})
    buffer = [_group(p, [None] * G) for p in ids[0:12]]
    taken = slime.buffer_filter(args, None, buffer, 4)
    assert len(taken) == 4 and len(buffer) == 8 and not any(g in buffer for g in taken)
    est = State.open(state_path).estimates(ids[0:12])
    best = set(np.argsort(np.abs(est["mean"] - 0.5), kind="stable")[:4].tolist())
    assert {ids.index(g[0].metadata["id"]) for g in taken} == best
    rest = list(buffer)
    assert slime.buffer_filter(args, None, buffer, 20) == rest and buffer == []  # more than it holds: all of it


def test_bad_input_is_refused_in_one_line_before_anything_is_kept(inputs, state_path, monkeypatch):
    ids = inputs[2]
    args, ds = _args(), DataSource()
    bare = _group(ids[0], [1.0] * G)
    for s in bare:
        s.metadata = {}
    with pytest.raises(DataError, match=r"^slime sample 0 has no metadata\['id'\]: put each prompt's id"):
        slime.dynamic_sampling_filter(args, bare)
    with pytest.raises(DataError, match=r"^prompt 'q001' got reward 0\.5, not 0 or 1"):
        slime.dynamic_sampling_filter(args, _group(ids[1], [0.5, 1.0, 0.0, 1.0]))
    with pytest.raises(DataError, match="'nope'"):
        slime.dynamic_sampling_filter(args, _group("nope", [1.0] * G))
    assert slime.adapter().steps.groups == 0
    monkeypatch.setattr(slime, "_ADAPTERS", {})
    monkeypatch.setenv("GRAPHDIFF_SUCCESS_THRESHOLD", "high")
    with pytest.raises(InvalidArgumentError, match=r"^GRAPHDIFF_SUCCESS_THRESHOLD must be a number, got 'high'$"):
        slime.adapter()
    monkeypatch.setenv("GRAPHDIFF_SUCCESS_THRESHOLD", "0.5")
    assert slime.dynamic_sampling_filter(args, _group(ids[1], [0.5, 1.0, 0.0, 1.0])) is True  # 3 of 4 >= 0.5
    assert slime.dynamic_sampling_filter(args, _group(ids[2], [0.5, 0.7, 0.9, 1.0])) is False  # all succeed


def test_a_resumed_rollout_refuses_a_state_at_another_step(inputs, state_path, monkeypatch):
    ids = inputs[2]
    args, ds = _args(), DataSource()
    _rollout(args, [_group(ids[0], [1.0, 0.0, 1.0, 0.0])], ds)
    _rollout(args, [_group(ids[1], [1.0, 0.0, 1.0, 0.0])], ds)
    saved = dict(ds.metadata)  # slime saves it with the rollout checkpoint of step 2
    State.open(state_path).rollback(1)  # the STATE went back, the checkpoint did not
    monkeypatch.setattr(slime, "_ADAPTERS", {})  # a new process
    resumed = DataSource()
    resumed.metadata = saved
    with pytest.raises(StateError, match=r"^the graphdiff STATE is at step 1 but slime's rollout checkpoint "
                                         r"recorded step 2: graphdiff rollback --to 2"):
        _rollout(args, [_group(ids[2], [1.0, 0.0, 1.0, 0.0])], resumed)
    assert State.open(state_path).step == 1 and slime.adapter().steps.groups == 0
