"""Closed-loop benchmark smoke test: two real TRL GRPO steps of one graphdiff scheduler on a tiny policy.

Checked: the prompt families and exact-match verifier; the schedulers' pure parts (pools paired by seed,
allocation budget, DAPO's filter); then a real ``GRPOTrainer`` run of ``gd-thompson`` for two steps: the
loop ran both steps, every rollout's outcome was recorded (per step, B prompts x group rollouts, the
counts graphdiff's TRL integration applied are the loop's own), the estimator advanced exactly one step
per trainer step and its estimates moved, the metrics file is well-formed, and the report aggregates it;
the live-feature arm (gd-live-ds) and the HIVE-style peer for two steps each (the live features reach the
estimator, HIVE's check prunes, a rollout budget stops a run), and the covariates-only peer's estimates.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from closedloop import schedulers as sch
from closedloop import tasks
from graphdiff_cli.errors import InvalidArgumentError
from _tolerances import FLOAT64

ROOT = Path(__file__).resolve().parents[1]

B, G, STEPS = 4, 4, 2


def _approx(tol: dict) -> dict:
    """A ``_tolerances`` entry as ``pytest.approx``'s keywords."""
    return {"rel": tol["rtol"], "abs": tol["atol"]}


def test_tasks_are_verifiable_and_graded():
    train, test, sft = tasks.make_splits(train_per_cell=5, test_per_cell=2, sft_per_cell=3, seed=1)
    assert len(train) == 5 * len(tasks.SKILLS) * len(tasks.LEVELS)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert len({r["id"] for r in train + test + sft}) == len(train) + len(test) + len(sft)
    for r in train:
        assert tasks.verify(" " + r["answer"] + " ", r["answer"]) == 1.0
        assert tasks.verify(r["answer"] + "0", r["answer"]) == 0.0
        if r["skill"] == "add":
            a, b = (int(x) for x in r["prompt"].replace("+", " ").replace("=", " ").replace("?", " ").replace(":", " ")
                    .split() if x.isdigit())
            assert r["answer"] == str(a + b)
        if r["skill"] == "sort":
            assert list(r["answer"]) == sorted(r["answer"]) and len(r["answer"]) == r["level"] + 2
    # harder levels are longer problems
    lens = {lv: np.mean([len(r["prompt"]) for r in train if r["skill"] == "reverse" and r["level"] == lv])
            for lv in tasks.LEVELS}
    assert lens[4] > lens[1]


def test_sft_noise_is_systematic_per_cell():
    """The SFT data's wrong answers follow each family's typical error at the cell's rate; pool and test are clean."""
    rho = tasks.cell_noise(0.1, 0.7, seed=5)
    assert len(rho) == len(tasks.SKILLS) * len(tasks.LEVELS)
    assert np.allclose(sorted(rho.values()), np.linspace(0.1, 0.7, len(rho)))
    assert rho != tasks.cell_noise(0.1, 0.7, seed=6)  # the order is drawn from the seed
    clean = tasks.make_splits(train_per_cell=3, test_per_cell=1, sft_per_cell=300, seed=2)
    noisy = tasks.make_splits(train_per_cell=3, test_per_cell=1, sft_per_cell=300, seed=2, sft_noise=(0.1, 0.7))
    assert noisy[0] == clean[0] and noisy[1] == clean[1]  # the pool and the held-out set keep right answers
    for (skill, level), rate in rho.items():
        pairs = [(a, b) for a, b in zip(clean[2], noisy[2]) if a["skill"] == skill and a["level"] == level]
        assert all(a["prompt"] == b["prompt"] for a, b in pairs)
        bad = [(a, b) for a, b in pairs if b["noisy"]]
        assert abs(len(bad) / len(pairs) - rate) < 0.12, (skill, level, len(bad) / len(pairs), rate)
        for a, b in pairs:
            if b["noisy"]:
                assert b["answer"] == tasks.wrong_answer(a) != a["answer"]
            else:
                assert b["answer"] == a["answer"]
    with pytest.raises(InvalidArgumentError, match="sft noise"):
        tasks.cell_noise(0.5, 1.0, seed=0)


def test_scheduler_pure_parts():
    a = sch.Scheduler("mopps", 200, 8, 8, seed=3, belief=sch.make_belief("mopps", 200))
    b = sch.Scheduler("greso", 200, 8, 8, seed=3, belief=sch.make_belief("greso", 200))
    assert np.array_equal(a._pool(5, 32), b._pool(5, 32))  # paired candidate pools
    assert not np.array_equal(a._pool(5, 32), a._pool(6, 32))
    # MoPPS keeps prompts whose posterior is near 0.5 once outcomes are in
    a.update(np.arange(200), np.full(200, 8), np.where(np.arange(200) % 2 == 0, 8, 4))
    plan = a.plan(1)
    assert plan.nodes.size == 8 and len(set(plan.nodes.tolist())) == 8
    assert (plan.nodes % 2 == 1).mean() >= 0.75
    h = sch.Scheduler("history-alloc", 200, 8, 4, seed=0, belief=sch.make_belief("history", 200), units_per_prompt=2,
                      max_units=4)
    h.update(np.arange(200), np.full(200, 8), np.where(np.arange(200) % 2 == 0, 8, 4))
    p = h.plan(2)
    assert p.units.sum() == 16 and p.units.min() >= 1 and p.units.max() <= 4
    assert p.units[p.nodes % 2 == 1].mean() > p.units[p.nodes % 2 == 0].mean()  # p = 0.5 gets more groups
    with pytest.raises(InvalidArgumentError, match="planned by graphdiff's TRL integration"):
        sch.Scheduler("ds", 200, 8, 8, seed=0).plan(1)


def test_the_oracle_measures_each_candidate_once_per_policy_version():
    """The oracle reads the policy's pass rate (>= 32 samples), once per node and optimiser step, batched."""
    version, calls = [0], []
    rate = np.linspace(0.0, 1.0, 50)

    def measure(nodes, samples):
        calls.append(nodes.tolist())
        return np.round(rate[nodes] * samples).astype(np.int64)

    o = sch.OracleBelief(measure, lambda: version[0], samples=32)
    e = o.beliefs(np.array([0, 49, 25, 0]), group_size=8)
    assert calls == [[0, 25, 49]]  # one batched call, each node once
    assert e["p"].tolist() == [0.0, 1.0, 0.5, 0.0]
    assert e["p_zero_variance"][0] > 0.75 and e["p_zero_variance"][2] < 0.05  # Beta(s + 1, n - s + 1) of it
    o.beliefs(np.array([25, 30]), 8)
    assert calls[-1] == [30]  # 25 is cached at this policy version
    version[0] = 1
    o.beliefs(np.array([25]), 8)
    assert calls[-1] == [25] and o.measured == 5  # a new policy: measured again
    assert o.update(np.array([1]), np.array([8]), np.array([8])) == {}  # rollouts teach it nothing
    with pytest.raises(InvalidArgumentError, match="at least 32"):
        sch.OracleBelief(measure, lambda: 0, samples=16)
    bad = sch.OracleBelief(lambda nodes, k: np.full(nodes.size, k + 1), lambda: 0)
    with pytest.raises(InvalidArgumentError, match="0..samples"):
        bad.beliefs(np.array([1]), 8)


