"""``graphdiff select`` and ``graphdiff allocate`` on a real STATE directory: picks checked against the
``predict`` table by hand, file formats, one JSON object, and refusals that write nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from _handoff_fixtures import make_inputs, step_rows, write_outcomes
from graphdiff_cli.cli.app import app
from graphdiff_cli.core import decisions as dec
from graphdiff_cli.state import State

runner = CliRunner()


def gd(*args, code=0):
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == code, (res.exit_code, res.stdout, res.stderr, res.exception)
    return res


def gd_json(*args) -> dict:
    res = gd(*args, "--json")
    assert res.stdout.count("\n") == 1, res.stdout
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    folder = tmp_path_factory.mktemp("select")
    graph, clusters, ids = make_inputs(folder, n=40)
    out = folder / "STATE"
    State.init(graph, clusters, out, device="cpu", durable=False)
    for t in (1, 2):
        State.open(out, durable=False).update(t, write_outcomes(folder / f"o{t}.jsonl", step_rows(ids, t, batch=16)))
    gd("predict", "--state", out, "--out", folder / "pred.jsonl")
    pred = {}
    for line in (folder / "pred.jsonl").read_text().splitlines():
        r = json.loads(line)
        pred[r["id"]] = r
    return out, ids, pred


def _read_jsonl(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def _explored_distance(r, target, explore):
    """|mean - target| after `explore` pseudo-rollouts at the target join the Beta(a, b) of predict's row."""
    m, v = r["mean"], r["variance"]
    w = m * (1 - m) / v - 1  # a + b
    a, b = m * w, (1 - m) * w
    return abs((a + explore * target) / (a + b + explore) - target)


def test_select_target_picks_the_closest_to_half(state, tmp_path):
    root, ids, pred = state
    pool = ids[3:15]
    (tmp_path / "cand.txt").write_text("\n".join(pool) + "\n\n")
    res = gd_json("select", "--state", root, "--candidates", tmp_path / "cand.txt", "--batch-size", 4,
                  "--strategy", "target", "--explore", 0, "--out", tmp_path / "chosen.jsonl")
    dist = {i: abs(pred[i]["mean"] - 0.5) for i in pool}  # the belief's mean, as predict writes it
    rows = _read_jsonl(tmp_path / "chosen.jsonl")
    assert [r["id"] for r in rows] == res["ids"] and len(set(res["ids"])) == 4 and set(res["ids"]) <= set(pool)
    # the 4 closest to 0.5 (exact ties, e.g. unseen prompts of one state, are broken by the seed)
    assert [dist[i] for i in res["ids"]] == pytest.approx(sorted(dist.values())[:4])
    assert [r["rank"] for r in rows] == [1, 2, 3, 4]
    assert all(r["p"] == pytest.approx(pred[r["id"]]["p"]) for r in rows)
    assert res["step"] == 2 and res["pool"] == 12 and res["batch_size"] == 4
    # the chosen prompts are predicted to carry more signal than the pool on average
    assert res["predicted_effective_share"]["chosen"] >= res["predicted_effective_share"]["pool"]
    # another target
    res = gd_json("select", "--state", root, "--candidates", tmp_path / "cand.txt", "--batch-size", 3,
                  "--strategy", "target", "--target", 0.8, "--explore", 0, "--out", tmp_path / "c2.jsonl")
    dist = {i: abs(pred[i]["mean"] - 0.8) for i in pool}
    assert [dist[i] for i in res["ids"]] == pytest.approx(sorted(dist.values())[:3])


