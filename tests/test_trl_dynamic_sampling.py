"""graphdiff's dynamic sampling (DS) inside a real ``trl.GRPOTrainer`` on the CPU, end to end.

The tiny Llama and the 60-word tokenizer of tests/test_trl_integration.py; 32 prompts in 4 planted
topics whose rule-based reward is never right (topic 0), right half of the time (topics 1, 2) or always
right (topic 3), so half the prompts give zero-variance groups. Three runs: DS with graphdiff's
pre-filter, plain DS (uniform draws) and plain DS with a cap of 2 generation rounds. Checked against what
the trainer itself received (the rewards its reward function returned, the batches its loss saw): every
trained group has 0 < s < n; every generated rollout, dropped or not, is in the STATE's log; the cap is
honoured and reported; the pre-filter skips what the STATE predicts zero-variance.
"""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

pytest.importorskip("trl", reason="trl is not installed (pip install 'graphdiff-rl[trl]')")
pytestmark = pytest.mark.slow  # ~30 s on 2 busy cores, most of it importing transformers and trl

from _handoff_fixtures import make_inputs  # noqa: E402
from graphdiff_cli.errors import DataError, InvalidArgumentError  # noqa: E402
from graphdiff_cli.integrations import dynamic_sampling as ds  # noqa: E402
from graphdiff_cli.integrations.tracking import count_outcomes  # noqa: E402
from graphdiff_cli.integrations.trl import GraphdiffTRL, _merge_rounds  # noqa: E402
from graphdiff_cli.io.state_dir import StateDir  # noqa: E402
from graphdiff_cli.state import State  # noqa: E402
from test_trl_integration import _rule, _tiny_lm, _tokenizer  # noqa: E402

N_PROMPTS, N_GEN, B, STEPS = 32, 4, 4, 5
LEVELS = (0.0, 0.5, 0.5, 1.0)  # topic i % 4: never, half, half, always right


def _train(folder, mode, max_rounds):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    graph, clusters, ids = make_inputs(folder, n=N_PROMPTS, k_states=4, prefix="p")
    State.init(graph, clusters, folder / "STATE", device="cpu", durable=False)
    level = {pid: LEVELS[i % 4] for i, pid in enumerate(ids)}
    data = Dataset.from_list([{"prompt": f"Problem {pid} add the numbers", "id": pid, "level": level[pid]}
                              for pid in ids])
    truth: list[tuple[int, str, float]] = []  # what the reward function returned, seen from the test

    def correctness(prompts, completions, id, level, trainer_state, **kwargs):
        out = [_rule(c, lv) for c, lv in zip(completions, level)]
        truth.extend((trainer_state.global_step, i, r) for i, r in zip(id, out))
        return out

    gd = GraphdiffTRL(folder / "STATE", seed=3, durable=False, dynamic_sampling=mode,
                      max_generation_rounds=max_rounds)
    tok = _tokenizer()
    args = GRPOConfig(output_dir=str(folder / "out"), per_device_train_batch_size=B * N_GEN, num_generations=N_GEN,
                      max_completion_length=6, max_steps=STEPS, learning_rate=1e-3, beta=0.0, logging_steps=1,
                      report_to=[], save_strategy="no", use_cpu=True, seed=0, dataloader_num_workers=0,
                      disable_tqdm=True)
    trainer = GRPOTrainer(model=_tiny_lm(tok), processing_class=tok, args=args, train_dataset=data,
                          reward_funcs=[gd.reward(correctness)])
    gd.attach(trainer)
    trained = []  # (trainer step, prompt id, advantage) of every row the loss saw
    loss = trainer.compute_loss

    def spy(model, inputs, *a, **kw):
        texts = tok.batch_decode(inputs["prompt_ids"] * inputs["prompt_mask"], skip_special_tokens=True)
        for text, adv in zip(texts, inputs["advantages"].tolist()):
            trained.append((int(trainer.state.global_step), re.search(r"p\d{3}", text).group(0), adv))
        return loss(model, inputs, *a, **kw)

    trainer.compute_loss = spy
    trainer.train()
    return {"gd": gd, "trainer": trainer, "truth": truth, "trained": trained, "level": level,
            "state": folder / "STATE", "ids": ids}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for name, mode, cap in (("prefilter", "prefilter", 8), ("uniform", "uniform", 8), ("cap", "uniform", 2)):
        if name == "cap":
            logging.getLogger("graphdiff").addHandler(handler := _Capture())
        out[name] = _train(tmp_path_factory.mktemp(name), mode, cap)
        if name == "cap":
            logging.getLogger("graphdiff").removeHandler(handler)
            out[name]["warnings"] = handler.lines
    return out


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _groups(truth, step):
    """{prompt id: rewards} of every group generated while the trainer was at ``step``."""
    out: dict[str, list[float]] = {}
    for t, pid, r in truth:
        if t == step:
            out.setdefault(pid, []).append(r)
    return out