def test_greso_feeds_the_products_ds_prefilter_through_a_belief_target():
    """BeliefTarget hands GRESO's skip probability to CandidateDraw (the product's pre-filter) and learns
    from every applied step; GRESO's keep rule max(p_e^z, 0.01) is the pre-filter's max(1 - pzv, explore)."""
    from graphdiff_cli.integrations.dynamic_sampling import CandidateDraw

    ids = [f"p{i}" for i in range(100)]
    t = sch.BeliefTarget(sch.make_belief("greso", 100), ids)
    easy = np.arange(50)  # all-correct 4 times: GRESO skips them with probability 1 - max(p_e^4, 0.01)
    for step in (1, 2, 3, 4):
        t.apply(step, [ids[i] for i in easy], np.full(50, 8), np.full(50, 8))
    assert t.step == 4
    pzv = t.estimates(np.arange(100), 8)["p_zero_variance"]
    assert np.all(pzv[:50] > 0.9) and np.all(pzv[50:] == 0.0)
    draw = CandidateDraw(t, np.arange(100), batch_size=20, group_size=8, mode="prefilter")
    d = draw.draw(0)
    assert (d.chosen >= 50).mean() >= 0.85 and (d.skipped < 50).all()
    plain = sch.BeliefTarget(None, ids)  # plain DS reads no estimate
    assert np.isnan(plain.estimates(np.arange(3), 8)["p_zero_variance"]).all()


def _graph_over(rows):
    """A similarity graph linking prompts of one (skill, level) cell: ring + chords (no embedding model)."""
    import scipy.sparse as sp

    cell = {}
    for i, r in enumerate(rows):
        cell.setdefault((r["skill"], r["level"]), []).append(i)
    i_, j_ = [], []
    for members in cell.values():
        m = len(members)
        for k in range(m):
            for d in (1, 2):
                i_.append(members[k])
                j_.append(members[(k + d) % m])
    w = sp.coo_matrix((np.full(len(i_), 0.8), (i_, j_)), shape=(len(rows), len(rows))).tocsr()
    w = ((w + w.T) > 0).astype(np.float64) * 0.8
    w.setdiag(0)
    w.eliminate_zeros()
    labels = np.array([sorted(cell).index((r["skill"], r["level"])) for r in rows], dtype=np.int64)
    return w.tocsr(), labels, len(cell)


def _tiny_policy(path):
    """A 1-layer policy warm-started for 3 SFT steps on a 2-prompts-per-cell task set, saved at ``path``;
    returns (train, test) rows."""
    from closedloop.policy import build_model, build_tokenizer, save_policy, supervised_warmup

    train, test, sft = tasks.make_splits(train_per_cell=4, test_per_cell=1, sft_per_cell=4, seed=2)
    tok = build_tokenizer(tasks.alphabet(train + test + sft))
    model = build_model(tok, hidden=32, layers=1, heads=2, intermediate=64, seed=0)
    supervised_warmup(model, tok, sft, steps=3, batch_size=16)
    save_policy(model, tok, path)
    return train, test