@pytest.mark.parametrize("explore", [None, 3.0])
def test_select_target_explores_by_the_belief_weight(state, tmp_path, explore):
    # default --explore 1 (and another value): the distance after pseudo-rollouts at the target, computed
    # here from predict's mean and variance by Bayes' rule on the moment-matched Beta
    root, ids, pred = state
    (tmp_path / "cand.txt").write_text("\n".join(ids) + "\n")
    extra = [] if explore is None else ["--explore", explore]
    e = dec.TARGET_EXPLORE if explore is None else explore
    res = gd_json("select", "--state", root, "--candidates", tmp_path / "cand.txt", "-B", 10, "--strategy",
                  "target", *extra, "--out", tmp_path / "c.jsonl")
    assert res["explore"] == e
    dist = {i: _explored_distance(pred[i], 0.5, e) for i in ids}
    rows = _read_jsonl(tmp_path / "c.jsonl")
    assert [r["key"] for r in rows] == pytest.approx([dist[i] for i in res["ids"]], rel=1e-5)
    assert [dist[i] for i in res["ids"]] == pytest.approx(sorted(dist.values())[:10], rel=1e-5)
    # it is a different choice from the bare estimate's: prompts the state knows little about come forward
    plain = gd_json("select", "--state", root, "--candidates", tmp_path / "cand.txt", "-B", 10, "--strategy",
                    "target", "--explore", 0, "--out", tmp_path / "p.jsonl")
    seen = {i: pred[i]["n_seen"] for i in ids}
    assert sum(seen[i] for i in res["ids"]) < sum(seen[i] for i in plain["ids"])


def test_select_table_candidates_and_txt_output(state, tmp_path):
    root, ids, pred = state
    pool = ids[20:30]
    (tmp_path / "cand.csv").write_text("id,extra\n" + "".join(f"{i},x\n" for i in pool))
    gd("select", "--state", root, "--candidates", tmp_path / "cand.csv", "-B", 3, "--strategy",
       "skip-zero-variance", "--out", tmp_path / "chosen.txt", "--seed", 1)
    chosen = (tmp_path / "chosen.txt").read_text().split()
    assert len(chosen) == 3 == len(set(chosen)) and set(chosen) <= set(pool)


@pytest.mark.parametrize("strategy", dec.SELECT_STRATEGIES)
def test_select_every_strategy_is_seeded(state, tmp_path, strategy):
    root, ids, _ = state
    (tmp_path / "cand.txt").write_text("\n".join(ids) + "\n")
    a = gd_json("select", "--state", root, "--candidates", tmp_path / "cand.txt", "-B", 8, "--strategy",
                strategy, "--seed", 5, "--out", tmp_path / "a.csv")
    b = gd_json("select", "--state", root, "--candidates", tmp_path / "cand.txt", "-B", 8, "--strategy",
                strategy, "--seed", 5, "--out", tmp_path / "b.csv")
    assert a["ids"] == b["ids"] and len(set(a["ids"])) == 8 and set(a["ids"]) <= set(ids)
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()
    assert (tmp_path / "a.csv").read_text().splitlines()[0] == "rank,id,p,mean,variance,p_zero_variance,n_seen,key"


def test_select_refusals_write_nothing(state, tmp_path):
    root, ids, _ = state
    out = tmp_path / "chosen.jsonl"
    (tmp_path / "unknown.txt").write_text(f"{ids[0]}\n{ids[1]}\nnope\n")
    res = gd("select", "--state", root, "--candidates", tmp_path / "unknown.txt", "-B", 1, "--strategy", "target",
             "--out", out, code=1)
    assert "unknown.txt:3: unknown prompt id 'nope'" in res.stderr and res.stderr.count("\n") == 1
    (tmp_path / "dup.jsonl").write_text(f'{{"id": "{ids[0]}"}}\n{{"id": "{ids[1]}"}}\n{{"id": "{ids[0]}"}}\n')
    res = gd("select", "--state", root, "--candidates", tmp_path / "dup.jsonl", "-B", 1, "--strategy", "target",
             "--out", out, code=1)
    assert "dup.jsonl:3: duplicate id 'q000' (first on line 1)" in res.stderr
    (tmp_path / "two.txt").write_text(f"{ids[0]}\n{ids[1]}\n")
    res = gd("select", "--state", root, "--candidates", tmp_path / "two.txt", "-B", 3, "--strategy", "target",
             "--out", out, code=2)
    assert "--batch-size 3 is larger than the pool of 2 candidates" in res.stderr
    res = gd("select", "--state", root, "--candidates", tmp_path / "two.txt", "-B", 1, "--strategy", "best",
             "--out", out, code=2)
    assert "unknown selection strategy 'best'" in res.stderr
    res = gd("select", "--state", root, "--candidates", tmp_path / "two.txt", "-B", 1, "--strategy", "target",
             "--explore", -1, "--out", out, code=2)
    assert "explore must be a number of pseudo-rollouts >= 0, got -1.0" in res.stderr and res.stderr.count("\n") == 1
    for strategy in ("target", "thompson"):  # a negative seed reached numpy's default_rng: a bare ValueError
        res = gd("select", "--state", root, "--candidates", tmp_path / "two.txt", "-B", 1, "--strategy", strategy,
                 "--seed", -5, "--out", out, code=2)
        assert res.stderr == "graphdiff: error: --seed must be >= 0, got -5\n", res.stderr
    res = gd("select", "--state", tmp_path / "nostate", "--candidates", tmp_path / "two.txt", "-B", 1,
             "--strategy", "target", "--out", out, code=6)
    assert "no such STATE directory" in res.stderr
    assert not out.exists()