@pytest.mark.parametrize("name", ["prefilter", "uniform"])
def test_every_trained_group_has_signal(runs, name):
    r = runs[name]
    assert r["trainer"].state.global_step == STEPS and len(r["gd"].ds_log) == STEPS
    refills = 0
    for rec in r["gd"].ds_log:
        t = rec.trainer_step
        rewards = _groups(r["truth"], t)
        seen = {}
        for step, pid, adv in r["trained"]:
            if step == t:
                seen.setdefault(pid, []).append(adv)
        assert sorted(seen) == sorted(rec.kept) and len(seen) == B  # the loss saw exactly the kept groups
        for pid, adv in seen.items():
            assert len(adv) == N_GEN and any(a != 0 for a in adv)
            s = sum(x >= 1.0 for x in rewards[pid])
            assert 0 < s < N_GEN, (name, t, pid, rewards[pid])  # the rewards the trainer computed: a signal
        for pid in rec.filtered:  # the dropped groups were all-equal
            assert len(set(rewards[pid])) == 1
        for pid in rec.surplus:
            assert len(set(rewards[pid])) == 2
        assert not rec.padded and not rec.cap_hit
        refills += rec.rounds > 1
    assert refills >= 1  # DS had to refill: the test exercised merging rounds


@pytest.mark.parametrize("name", ["prefilter", "uniform", "cap"])
def test_every_generated_rollout_is_applied_to_the_state(runs, name):
    r = runs[name]
    entries = StateDir.open(r["state"]).log_entries()
    assert [e["step"] for e in entries] == list(range(STEPS + 1))
    history = {h["step"]: h for h in r["trainer"].state.log_history if "graphdiff/groups_generated" in h}
    for rec in r["gd"].ds_log:
        rows = [x for x in r["truth"] if x[0] == rec.trainer_step]
        ids, n, s = count_outcomes(rows)
        assert len(rows) == rec.rollouts == N_GEN * sum(len(g) for g in rec.generated)
        e = entries[rec.trainer_step + 1]
        assert e["rollouts"] == len(rows) and e["successes"] == int(s.sum()) and e["prompts"] == len(ids)
        # a prompt is generated at most once a step: refills draw from the prompts not yet generated
        assert sorted(ids) == sorted(p for g in rec.generated for p in g)
        h = history[rec.trainer_step + 1]  # the counters reached the trainer's own log
        assert h["graphdiff/groups_generated"] == len(ids)
        assert h["graphdiff/groups_kept"] == len(rec.kept) and h["graphdiff/groups_filtered"] == len(rec.filtered)
        assert h["graphdiff/groups_padded"] == len(rec.padded) and h["graphdiff/generation_rounds"] == rec.rounds
        assert h["graphdiff/skipped_before_generation"] == len(rec.skipped)
        assert h["graphdiff/rollouts_generated"] == len(rows)
        # the pre-filter's reads of the estimates are timed (estimator overhead); uniform DS reads none
        assert h["graphdiff/prefilter_seconds"] == pytest.approx(rec.prefilter_seconds)
        assert (rec.prefilter_seconds > 0) == (name == "prefilter")  # "cap" runs uniform DS
        assert len(rec.kept) + len(rec.padded) + len(rec.filtered) + len(rec.surplus) == len(ids)