def test_sampling_reads_each_prompt_once_and_draws_as_repeating_it_would():
    """``generate`` prefills a prompt once for all its samples (``heldout`` once for its greedy and sampled
    completions); with the same sequences per call the sampler draws the same numbers as the plain way (each
    prompt repeated), so the completions are the same."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from closedloop.policy import build_model, build_tokenizer, generate, heldout, supervised_warmup

    train, test, sft = tasks.make_splits(train_per_cell=2, test_per_cell=1, sft_per_cell=8, seed=2)
    tok = build_tokenizer(tasks.alphabet(train + test + sft))
    model = build_model(tok, hidden=64, layers=2, heads=2, intermediate=128, seed=0)
    supervised_warmup(model, tok, sft, steps=100, batch_size=32, lr=3e-3)  # attends by position: a prefix
    # numbered unlike generate's continuation would change most completions (23 of 192 left the same)
    prompts = [r["prompt"] for r in train]  # 48 prompts of different lengths (left padding)
    assert len({len(p) for p in prompts}) > 3
    read = []  # input tokens the model is run over, per call (prefix, prefill and each decoding step)
    model.model.register_forward_pre_hook(lambda mod, args, kw: read.append(kw["input_ids"].numel()),
                                          with_kwargs=True)
    for n, greedy in ((4, False), (3, False), (2, True)):
        kw = dict(greedy=greedy, batch_size=4 * n, seed=7, max_new_tokens=6)
        read.clear()
        shared = generate(model, tok, prompts, num_samples=n, **kw)
        read_shared = sum(read)
        read.clear()
        flat = generate(model, tok, [p for p in prompts for _ in range(n)], num_samples=1, **kw)
        prompt_tokens = sum(len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts)
        assert sum(read) - read_shared > (n - 1) * prompt_tokens  # each prompt was read once, not n times
        assert [len(c) for c in shared] == [n] * len(prompts)
        assert [t for c in shared for t in c] == [c[0] for c in flat]
        assert len({t for c in shared for t in c}) > (len(prompts) if not greedy else 1)  # not comparing blanks
    # one evaluation reads each prompt once for its greedy and its sampled completions, and gives both
    ok, counts = heldout(model, tok, train, 4, max_new_tokens=6, seed=7, batch_size=16)
    sampled = generate(model, tok, prompts, num_samples=4, greedy=False, batch_size=16, seed=7, max_new_tokens=6)
    greedy = generate(model, tok, prompts, num_samples=1, greedy=True, max_new_tokens=6)
    assert counts.tolist() == [sum(tasks.verify(c, r["answer"]) for c in cs) for cs, r in zip(sampled, train)]
    assert ok.tolist() == [tasks.verify(c[0], r["answer"]) for c, r in zip(greedy, train)]
    assert 0 < counts.sum() < 4 * len(train) and 0 < ok.sum() < len(train)  # not all right or all wrong
    # the caller's random stream is left where it was
    for call in (lambda: generate(model, tok, prompts[:5], num_samples=4, greedy=False, seed=1),
                 lambda: heldout(model, tok, train[:5], 4, seed=1)):
        torch.manual_seed(3)
        before = torch.rand(1)
        torch.manual_seed(3)
        call()
        assert torch.equal(torch.rand(1), before)


@pytest.mark.slow
def test_two_grpo_steps_with_graphdiff(tmp_path):
    pytest.importorskip("trl")
    from graphdiff_cli import Estimator
    from closedloop.loop import RunConfig, run
    from closedloop.report import write_report
    from graphdiff_cli.estimator import preset_settings

    train, test = _tiny_policy(tmp_path / "policy")
    w, labels, k = _graph_over(train)
    made = []

    def factory():
        est = Estimator(w, labels, n_states=k, **preset_settings("default"))
        made.append(est)
        return est

    fresh = factory().estimates(np.arange(len(train)), group_size=8)
    cfg = RunConfig(scheduler="gd-thompson", seed=0, steps=STEPS, batch_prompts=B, group_size=G, pool_factor=2.0,
                    eval_every=1, max_completion_length=6)
    out = tmp_path / "runs" / "gd-thompson" / "s0"
    summary = run(cfg, train, test, tmp_path / "policy", out, graphdiff_factory=factory, log=lambda *a: None)

    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(0.0 <= r["heldout_acc"] <= 1.0 for r in rows)
    assert all(0.0 <= r["heldout_sampled"] <= 1.0 for r in rows)  # and the sampled pass rate beside it
    for r in rows:  # per (skill, level) cell too
        cells = r["heldout_acc_by_cell"]
        assert set(cells) <= {f"{s}{lv}" for s in tasks.SKILLS for lv in tasks.LEVELS} and cells
        assert all(0.0 <= v <= 1.0 for v in cells.values())
    for r in rows[1:]:
        assert r["rollouts"] == B * G and r["prompts"] == B
        assert 0 <= r["effective"] <= r["prompts"] and r["effective_rate"] == pytest.approx(r["effective"] / B)
        assert r["all_correct"] + r["all_wrong"] + r["effective"] == B
        assert r["step_seconds"] > 0 and r["estimator_seconds"] > 0
        assert r["plan"]["pool"] == 2 * B
    assert rows[2]["cum_rollouts"] == 2 * B * G
    outcomes = [json.loads(x) for x in (out / "outcomes.jsonl").read_text().splitlines()]
    assert [o["step"] for o in outcomes] == [1, 2]
    assert all(sum(o["n"]) == B * G and all(n == G for n in o["n"]) for o in outcomes)
    assert all(0 <= s <= n for o in outcomes for n, s in zip(o["n"], o["s"]))
    # the estimator advanced exactly one step per trainer step, with those outcomes
    assert summary["graphdiff_applied_steps"] == [1, 2] and summary["estimator_step"] == 2
    est = made[-1]
    assert est.step_ == 2
    after = est.estimates(np.arange(len(train)), group_size=8)
    seen = [train.index(next(r for r in train if r["id"] == i)) for o in outcomes for i in o["ids"]]
    assert not np.allclose(after["p"][seen], fresh["p"][seen])
    total = sum(sum(o["s"]) for o in outcomes)
    assert rows[1]["mean_reward"] * B * G + rows[2]["mean_reward"] * B * G == pytest.approx(total)
    # the step-2 plan was made before step 1's outcomes could be applied or after: never from the future
    assert rows[2]["estimator_step_at_plan"] in (0, 1)

    res = write_report(tmp_path / "runs", tmp_path / "report")
    assert res["runs"] == 1
    assert (tmp_path / "report" / "report.md").read_text().count("gd-thompson") >= 1


def test_the_task_family_can_be_narrowed_to_some_skills():
    train, test, sft = tasks.make_splits(train_per_cell=3, test_per_cell=1, sft_per_cell=2, seed=0,
                                         skills=["compare", "sort"], sft_noise=(0.1, 0.7))
    assert {r["skill"] for r in train + test + sft} == {"compare", "sort"}
    assert len(train) == 3 * 2 * len(tasks.LEVELS)
    with pytest.raises(InvalidArgumentError, match="skills must be some of"):
        tasks.make_splits(skills=["juggle"])


def test_a_stage_error_is_one_line_with_the_error_exit_code(tmp_path):
    """`python -m closedloop` (from the repository root) reports a graphdiff_cli error in one line."""
    res = subprocess.run([sys.executable, "-m", "closedloop", "data", "--out", str(tmp_path / "d"), "--skills", "juggle"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("closedloop data: error: skills must be some of") and res.stderr.count("\n") == 1
    assert not (tmp_path / "d").exists()


def test_its_settings_are_declared_in_the_workflow_schema():
    """Every key of the closedloop section has a type, a default and a description; the defaults are the
    published grid (configs/closedloop.yaml), and the enums are the code's skills and schedulers."""
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())["properties"]["closedloop"]
    assert schema["type"] == "object" and schema["additionalProperties"] is False

    def defaults(node):
        if node.get("type") == "object" and "properties" in node:
            return {k: defaults(v) for k, v in node["properties"].items()}
        assert "description" in node and "default" in node and "type" in node, node
        return node["default"]

    published = yaml.safe_load((ROOT / "configs/closedloop.yaml").read_text())["closedloop"]
    assert defaults(schema) == published
    assert schema["properties"]["schedulers"]["items"]["enum"] == list(sch.SCHEDULERS)
    assert schema["properties"]["data"]["properties"]["skills"]["items"]["enum"] == list(tasks.SKILLS)