def test_allocate_matches_the_rule_on_the_predictions(state, tmp_path):
    root, ids, pred = state
    batch = ids[:16]
    (tmp_path / "batch.txt").write_text("\n".join(batch) + "\n")
    for strategy in dec.ALLOCATE_STRATEGIES:
        out = tmp_path / f"alloc-{strategy}.jsonl"
        res = gd_json("allocate", "--state", root, "--ids", tmp_path / "batch.txt", "--budget", 128, "--min", 2,
                      "--max", 16, "--strategy", strategy, "--out", out)
        rows = _read_jsonl(out)
        n = np.array([r["n"] for r in rows])
        assert [r["id"] for r in rows] == batch
        assert n.sum() == 128 and n.min() >= 2 and n.max() <= 16
        p = np.array([pred[i]["p"] for i in batch])
        assert n.tolist() == dec.allocate(strategy, p, 128, 2, 16).tolist()
        assert res["budget"] == 128 and res["prompts"] == 16 and res["counts"]["min"] == n.min()
        if strategy == "uniform":
            assert set(n.tolist()) == {8}
        else:  # more uncertain outcome -> at least as many rollouts (up to one unit of rounding)
            w = np.sqrt(p * (1 - p))
            i, j = np.argmax(w), np.argmin(w)
            assert n[i] >= n[j]
        # the report's expected signal-carrying groups are P(0 < s < n) summed over the batch
        groups = res["predicted_nondegenerate_groups"]
        assert groups["allocation"] == pytest.approx(dec.nondegenerate_probability(p, n).sum())
        assert groups["uniform"] == pytest.approx(dec.nondegenerate_probability(p, np.full(16, 8)).sum())


def test_allocate_refusals_write_nothing(state, tmp_path):
    root, ids, _ = state
    out = tmp_path / "alloc.csv"
    (tmp_path / "batch.txt").write_text("\n".join(ids[:4]) + "\n")
    res = gd("allocate", "--state", root, "--ids", tmp_path / "batch.txt", "--budget", 7, "--strategy", "uniform",
             "--out", out, code=2)
    assert "budget 7 is below the minimum 2 x 4 prompts = 8" in res.stderr
    res = gd("allocate", "--state", root, "--ids", tmp_path / "batch.txt", "--budget", 200, "--max", 32,
             "--strategy", "variance", "--out", out, code=2)
    assert "budget 200 is above the maximum 32 x 4 prompts = 128" in res.stderr
    res = gd("allocate", "--state", root, "--ids", tmp_path / "batch.txt", "--budget", 16, "--min", 1,
             "--strategy", "vip", "--out", out, code=2)
    assert "vip strategy needs --min >= 2" in res.stderr
    res = gd("allocate", "--state", root, "--ids", tmp_path / "batch.txt", "--budget", 16, "--strategy", "greedy",
             "--out", out, code=2)
    assert "unknown allocation strategy 'greedy'" in res.stderr
    (tmp_path / "bad.txt").write_text(f"{ids[0]}\nzzz\n")
    res = gd("allocate", "--state", root, "--ids", tmp_path / "bad.txt", "--budget", 16, "--strategy", "uniform",
             "--out", out, code=1)
    assert "bad.txt:2: unknown prompt id 'zzz'" in res.stderr
    assert not out.exists()