def test_round_cap_is_honoured_and_reported(runs):
    r = runs["cap"]
    recs = r["gd"].ds_log
    assert all(rec.rounds <= 2 for rec in recs)
    hit = [rec for rec in recs if rec.cap_hit]
    assert hit, [(rec.rounds, len(rec.kept)) for rec in recs]  # half the prompts are zero-variance
    history = {h["step"]: h for h in r["trainer"].state.log_history if "graphdiff/round_cap_hit" in h}
    for rec in recs:
        assert history[rec.trainer_step + 1]["graphdiff/round_cap_hit"] == float(rec.cap_hit)
        assert rec.cap_hit == (rec.rounds == 2 and len(rec.kept) < B)
    for rec in hit:
        assert len(rec.kept) + len(rec.padded) == B and rec.padded
        assert any(f"trainer step {rec.trainer_step}: {len(rec.kept)} of {B} groups with signal after 2 rounds"
                   in line for line in r["warnings"])
        padded = {pid: [a for t, p, a in r["trained"] if t == rec.trainer_step and p == pid] for pid in rec.padded}
        for pid, adv in padded.items():  # zero-variance groups fill the batch and carry no gradient signal
            assert len(adv) == N_GEN and all(a == 0 for a in adv)
            assert len(set(_groups(r["truth"], rec.trainer_step)[pid])) == 1


def test_prefilter_skips_what_the_state_predicts_zero_variance(runs):
    r, u = runs["prefilter"], runs["uniform"]
    level = r["level"]
    draws = r["gd"].draws
    assert all(d.skipped.size == 0 for d in u["gd"].draws)  # plain DS skips nothing
    learned = [d for d in draws if d.estimator_step >= 2]
    skipped = np.concatenate([d.skipped_pzv for d in learned])
    chosen = np.concatenate([d.chosen_pzv for d in learned])
    assert skipped.size >= 10 and skipped.mean() > chosen.mean() + 0.3
    # what was skipped is what the STATE says is zero-variance, read back from the STATE at that step
    st = State.open(r["state"])
    ids = r["ids"]
    names = [ids[int(x)] for d in learned for x in d.skipped]
    zero_topics = sum(level[p] in (0.0, 1.0) for p in names)
    assert zero_topics >= 0.8 * len(names)
    final = st.estimates(names, group_size=N_GEN)["p_zero_variance"]
    assert np.mean(final) > 0.8
    # and the pre-filter pays: fewer zero-variance groups generated than plain DS after the first steps
    def zv_generated(run):
        return sum(level[p] in (0.0, 1.0) for rec in run["gd"].ds_log[2:] for g in rec.generated for p in g)

    assert zv_generated(r) < zv_generated(u)


def test_ds_off_leaves_trls_generation_alone(runs, tmp_path):
    from graphdiff_cli.core.graph import drop_self, exact_knn, mutual_knn_graph
    from graphdiff_cli.estimator import Estimator

    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 4))
    est = Estimator(mutual_knn_graph(*drop_self(*exact_knn(x, 4), 4)), np.arange(12) % 2, 2, device="cpu")

    class Fake:
        def __init__(self):
            self.callback_handler = type("H", (), {"callbacks": []})()

    fake = Fake()
    GraphdiffTRL(est).attach(fake)
    assert "_generate_and_score_completions" not in vars(fake)
    assert "_generate_and_score_completions" in vars(runs["uniform"]["trainer"])


def test_refusals():
    with pytest.raises(InvalidArgumentError, match="leave strategy out"):
        GraphdiffTRL.__init__(object.__new__(GraphdiffTRL), "x", dynamic_sampling=True, strategy="target")
    with pytest.raises(InvalidArgumentError, match="dynamic_sampling must be"):
        ds.check_mode("greso")
    with pytest.raises(InvalidArgumentError, match="prefilter_explore must lie in"):
        ds.check_explore_p(0)
    gd = object.__new__(GraphdiffTRL)
    gd._last_call = None
    with pytest.raises(InvalidArgumentError, match="wrapped by gd.reward"):
        gd._ds_round(lambda inputs: {}, [{}] * 4, 4)
    gd2 = object.__new__(GraphdiffTRL)

    def fake_generate(inputs):
        gd2._last_call = (["a", "a", "b", "a"], [1.0, 0.0, 1.0, 0.0])
        return {}

    with pytest.raises(DataError, match="not one prompt's group"):
        gd2._ds_round(fake_generate, [{}] * 4, 4)