@pytest.mark.slow
def test_two_grpo_steps_of_dynamic_sampling_and_an_oracle_arm(tmp_path):
    """Plain DS and the oracle-fed pre-filtered DS, each two real TRL steps through the product's
    ``GraphdiffTRL(dynamic_sampling=...)``: every generated rollout is counted (outcomes, metrics and DS tally
    agree), the trainer gets B groups, the round cap is reported, and the oracle's measurements (32 per
    candidate it read) are logged apart from the rollouts."""
    pytest.importorskip("trl")
    from closedloop.loop import RunConfig, run
    from closedloop.report import write_report

    train, test = _tiny_policy(tmp_path / "policy")
    rounds = 3
    for name in ("ds", "oracle-ds"):
        cfg = RunConfig(scheduler=name, seed=0, steps=STEPS, batch_prompts=B, group_size=G, eval_every=2,
                        max_completion_length=6, max_rounds=rounds)
        out = tmp_path / "runs" / name / "s0"
        summary = run(cfg, train, test, tmp_path / "policy", out, log=lambda *a: None)
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        outcomes = [json.loads(x) for x in (out / "outcomes.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [0, 1, 2] and "heldout_acc" in rows[2] and "heldout_acc" not in rows[1]
        for r, o in zip(rows[1:], outcomes):
            d = r["ds"]
            assert r["rollouts"] == sum(o["n"]) == d["rollouts_generated"] == d["groups_generated"] * G
            assert r["prompts"] == len(o["ids"]) == len(set(o["ids"])) == d["groups_generated"]
            assert d["groups_generated"] == B * d["generation_rounds"]  # whole rounds of B prompts
            assert d["groups_kept"] + d["groups_padded"] == B == r["trained_prompts"]
            assert d["groups_kept"] == min(B, r["effective"])
            assert (d["round_cap_hit"] == 1.0) == (d["groups_kept"] < B) and d["generation_rounds"] <= rounds
        assert summary["rollouts"] == rows[-1]["cum_rollouts"] == sum(sum(o["n"]) for o in outcomes)
        assert summary["ds_round_cap_hits"] == sum(r["ds"]["round_cap_hit"] for r in rows[1:])
        assert summary["graphdiff_applied_steps"] == [1, 2] and summary["estimator_step"] == 2
        if name == "ds":
            assert "oracle" not in summary and all(r["ds"]["skipped_before_generation"] == 0 for r in rows[1:])
        else:  # the oracle measured what the pre-filter read: 32 completions each, none of them a rollout
            cost = summary["oracle"]
            assert cost["candidates"] > 0 and cost["completions"] == 32 * cost["candidates"] and cost["seconds"] > 0
            assert sum(r["oracle"]["completions"] for r in rows[1:]) <= cost["completions"]
            assert cost["completions"] != summary["rollouts"]
    res = write_report(tmp_path / "runs", tmp_path / "report")
    assert res["runs"] == 2
    assert "oracle-ds" in (tmp_path / "report" / "report.md").read_text()


def test_verdicts_of_two_grids_mark_what_flips(tmp_path, capsys):
    """Two reports' figures paired by name: an interval that crosses its null in one grid and excludes it in the
    other is a flip (ratios against 1, differences and shares against 0), so is a sign test or a target that
    changes; a censored saving, a share of an oracle gain that is not above 0 and an undecided sign test are not
    decided; figures of one grid only are listed apart; the schedulers' order is compared by Kendall's tau; the
    command writes its files and an unreadable report is one line on stderr."""
    from closedloop.__main__ import main
    from closedloop.verdicts import agreement, rows

    def b(value, lo, hi):
        return {"value": value, "lo": lo, "hi": hi, "se": 0.01, "mdd": 0.03, "seeds": 6}

    def metrics(ratio, diff, wins, p, met, accs, skip_gain=b(0.03, 0.02, 0.04), extra=False):
        m = {"schedulers": {n: [{"final_acc": a}, {"final_acc": a + 0.002}] for n, a in accs.items()},
             "ds_equal_steps": {"gd-ds": {"rollout_ratio": ratio, "final_difference": {"heldout_acc": diff}}},
             "saving_along_ds": {"gd-ds": {"0.25": b(1.05, 0.9, 1.2), "0.5": b(0.0, 0.0, 0.0),
                                           "1.0": b(0.5, 0.0, 1.2)}},
             "oracle_share": [{"rule": "skip", "metric": "heldout_acc", "estimator": e, "oracle_gain_acc": skip_gain,
                               "share_acc": b(0.3, 0.1, 0.5), "seeds": [{"budget": 20480.0}]}
                              for e in ("greso", "gd-skip")]
             + [{"rule": "pre", "metric": "heldout_acc", "estimator": e, "oracle_gain_acc": b(0.01, 0.005, 0.02),
                 "share_acc": b(0.1, -0.2, 0.3), "seeds": [{"budget": budget}]}
                for e, budget in (("greso-ds", 60928.0), ("gd-ds", 62720.0))],
             "sign_tests": {"acc_at_equal_rollouts": {"pairs": 18, "graphdiff_better": wins,
                                                      "native_better": 18 - wins, "p_value": p},
                            "effective_rate (secondary)": {"pairs": 18, "graphdiff_better": 9, "native_better": 9,
                                                           "p_value": None}},
             "targets": [{"target": "t1", "measured": "x", "met": met}],
             "regime_check": [{"check": "c1", "measured": "y", "met": None}]}
        if extra:
            m["ds_equal_steps"]["oracle-ds"] = {"rollout_ratio": ratio}
        return m

    accs_a = {"uniform": 0.60, "mopps": 0.62, "gd-thompson": 0.61, "greso": 0.615, "ds": 0.66, "oracle-ds": 0.655}
    accs_c = {"uniform": 0.60, "mopps": 0.61, "gd-thompson": 0.62, "greso": 0.615, "ds": 0.66, "oracle-ds": 0.655}
    a = metrics(b(0.95, 0.9, 0.99), b(-0.01, -0.02, -0.005), 4, 0.03, False, accs_a)
    c = metrics(b(1.05, 0.95, 1.1), b(-0.004, -0.012, 0.003), 7, 0.5, True, accs_c,
                skip_gain=b(0.01, -0.01, 0.03), extra=True)
    ra = {r["figure"]: r["verdict"] for r in rows(a)}
    assert ra["gd-ds: DS's rollouts / its own, equal steps"] == "below"  # against 1, not 0
    assert ra["gd-ds: rollouts to DS's greedy accuracy after 0.25 of its steps, DS's / its own"] == "across"
    assert ra["gd-ds: rollouts to DS's greedy accuracy after 0.5 of its steps, DS's / its own"] is None  # no width
    assert ra["gd-ds: rollouts to DS's greedy accuracy after 1.0 of its steps, DS's / its own"] is None  # censored
    assert ra["gd-ds: final greedy accuracy - DS's"] == "below"
    # one gain row where a rule's estimators read it at the same rollouts, one per estimator where they do not
    assert ra["skip: the oracle's gain in greedy accuracy"] == "above" and "skip, gd-skip: the oracle's gain" \
        " in greedy accuracy" not in ra
    assert {f for f in ra if f.startswith("pre, ") and ": the oracle's gain" in f} == {
        "pre, greso-ds: the oracle's gain in greedy accuracy", "pre, gd-ds: the oracle's gain in greedy accuracy"}
    assert ra["skip, gd-skip: share of the oracle's gain in greedy accuracy"] == "above"
    assert ra["sign test, graphdiff vs native: acc_at_equal_rollouts"] == "native"
    assert ra["sign test, graphdiff vs native: effective_rate (secondary)"] is None  # every pair tied: no p
    assert ra["c1"] is None and ra["t1"] == "not met"
    rc = {r["figure"]: r["verdict"] for r in rows(c)}
    assert rc["skip, gd-skip: share of the oracle's gain in greedy accuracy"] is None  # a share of no gain
    res = agreement(a, c)
    assert res["counts"]["figure"]["flipped"] == ["gd-ds: DS's rollouts / its own, equal steps",
                                                  "gd-ds: final greedy accuracy - DS's",
                                                  "skip: the oracle's gain in greedy accuracy",
                                                  "sign test, graphdiff vs native: acc_at_equal_rollouts"]
    assert res["counts"]["figure"]["decided"] == 9 and res["counts"]["figure"]["same"] == 5
    assert res["counts"]["target"] == {"decided": 1, "same": 0, "flipped": ["t1"]}
    assert res["one_sided"] == ["oracle-ds: DS's rollouts / its own, equal steps"]
    assert res["kendall_tau"]["all"]["tau"] < 1.0 and res["final_acc"]["ds"] == pytest.approx((0.661, 0.661))
    assert res["kendall_tau"]["equal_budget"]["schedulers"] == ["uniform", "mopps", "gd-thompson", "greso"]
    assert agreement(a, a)["counts"]["figure"]["flipped"] == [] and agreement(a, a)["one_sided"] == []

    for name, m in (("one", a), ("two", c)):
        (tmp_path / name / "report").mkdir(parents=True)
        (tmp_path / name / "report" / "metrics.json").write_text(json.dumps(m))
    main(["verdicts", str(tmp_path / "one" / "report"), str(tmp_path / "two" / "report"), "--out",
          str(tmp_path / "v" / "verdicts.md"), "--json", str(tmp_path / "v" / "pairs.json")])
    md = (tmp_path / "v" / "verdicts.md").read_text()
    assert "verdict one | verdict two" in md and "**flipped**" in md and "5 of 9 decided figures agree" in md
    assert json.loads((tmp_path / "v" / "pairs.json").read_text())["counts"] == res["counts"]
    assert sorted(p.name for p in (tmp_path / "v").iterdir()) == ["pairs.json", "verdicts.md"]
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metrics.json").write_text('{"oracle_share": [{"rule": "x"')  # cut short mid-write
    (tmp_path / "wrong").mkdir()
    (tmp_path / "wrong" / "metrics.json").write_text('{"oracle_share": [{"rule": "x"}]}')  # JSON, not a report
    with pytest.raises(ValueError, match="named twice"):
        rows({"targets": [{"target": "t", "measured": "x", "met": True}] * 2})
    capsys.readouterr()
    for argv in (["verdicts", str(tmp_path / "one" / "report"), str(tmp_path / "none"), "--out", str(tmp_path / "x.md")],
                 ["verdicts", str(tmp_path / "one" / "report"), str(tmp_path / "bad"), "--out", str(tmp_path / "x.md")],
                 ["verdicts", str(tmp_path / "one" / "report"), str(tmp_path / "wrong"), "--out", str(tmp_path / "x.md")],
                 ["verdicts", str(tmp_path / "one" / "report"), str(tmp_path / "two" / "report"), "--out",
                  str(tmp_path / "x.json")],
                 ["verdicts", str(tmp_path / "one" / "report"), str(tmp_path / "two" / "report"), "--out",
                  str(tmp_path / "x.md"), "--json", str(tmp_path)]):
        with pytest.raises(SystemExit) as err:
            main(argv)
        assert err.value.code != 0 and not (tmp_path / "x.md").exists() and not (tmp_path / "x.json").exists()
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("closedloop verdicts: error:"), lines


def test_scores_against_ds_and_the_oracle():
    """Rollouts to DS's final accuracy, the share of the oracle's gain (accuracy and rollouts), the bootstrap."""
    from closedloop import scores

    def rows(accs, per_step):
        return [{"step": 10 * i, "cum_rollouts": 10 * i * per_step, "heldout_acc": a} for i, a in enumerate(accs)]

    runs = {"ds": {s: rows([0.4, 0.45, 0.5, 0.6], 400) for s in range(6)},
            "oracle-ds": {s: rows([0.4, 0.6, 0.6, 0.6], 200) for s in range(6)},
            "gd-ds": {s: rows([0.4, 0.5, 0.6, 0.6], 200) for s in range(6)},
            "flat": {s: rows([0.4, 0.4, 0.4, 0.4], 200) for s in range(6)}}
    # DS reaches 0.6 at 12,000 rollouts; the oracle at 2,000 (6x), graphdiff at 4,000 (3x); never: 0
    assert set(scores.saving_vs_ds(runs, "oracle-ds").values()) == {6.0}
    assert set(scores.saving_vs_ds(runs, "gd-ds").values()) == {3.0}
    assert set(scores.saving_vs_ds(runs, "flat").values()) == {0.0}
    sh = scores.oracle_share(runs, "ds", "gd-ds", "oracle-ds")
    ro = scores.share_stats(sh["seeds"], "rollouts")
    assert ro["value"] == pytest.approx((12000 - 4000) / (12000 - 2000)) and ro["lo"] == ro["hi"] == ro["value"]
    acc = scores.share_stats(sh["seeds"], "acc")  # at 6,000 rollouts: ds 0.45 + 1.5/4 x 0.05, gd 0.6, oracle 0.6
    assert 0.0 < acc["value"] <= 1.0
    one = scores.bootstrap([0.4])  # one seed: a value and no interval
    assert one["value"] == 0.4 and one["lo"] is None and one["mdd"] is None
    b = scores.bootstrap([0.1, 0.2, 0.0, 0.3, 0.1, 0.2])
    assert b["lo"] < b["value"] < b["hi"] and b["mdd"] == pytest.approx(scores.Z_MDD * b["se"])
    assert scores.cell_shares([{"ids": ["tr-sort2-0001", "tr-compare1-0003"], "n": [8, 24]}]) == \
        {"compare1": 0.75, "sort2": 0.25}
    zv = scores.zero_variance_share([{"step": t, "prompts": 4, "all_correct": t - 1, "all_wrong": 1} for t in (1, 2)],
                                    window=2)
    assert zv == [{"steps": "1-2", "all_correct": 1 / 8, "all_wrong": 2 / 8}]


def test_the_live_arms_targets():
    """gd-live-ds against DS and its two peers per seed (both halves in the same >= 5 of 6 seeds), graphdiff's best
    share against the covariates-only peer's, the estimator's share of the arm's step; undecided below 6 seeds of
    any arm compared."""
    from closedloop import scores

    def rows(accs, per_step, est=0.0, plan=0.0):
        return [{"step": 10 * i, "cum_rollouts": 10 * i * per_step, "heldout_acc": a, "step_seconds": 1.0,
                 "estimator_seconds": est + plan, "estimator_plan_seconds": plan} for i, a in enumerate(accs)]

    six = range(6)
    runs = {"ds": {s: rows([0.4, 0.45, 0.5, 0.6], 400) for s in six},  # DS: 0.6 at 12,000 rollouts, all it used
            "gd-live-ds": {s: rows([0.4, 0.6, 0.6, 0.6], 150, 0.05) for s in six},  # 0.6 at 1,500: 0.125 of DS's
            "greso-ds": {s: rows([0.4, 0.5, 0.6, 0.6], 200) for s in six},  # 4,000
            "hive-ds": {s: rows([0.4, 0.45, 0.5, 0.55], 200) for s in six},  # never
            # seed 3: 0.105 s, more than 0.1 of the trainer step, less of the arm's (the plan made outside it: 0.1 s)
            "gd-skip": {s: rows([0.4, 0.5], 100, 0.005 if s == 3 else 0.02, 0.1 if s == 3 else 0.0) for s in six}}
    runs["gd-live-ds"][5] = rows([0.4, 0.5, 0.55, 0.6], 400, 0.05)  # seed 5: 12,000, as DS, more than greso-ds
    share = lambda rule, est, v, n=6: {"rule": rule, "metric": "heldout_acc", "estimator": est,  # noqa: E731
                                       "share_acc": {"value": v, "lo": v - 0.2, "hi": v + 0.2, "seeds": n}}
    sel, skip = "target-difficulty selection", "zero-variance skipping"
    shares = [share(sel, "gd-thompson", 0.1), share(sel, "gd-live-thompson", 0.5), share(sel, "cells-live-thompson", 0.45),
              share(skip, "gd-skip", 0.3), share(skip, "gd-live-skip", 0.2), share(skip, "cells-live-skip", 0.1)]
    t = {x["id"]: x for x in scores.live_targets(runs, shares)}
    assert sorted(t) == ["ds", "ds-peers", "ds-rollouts", "overhead", "selection-share", "skipping-share"]
    frac = {r["seed"]: r["fraction_of_ds"] for r in t["ds"]["per_seed"]}
    assert frac == pytest.approx({0: 0.125, 1: 0.125, 2: 0.125, 3: 0.125, 4: 0.125, 5: 1.0}, **_approx(FLOAT64))
    # seed 5 needs all of DS's rollouts and more than greso-ds: both halves fail there, and only there
    assert [r["met"] for r in t["ds"]["per_seed"]] == [True] * 5 + [False]
    assert t["ds"]["measured"] == "both in 5 of 6 seeds" and t["ds"]["met"] is True
    assert t["ds-rollouts"]["measured"].startswith("5 of 6 seeds") and t["ds-rollouts"]["met"] is True
    assert t["ds-peers"]["measured"] == "5 of 6 seeds" and t["ds-peers"]["met"] is True
    # each half in 5 seeds but not the same 5: the target (both in one seed) is not met
    split = {**runs, "gd-live-ds": dict(runs["gd-live-ds"])}
    split["gd-live-ds"][0] = rows([0.4, 0.45, 0.5, 0.6], 150, 0.05)  # 4,500: 0.375 of DS's, more than greso-ds
    split["gd-live-ds"][5] = rows([0.4, 0.5, 0.6, 0.6], 350, 0.05)  # 7,000: under hive's never, not greso's 4,000
    split["greso-ds"] = {**runs["greso-ds"], 5: rows([0.4, 0.45, 0.5, 0.6], 400)}  # 12,000: seed 5 beats both
    ts = {x["id"]: x for x in scores.live_targets(split, shares)}
    assert [r["half_of_ds"] for r in ts["ds"]["per_seed"]] == [True] * 5 + [False]
    assert [r["fewer_than_peers"] for r in ts["ds"]["per_seed"]] == [False] + [True] * 5
    assert ts["ds-rollouts"]["met"] is True and ts["ds-peers"]["met"] is True and ts["ds"]["met"] is False
    assert t["selection-share"]["met"] is True and t["selection-share"]["measured"].startswith("gd-live-thompson 0.50")
    assert t["skipping-share"]["met"] is False  # the best of the two, gd-skip, recovers < 0.4
    assert t["skipping-share"]["measured"].startswith("gd-skip 0.30")
    cost = t["overhead"]
    assert cost["per_arm"]["gd-skip"][3] == pytest.approx(0.105 / 1.1, **_approx(FLOAT64)) and cost["per_arm"]["gd-skip"][0] == pytest.approx(0.02, **_approx(FLOAT64))
    assert cost["met"] is True and cost["per_arm"]["gd-live-ds"][0] == pytest.approx(0.05, **_approx(FLOAT64))
    slow = {**runs, "gd-live-ds": {**runs["gd-live-ds"], 2: rows([0.4, 0.6, 0.6, 0.6], 150, 0.11)}}
    assert {x["id"]: x for x in scores.live_targets(slow, shares)}["overhead"]["met"] is False
    # five seeds: measured, not decided; nor with the covariates-only peer at five seeds
    five = {k: {s: r for s, r in v.items() if s < 5} for k, v in runs.items()}
    shares5 = [{**x, "share_acc": {**x["share_acc"], "seeds": 5}} for x in shares]
    assert all(x["met"] is None for x in scores.live_targets(five, shares5))
    peer5 = [x if not x["estimator"].startswith("cells-") else {**x, "share_acc": {**x["share_acc"], "seeds": 5}}
             for x in shares]
    t5 = {x["id"]: x for x in scores.live_targets(runs, peer5)}
    assert t5["selection-share"]["met"] is None and t5["skipping-share"]["met"] is None


def test_rollouts_to_reads_the_isotonic_fit_not_one_lucky_evaluation():
    """One evaluation that lands high by noise does not count as reaching a level on the fitted curve (it does
    on the raw one); a crossing between evaluations is interpolated on the fitted curve."""
    from closedloop import scores

    def rows(accs, per_eval):
        return [{"step": 5 * i, "cum_rollouts": i * per_eval, "heldout_acc": a} for i, a in enumerate(accs)]

    lucky = rows([0.40, 0.62, 0.45, 0.50, 0.60], 1000)
    x, y = scores.curve(lucky)
    assert np.all(np.diff(y) >= 0) and y[1] == pytest.approx((0.62 + 0.45 + 0.50) / 3)
    assert scores.rollouts_to(lucky, 0.6, smooth=False) == 1000.0  # the raw first evaluation at or above
    assert scores.rollouts_to(lucky, 0.6) == pytest.approx(4000.0)  # the fit reaches 0.6 only at the end
    # between the fit's 0.4 at 0 and 0.5233 at 1000: 0.5 is crossed at 1000 x 0.1 / 0.1233
    assert scores.rollouts_to(lucky, 0.5) == pytest.approx(1000 * 0.1 / (y[1] - 0.4))
    ds = rows([0.40, 0.55, 0.50, 0.60, 0.60], 2000)  # fitted final 0.6, first reached at 6,000
    assert scores.final(ds) == pytest.approx(0.6) and scores.rollouts_to(ds, 0.6) == pytest.approx(6000.0)
    runs = {"ds": {s: ds for s in range(6)}, "lucky": {s: lucky for s in range(6)}}
    assert list(scores.saving_vs_ds(runs, "lucky").values()) == pytest.approx([1.5] * 6)
    assert list(scores.saving_vs_ds(runs, "lucky", smooth=False).values()) == pytest.approx([6.0] * 6)


def test_the_ds_family_at_equal_steps_and_along_ds_curve():
    """An arm that keeps DS's pace with 0.6x its rollouts saves 1/0.6 at DS's earlier accuracies but ends level
    with DS, so at DS's final value the saving is censored; equal steps read the ratio and the difference."""
    from closedloop import scores

    accs = [0.40, 0.45, 0.50, 0.55, 0.60]

    def rows(acc, per_step):
        return [{"step": 10 * i, "cum_rollouts": 10 * i * per_step, "heldout_acc": a} for i, a in enumerate(acc)]

    runs = {"ds": {s: rows(accs, 1000) for s in range(6)},
            "pace": {s: rows(accs, 600) for s in range(6)},
            "short": {s: rows([a - 0.01 if i else a for i, a in enumerate(accs)], 600) for s in range(6)}}
    along = scores.saving_along_ds(runs, "pace")
    assert sorted(along) == [0.25, 0.5, 0.75, 1.0]
    for f in (0.25, 0.5, 0.75, 1.0):  # level with DS all the way: reaches each level at 0.6x the rollouts
        assert list(along[f].values()) == pytest.approx([1000 / 600] * 6)
    short = scores.saving_along_ds(runs, "short")
    assert list(short[1.0].values()) == [0.0] * 6  # 0.01 below DS at the end: never reaches its final value
    assert 1.0 < short[0.5][0] < 1000 / 600  # DS's mid-run accuracy is reached, a little later than by "pace"
    eq = scores.equal_steps_vs_ds(runs, "short")
    assert [r["rollout_ratio"] for r in eq] == pytest.approx([1000 / 600] * 6)
    assert [r["final_difference"] for r in eq] == pytest.approx([-0.01] * 6)
    assert not any(r["reached"] for r in eq) and all(r["reached"] for r in scores.equal_steps_vs_ds(runs, "pace"))
    assert scores.ds_checkpoint_levels(runs["ds"][0], (0.25, 0.5, 1.0)) == [(0.25, 0.45), (0.5, 0.5), (1.0, 0.6)]


def test_device_choice_is_refused_in_one_line_without_a_gpu():
    """``--device auto`` runs on the CPU where torch sees no GPU; ``--device cuda`` there is a one-line error."""
    torch = pytest.importorskip("torch")
    from closedloop.__main__ import _device
    from graphdiff_cli.errors import InvalidArgumentError

    assert _device("cpu") == "cpu"
    if torch.cuda.is_available():
        assert _device("auto") == _device("cuda") == "cuda"
        return
    assert _device("auto") == "cpu"
    with pytest.raises(InvalidArgumentError, match="no GPU"):
        _device("cuda")


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU (none visible to torch)")
def test_an_oracle_ds_run_on_the_gpu(tmp_path):
    """The policy trains, generates, is evaluated and measured by the oracle on the GPU: two real TRL steps of
    the oracle-fed pre-filtered DS with the same bookkeeping as on the CPU."""
    pytest.importorskip("trl")
    from closedloop.loop import RunConfig, run

    train, test = _tiny_policy(tmp_path / "policy")
    cfg = RunConfig(scheduler="oracle-ds", seed=0, steps=2, batch_prompts=B, group_size=G, eval_every=2,
                    max_completion_length=6, max_rounds=3, device="cuda")
    summary = run(cfg, train, test, tmp_path / "policy", tmp_path / "run", log=lambda *a: None)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert summary["steps"] == 2 and summary["rollouts"] == rows[-1]["cum_rollouts"] > 0
    assert summary["oracle"]["completions"] == 32 * summary["oracle"]["candidates"] > 0


def test_scores_guard_falling_ds_unequal_steps_and_unfinished_runs(tmp_path):
    """DS that ends below its raw start gives no saving (the fit's pooled start cannot make it "improved"); a
    non-monotone DS curve is read through its fit along the way; runs of unequal length are not compared at
    equal steps; a run without summary.json (cut short) is not read."""
    from closedloop import scores
    from closedloop.report import load_runs
    from graphdiff_cli.errors import InvalidArgumentError

    def rows(acc, per_eval, every=10):
        return [{"step": every * i, "cum_rollouts": i * per_eval, "heldout_acc": a} for i, a in enumerate(acc)]

    falling = rows([0.50, 0.45, 0.44, 0.46, 0.47], 1000)
    assert scores.curve(falling)[1][0] < 0.50 and scores.start(falling) == 0.50
    runs = {"ds": {0: falling}, "arm": {0: rows([0.50, 0.5, 0.5, 0.5, 0.5], 500)}}
    assert scores.saving_vs_ds(runs, "arm") == {0: None}
    assert all(v == {0: None} for v in scores.saving_along_ds(runs, "arm").values())
    # DS with a lucky mid-run evaluation: its 1/2 level is the fitted (pooled) value, not the lucky one
    lucky = rows([0.40, 0.50, 0.62, 0.55, 0.60], 1000)
    assert scores.ds_checkpoint_levels(lucky, (0.5,)) == [(0.5, pytest.approx((0.62 + 0.55) / 2))]
    arm = rows([0.40, 0.50, 0.585, 0.60, 0.62], 600)
    along = scores.saving_along_ds({"ds": {0: lucky}, "arm": {0: arm}}, "arm", fractions=(0.5,))
    own = 1000 + 1000 * (0.585 - 0.50) / (0.585 - 0.50)  # DS's fit: 0.50 at 1000, 0.585 at 2000
    assert along[0.5][0] == pytest.approx(own / 1200.0)  # the arm reaches 0.585 at its third evaluation
    with pytest.raises(InvalidArgumentError, match="same length"):
        scores.equal_steps_vs_ds({"ds": {0: lucky}, "arm": {0: rows([0.4, 0.5], 600)}}, "arm")
    # an uncensored run (longer than DS's) is read at DS's last step, where it was evaluated
    longer = rows([0.40, 0.50, 0.585, 0.60, 0.62, 0.70, 0.71], 600)
    eq = scores.equal_steps_vs_ds({"ds": {0: lucky}, "arm": {0: longer}}, "arm")
    assert eq == scores.equal_steps_vs_ds({"ds": {0: lucky}, "arm": {0: arm}}, "arm")  # its first 40 steps: arm
    unevaluated = [r for r in longer if r["step"] != 40]
    with pytest.raises(InvalidArgumentError, match="not evaluated at step 40"):
        scores.equal_steps_vs_ds({"ds": {0: lucky}, "arm": {0: unevaluated}}, "arm")
    # unfinished runs are skipped by the report's reader
    for name, done in (("ds", True), ("arm", False)):
        d = tmp_path / name / "s0"
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lucky))
        if done:
            (d / "summary.json").write_text("{}")
    assert set(load_runs(tmp_path)) == {"ds"}