@pytest.fixture(scope="module")
def lopsided(tmp_path_factory):
    """A STATE whose topics the policy solves always (i % 4 == 0), about 1 time in 20 (1) and half the time (2, 3):
    the variance rule moves rollouts from the rarely solved prompts, which need them to show a signal, to the
    half-solved ones, which show one anyway."""
    folder = tmp_path_factory.mktemp("lopsided")
    graph, clusters, ids = make_inputs(folder, n=40)
    out = folder / "STATE"
    State.init(graph, clusters, out, device="cpu", durable=False)
    for t in (1, 2, 3):
        rows = [{"id": pid, "n": 8, "s": [8, 0 if t < 3 else 1, 4, 4][i % 4]} for i, pid in enumerate(ids)]
        State.open(out, durable=False).update(t, write_outcomes(folder / f"o{t}.jsonl", rows))
    return out, ids


def test_allocate_warns_when_its_own_belief_says_uniform_does_better(lopsided, tmp_path):
    root, ids = lopsided
    batch = [pid for i, pid in enumerate(ids) if i % 4 in (1, 2)][:16]
    (tmp_path / "batch.txt").write_text("\n".join(batch) + "\n")
    gd("predict", "--state", root, "--out", tmp_path / "p.jsonl")
    pred = {r["id"]: r for r in _read_jsonl(tmp_path / "p.jsonl")}
    mean = np.array([pred[i]["mean"] for i in batch])
    var = np.array([pred[i]["variance"] for i in batch])
    for strategy in dec.ALLOCATE_STRATEGIES:
        args = ["allocate", "--state", root, "--ids", tmp_path / "batch.txt", "--budget", 128, "--strategy", strategy,
                "--out", tmp_path / f"{strategy}.jsonl"]
        res = gd("--json", *args)
        out = json.loads(res.stdout)
        n = np.array([r["n"] for r in _read_jsonl(tmp_path / f"{strategy}.jsonl")])
        expected = out["expected_signal_groups"]
        assert expected["allocation"] == pytest.approx(dec.expected_signal_groups(mean, var, n))
        assert expected["uniform"] == pytest.approx(dec.expected_signal_groups(mean, var, np.full(16, 8)))
        if strategy == "uniform":
            assert out["warnings"] == [] and "warning" not in res.stderr
            continue
        assert expected["allocation"] < expected["uniform"]  # the case the warning is for
        assert len(out["warnings"]) == 1 and "does worse than uniform" in out["warnings"][0]
        assert f"{expected['allocation']:.2f}" in out["warnings"][0]
        assert f"{expected['uniform']:.2f}" in out["warnings"][0]
        text = gd(*args)
        warned = [line for line in text.stderr.splitlines() if line.startswith("graphdiff: warning: ")]
        assert len(warned) == 1 and strategy in warned[0], text.stderr
        assert gd("-q", *args).stderr == ""  # -q hides it


def test_select_warns_when_its_choice_is_expected_to_do_worse_than_a_uniform_draw(lopsided, tmp_path):
    root, ids = lopsided
    (tmp_path / "cand.txt").write_text("\n".join(ids) + "\n")
    args = ["select", "--state", root, "--candidates", tmp_path / "cand.txt", "-B", 8, "--out", tmp_path / "b.txt"]
    good = gd_json(*args)  # the target rule at 0.5: far better than uniform, nothing to say
    assert good["warnings"] == []
    assert good["expected_signal_groups"]["chosen"] > good["expected_signal_groups"]["uniform"]
    bad = gd("--json", *args, "--target", 0.0)  # the prompts it is surest fail: little signal
    out = json.loads(bad.stdout)
    assert out["expected_signal_groups"]["chosen"] < out["expected_signal_groups"]["uniform"]
    assert out["expected_signal_groups"]["chosen"] == pytest.approx(8 * out["predicted_effective_share"]["chosen"])
    assert out["expected_signal_groups"]["uniform"] == pytest.approx(8 * out["predicted_effective_share"]["pool"])
    assert len(out["warnings"]) == 1 and "the target strategy does worse than uniform" in out["warnings"][0]
    assert bad.stderr.count("graphdiff: warning: ") == 1
    assert gd_json(*args, "--strategy", "uniform")["warnings"] == []
