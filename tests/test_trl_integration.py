"""graphdiff inside a real ``trl.GRPOTrainer`` on the CPU, end to end.

A tiny causal LM is built from a config and a 60-word tokenizer is built in the test (no download),
32 prompts with a rule-based reward, 4 optimiser steps. Checked: the STATE advanced
exactly one step per trainer step, each with exactly the rewards the trainer computed (per prompt, and
against the trainer's own logged mean reward); the prompts the trainer generated for are the ones the
graphdiff sampler chose; and each choice is the pool's closest-to-0.5 prompts under the estimates of
the estimator step it records (re-derived here by replaying the applied steps on a fresh estimator).
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("trl", reason="trl is not installed (pip install 'graphdiff-rl[trl]')")
pytestmark = pytest.mark.slow  # ~40 s on 2 busy cores, most of it importing transformers and trl

from _handoff_fixtures import make_inputs  # noqa: E402
from graphdiff_cli.errors import DataError, StateError  # noqa: E402
from graphdiff_cli.estimator import Estimator  # noqa: E402
from graphdiff_cli.integrations.tracking import count_outcomes  # noqa: E402
from graphdiff_cli.integrations.trl import GraphdiffTRL  # noqa: E402
from graphdiff_cli.io.state_dir import StateDir  # noqa: E402
from graphdiff_cli.state import State  # noqa: E402

N_PROMPTS, N_GEN, PER_STEP, STEPS = 32, 4, 4, 4


WORDS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]", "Problem", "add", "the", "numbers", *[f"p{i:03d}" for i in range(N_PROMPTS)],
         *[str(d) for d in range(10)], "plus", "is", "so", "answer"]


def _tokenizer():
    """A word-level tokenizer over a 60-word vocabulary, built here (no download; a 30k-word vocabulary,
    e.g. the bundled MiniLM tokenizer's, works too but makes every step about ten times slower on a CPU)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]",
                                   bos_token="[BOS]", eos_token="[EOS]")


def _tiny_lm(tok):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return LlamaForCausalLM(cfg)


def _rule(completion: str, level: float) -> float:
    """Rule-based correctness: a checksum of the completion against the prompt's difficulty level."""
    return float((zlib.crc32(completion.encode()) % 100) < 100 * level)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    folder = tmp_path_factory.mktemp("trl")
    graph, clusters, ids = make_inputs(folder, n=N_PROMPTS, k_states=4, prefix="p")
    state = folder / "STATE"
    State.init(graph, clusters, state, device="cpu", durable=False)
    levels = {pid: 0.1 + 0.8 * (i % 4) / 3 for i, pid in enumerate(ids)}  # topic i % 4 sets the level
    ds = Dataset.from_list([{"prompt": f"Problem {pid} add the numbers", "id": pid, "level": levels[pid]}
                            for pid in ids])

    truth: list[tuple[int, str, float]] = []  # what the reward function computed, seen from the test

    def correctness(prompts, completions, id, level, trainer_state, **kwargs):
        out = [_rule(c, lv) for c, lv in zip(completions, level)]
        truth.extend((trainer_state.global_step, i, r) for i, r in zip(id, out))
        return out

    gd = GraphdiffTRL(state, strategy="target", pool_factor=2.0, seed=3, durable=False)
    tok = _tokenizer()
    args = GRPOConfig(output_dir=str(folder / "out"), per_device_train_batch_size=PER_STEP * N_GEN,
                      num_generations=N_GEN, max_completion_length=6, max_steps=STEPS, learning_rate=1e-3,
                      beta=0.0, logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, seed=0,
                      dataloader_num_workers=0, disable_tqdm=True)
    trainer = GRPOTrainer(model=_tiny_lm(tok), processing_class=tok, args=args, train_dataset=ds,
                          reward_funcs=[gd.reward(correctness)])
    gd.attach(trainer)
    trainer.train()
    return {"gd": gd, "trainer": trainer, "truth": truth, "state": state, "ids": ids, "graph": graph,
            "clusters": clusters}