def test_batch_runner_reuses_finished_runs_and_reads_seed_ranges(tmp_path):
    """bench/closedloop_batch.py: "0-2,5" is seeds 0, 1, 2, 5; a run folder holding summary.json is not run again."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import closedloop_batch as cb
    finally:
        sys.path.pop(0)
    assert cb.seeds_of("0-2,5") == [0, 1, 2, 5]
    done = tmp_path / "runs" / "uniform" / "s0"
    done.mkdir(parents=True)
    (done / "summary.json").write_text("{}")
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "closedloop_batch.py"), "--data", str(tmp_path),
                          "--policy", str(tmp_path), "--runs", str(tmp_path / "runs"), "--schedulers", "uniform",
                          "--seeds", "0", "--jobs", "1"], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert lines[0]["cached"] is True and lines[-1] == {**lines[-1], "runs": 1, "failed": 0}


def test_live_feature_arms_and_the_hive_peer_for_two_steps(tmp_path):
    """graphdiff with the task's (skill, level) as covariates and the policy's live features (gd-live-ds) and
    the HIVE-style peer (hive-ds), each two real TRL steps of the product's DS: the live features reach the
    estimator (graphdiff's live read-out has learnt 2 features), their forward passes are timed as a share of
    the step, HIVE's entropy check prunes candidates the pre-filter then skips; and the uncensored regime's
    rollout budget stops a run at the first step that reaches it."""
    pytest.importorskip("trl")
    from graphdiff_cli import Estimator
    from graphdiff_cli.estimator import preset_settings
    from closedloop.loop import RunConfig, run

    train, test = _tiny_policy(tmp_path / "policy")
    w, labels, k = _graph_over(train)
    x = sch.cell_covariates(train)
    assert x.shape == (len(train), len(tasks.SKILLS) + len(tasks.LEVELS)) and set(np.unique(x)) == {0.0, 1.0}
    factory = lambda: Estimator(w, labels, n_states=k, **preset_settings("default"))  # noqa: E731
    budget = B * G + 1  # one round of step 1 leaves it short; two steps always reach it
    for name, steps, rollout_budget in (("gd-live-ds", STEPS, 0), ("hive-ds", 4, budget)):
        cfg = RunConfig(scheduler=name, seed=0, steps=steps, batch_prompts=B, group_size=G, eval_every=2,
                        max_completion_length=6, max_rounds=3, rollout_budget=rollout_budget)
        out = tmp_path / "runs" / name / "s0"
        summary = run(cfg, train, test, tmp_path / "policy", out, graphdiff_factory=factory, log=lambda *a: None)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]
        live = summary["live"]
        assert live["passes"] > 0 and live["candidates"] >= B and live["seconds"] > 0
        assert all(r["live_seconds"] > 0 and 0 < r["live_share"] < 1 for r in rows)
        assert live["seconds"] == pytest.approx(sum(r["live_seconds"] for r in rows), **_approx(FLOAT64))
        if name == "gd-live-ds":
            assert [r["step"] for r in rows] == [1, 2] and "rollout_budget" not in summary
            assert live["statistics"]["features"] == 2 and live["statistics"]["gram_entries"] == 9
        else:
            assert live["statistics"]["pruned"] > 0  # the entropy check acted ...
            assert sum(r["plan"]["skipped_before_generation"] for r in rows) > 0  # ... and the pre-filter skipped
            cum = [r["cum_rollouts"] for r in rows]
            assert cum[-1] >= budget and all(c < budget for c in cum[:-1]) and len(rows) <= 2
            assert summary["rollout_budget"] == {"budget": budget, "reached": True, "step_cap": 4}
            assert "heldout_acc" in rows[-1]  # evaluated where it stopped
    from closedloop.report import write_report

    res = write_report(tmp_path / "runs", tmp_path / "report")
    assert res["runs"] == 2
    metrics = json.loads((tmp_path / "report" / "metrics.json").read_text())
    assert set(metrics["live_cost"]) == {"gd-live-ds", "hive-ds"}
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## The live features' cost" in report and "## The live arms' targets" in report
    assert any("live features included" in t["target"] for t in metrics["live_targets"])


def test_the_covariates_only_peer_learns_cells_and_live_features():
    """CellLive: a cell's estimate is its shrunk, forgotten success rate; live features move it once fitted; a
    read without them gets the cell mean."""
    x = np.repeat(np.eye(2), 50, axis=0)  # two cells of 50 prompts
    est = sch.CellLive(x, forgetting=1.0, ridge=1e-6)
    ids = np.arange(100)
    live = np.column_stack([np.where(ids % 2 == 0, 0.0, 1.0)])  # feature 1: the prompt succeeds more
    s = np.where(ids < 50, 2, 6) + 2 * (ids % 2)
    est.update(ids, np.full(100, 8), s, live=live)
    m = est.estimates(ids)["p"]
    g = 500 / 800  # the global rate the cells are shrunk to
    assert m[:50] == pytest.approx((150 + g) / 401, **_approx(FLOAT64))
    assert m[50:] == pytest.approx((350 + g) / 401, **_approx(FLOAT64))
    with_live = est.estimates(ids, live=live)["p"]
    # 2 of 8 more for feature 1; the slope's ridge (1e-6 against 50 prompts a feature value) shrinks it by ~1e-8
    assert with_live[1] - with_live[0] == pytest.approx(0.25, abs=1e-6)
    assert est.live_statistics()["pairs"] == 100
