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