def test_one_state_step_per_trainer_step_with_the_trainers_rewards(run):
    gd, trainer, truth = run["gd"], run["trainer"], run["truth"]
    assert trainer.state.global_step == STEPS
    assert [e["step"] for e in gd.applied] == list(range(1, STEPS + 1))
    sd = StateDir.open(run["state"])
    assert sd.current_step == STEPS
    log = sd.log_entries()
    assert [e["step"] for e in log] == list(range(STEPS + 1))
    logged_reward = {h["step"]: h["reward"] for h in trainer.state.log_history if "reward" in h}
    for t in range(1, STEPS + 1):
        rows = [r for r in truth if r[0] == t - 1]  # generated during step t (global_step t - 1 then)
        assert len(rows) == PER_STEP * N_GEN
        ids, n, s = count_outcomes(rows)
        e = gd.applied[t - 1]
        assert e["ids"] == ids and e["n"].tolist() == n.tolist() and e["s"].tolist() == s.tolist()
        assert n.tolist() == [N_GEN] * PER_STEP
        assert log[t]["rollouts"] == PER_STEP * N_GEN and log[t]["successes"] == int(s.sum())
        assert log[t]["prompts"] == PER_STEP
        # the trainer's own logged mean reward for that step is the same number
        assert logged_reward[t] == pytest.approx(s.sum() / n.sum())
    assert len(gd.recorder) == 0
    # the rewards were informative: not all zero, not all one
    total = sum(r[2] for r in truth)
    assert 0 < total < len(truth)


def test_the_trainer_trained_on_the_samplers_choices(run):
    gd, truth = run["gd"], run["truth"]
    decisions = gd.chooser.decisions
    assert len(decisions) >= STEPS
    ids = run["ids"]
    for t in range(1, STEPS + 1):
        generated = [r[1] for r in truth if r[0] == t - 1]
        chosen = [ids[r] for r in decisions[t - 1].chosen]
        assert generated == [pid for pid in chosen for _ in range(N_GEN)]


def test_choices_follow_the_predictions_of_the_step_they_used(run):
    gd = run["gd"]
    from graphdiff_cli.core import decisions as dec
    from graphdiff_cli.io.estimator_store import read_model

    _, ids, w, labels, config = read_model(run["state"] / "model.zarr")
    cfg = {k: v for k, v in config.items() if k != "n_states"}
    cfg["device"] = "cpu"
    est = Estimator(w, labels, config["n_states"], **cfg)
    index = {pid: i for i, pid in enumerate(ids)}
    at_step = {0: est.estimates()}
    for e in gd.applied:
        est.update(np.array([index[i] for i in e["ids"]]), e["n"], e["s"])
        at_step[e["step"]] = est.estimates()
    steps_used = [d.estimator_step for d in gd.chooser.decisions]
    # accelerate reads one batch ahead: batch k (k >= 1) is chosen from the estimates after step k - 1
    assert steps_used[:STEPS] == [0] + list(range(STEPS - 1))
    moved = 0
    for d in gd.chooser.decisions:
        e = {k: v[d.pool] for k, v in at_step[d.estimator_step].items()}
        assert np.allclose(d.p, e["p"], atol=1e-5)
        # the chosen are the PER_STEP smallest of the target rule's key over the belief (|mean - 0.5|, shrunk
        # by select's exploration; exact ties broken by the seed)
        key = dec.select("target", PER_STEP, p=e["mean"], variance=e["variance"], target=0.5,
                         explore=gd.explore, seed=0).key
        picked = np.isin(d.pool, d.chosen)
        assert picked.sum() == PER_STEP
        assert np.allclose(np.sort(key[picked]), np.sort(key)[:PER_STEP], atol=1e-9)
        moved += d.estimator_step > 0
    assert moved >= 2  # later choices used updated estimates, not the prior


def test_step_metrics_reach_the_trainers_log(run):
    """graphdiff's per-step scalars are in the trainer's own log history (what report_to sends to W&B /
    TensorBoard), each checked against the trainer's figures or an estimator replayed here."""
    gd, trainer = run["gd"], run["trainer"]
    from graphdiff_cli.io.estimator_store import read_model

    _, ids, w, labels, config = read_model(run["state"] / "model.zarr")
    cfg = {k: v for k, v in config.items() if k != "n_states"}
    est = Estimator(w, labels, config["n_states"], **{**cfg, "device": "cpu"})
    index = {pid: i for i, pid in enumerate(ids)}
    logs = {h["step"]: h for h in trainer.state.log_history if "graphdiff/step" in h}
    assert sorted(logs) == list(range(1, STEPS + 1))
    for e in gd.applied:
        h = logs[e["step"]]
        nodes = np.array([index[i] for i in e["ids"]])
        before = est.estimates(nodes, group_size=N_GEN)
        assert h["graphdiff/mean_p"] == pytest.approx(before["mean"].mean(), abs=1e-6)
        assert h["graphdiff/predicted_effective"] == pytest.approx(1 - before["p_zero_variance"].mean(), abs=1e-6)
        est.update(nodes, e["n"], e["s"])
        # the observed figures are the trainer's own: its mean reward and its share of zero-spread groups
        assert h["graphdiff/success_rate"] == pytest.approx(h["reward"])
        assert h["graphdiff/effective"] == pytest.approx(1 - h["frac_reward_zero_std"])
        assert h["graphdiff/step"] == e["step"] and h["graphdiff/prompts"] == PER_STEP
        assert h["graphdiff/update_seconds"] > 0
        assert h["graphdiff/kappa"] == est.kappa_
        assert ("graphdiff/propagation" in h) == (est.propagation_ is not None)
    assert 0 < np.mean([logs[t]["graphdiff/effective"] for t in logs]) < 1  # informative, not constant