class _Target:
    """A target whose p_zero_variance is given per node (the pre-filter's only input)."""

    def __init__(self, pzv):
        self.pzv, self.step, self.ids = np.asarray(pzv, float), 0, [str(i) for i in range(len(pzv))]

    def retired(self):
        return np.zeros(0, np.int64)

    def estimates(self, nodes, group_size):
        return {"p_zero_variance": self.pzv[nodes]}


def test_prefilter_rule_keeps_with_probability_max_of_one_minus_pzv_and_explore():
    pzv = np.r_[np.ones(50), np.zeros(50)]
    draw = ds.CandidateDraw(_Target(pzv), np.arange(100), 10, 4, mode="prefilter", explore=0.01)
    chosen = np.concatenate([draw.draw([s]).chosen for s in range(300)])
    share = np.mean(chosen < 50)  # a certain zero-variance prompt is kept 1% of the times it is visited
    assert 0.0 < share < 0.03
    half = ds.CandidateDraw(_Target(np.full(40, 0.5)), np.arange(40), 4, 4, explore=0.01)
    visits = [half.draw([s]) for s in range(400)]
    skipped = sum(d.skipped.size for d in visits)
    assert abs(skipped / (skipped + 4 * 400) - 0.5) < 0.04  # skip probability = p_zero_variance
    # the whole candidate set visited with too few survivors: filled from the skipped, lowest p first
    few = ds.CandidateDraw(_Target(np.r_[np.full(6, 1.0), [0.97, 0.2]]), np.arange(8), 4, 4, explore=0.001)
    d = few.draw([1], exclude=[7])
    assert d.chosen.size == 4 and 6 in d.chosen and 7 not in d.chosen and d.extra["filled_from_skipped"] >= 3
    u = ds.CandidateDraw(_Target(pzv), np.arange(100), 10, 4, mode="uniform").draw([0], exclude=range(95))
    assert sorted(u.chosen.tolist()) == [95, 96, 97, 98, 99] and u.skipped.size == 0


def test_merge_rounds_repads_and_recounts():
    import torch

    a = {"prompt_ids": torch.tensor([[5, 6]] * 4), "prompt_mask": torch.ones(4, 2, dtype=torch.long),
         "completion_ids": torch.tensor([[7]] * 4), "completion_mask": torch.ones(4, 1, dtype=torch.long),
         "advantages": torch.tensor([1.0, -1.0, 0.0, 0.0]), "num_items_in_batch": torch.tensor(4)}
    b = {"prompt_ids": torch.tensor([[9, 5, 6]] * 4), "prompt_mask": torch.ones(4, 3, dtype=torch.long),
         "completion_ids": torch.tensor([[7, 8, 0]] * 4), "completion_mask": torch.tensor([[1, 1, 0]] * 4),
         "advantages": torch.tensor([0.0, 0.0, 2.0, -2.0]), "num_items_in_batch": torch.tensor(8)}
    m = _merge_rounds([(a, [0]), (b, [1])], 2, pad_id=0)
    assert m["prompt_ids"].tolist() == [[0, 5, 6], [0, 5, 6], [9, 5, 6], [9, 5, 6]]
    assert m["prompt_mask"].tolist() == [[0, 1, 1]] * 2 + [[1, 1, 1]] * 2
    assert m["completion_ids"].tolist() == [[7, 0, 0]] * 2 + [[7, 8, 0]] * 2
    assert m["advantages"].tolist() == [1.0, -1.0, 2.0, -2.0]
    assert int(m["num_items_in_batch"]) == 1 + 1 + 2 + 2