def test_step_metrics_without_grpo_metrics_go_through_on_log():
    """A Trainer without GRPO's metric window gets the scalars from the callback's on_log, averaged."""
    from graphdiff_cli.core.graph import drop_self, exact_knn, mutual_knn_graph

    rng = np.random.default_rng(1)
    x = rng.normal(size=(12, 4))
    nbr, sim = drop_self(*exact_knn(x, 4), 4)
    gd = GraphdiffTRL(Estimator(mutual_knn_graph(nbr, sim), np.arange(12) % 2, 2, device="cpu"))
    gd._trainer = object()  # attached to something without _metrics
    r = gd.reward(lambda prompts, completions, **kw: [1.0, 0.0, 1.0, 1.0])
    for step in (0, 1):
        r(prompts=["."] * 4, completions=["."] * 4, id=["1", "1", "5", "5"],
          trainer_state=type("S", (), {"global_step": step}))
        gd.apply_step(step + 1)
    logs = {"loss": 1.0}
    gd.callback().on_log(None, None, None, logs=logs)
    assert logs["graphdiff/success_rate"] == pytest.approx(0.75) and logs["graphdiff/effective"] == 0.5
    assert logs["graphdiff/step"] == 1.5  # the window's mean, like TRL's own metrics
    again = {}
    gd.callback().on_log(None, None, None, logs=again)
    assert again == {}  # taken once


def test_resume_refuses_a_state_ahead_of_the_trainer(run, tmp_path):
    gd = GraphdiffTRL(run["state"], durable=False)
    with pytest.raises(StateError, match=r"STATE is at step 4 but the trainer resumes after step 2: its steps 3..4 would count twice; roll the STATE back \(graphdiff rollback --to 2\)"):
        gd.check_resume(2)
    with pytest.raises(StateError, match="trainer step 3 cannot follow estimator step 4"):
        gd.target.apply(3, [], np.zeros(0), np.zeros(0))


def test_reward_wrapper_refuses_data_without_ids(run):
    gd = GraphdiffTRL(run["state"], durable=False)
    wrapped = gd.reward(lambda prompts, completions, **kw: [1.0] * len(completions))
    assert wrapped.__name__ == "<lambda>"
    with pytest.raises(DataError, match="no 'id' column"):
        wrapped(prompts=["a"], completions=["b"], trainer_state=None)


def test_in_memory_estimator_and_empty_steps():
    from graphdiff_cli.core.graph import drop_self, exact_knn, mutual_knn_graph

    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 4))
    nbr, sim = drop_self(*exact_knn(x, 4), 4)
    est = Estimator(mutual_knn_graph(nbr, sim), np.arange(12) % 2, 2, device="cpu")
    gd = GraphdiffTRL(est, ids=[f"x{i}" for i in range(12)])
    r = gd.reward(lambda prompts, completions, **kw: [1.0, 0.0, 1.0, 1.0])
    r(prompts=["."] * 4, completions=["."] * 4, id=["x1", "x1", "x5", "x5"], trainer_state=type("S", (), {"global_step": 0}))
    e = gd.apply_step(1)
    assert e["ids"] == ["x1", "x5"] and e["n"].tolist() == [2, 2] and e["s"].tolist() == [1, 2]
    assert est.step_ == 1 and est.successes_[[1, 5]].tolist() == [1, 2]
    e = gd.apply_step(2)  # reused generations: nothing new, still one (empty) step
    assert e["rows"] == 0 and est.step_ == 2 and est.rollouts_.sum() == 4
    r(prompts=["."] * 4, completions=["."] * 4, id=["x1", "zz", "x5", "x5"], trainer_state=type("S", (), {"global_step": 2}))
    with pytest.raises(DataError, match="unknown prompt id 'zz'"):
        gd.apply_step(3)
    assert est.step_ == 2
