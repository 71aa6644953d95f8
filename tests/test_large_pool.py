"""The large-pool regime: the trajectory generator from real starting rates (evaluation/rate_drift.py,
`graphdiff simulate --rates`) and the static cold-start protocol's bookkeeping (evaluation/coldstart.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from graphdiff_cli.evaluation import coldstart as C
from graphdiff_cli.evaluation import rate_drift as R
from graphdiff_cli.evaluation.baselines import HistoryMean
from graphdiff_cli.errors import DataError, InvalidArgumentError

DEEPSCALER = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "deepscaler_difficulty" / "problems.jsonl"


def _pool(n_prompts=1000, seed=0):
    rng = np.random.default_rng(seed)
    n = np.full(n_prompts, 128, dtype=np.int64)
    s = rng.binomial(128, rng.beta(0.8, 1.0, n_prompts)).astype(np.int64)
    s[:50], s[50:70] = 0, 128  # never and always solved, as in DeepScaleR
    return [f"q{i:04d}" for i in range(n_prompts)], n, s


@pytest.fixture(scope="module")
def traj():
    ids, n, s = _pool()
    return R.simulate_from_rates(ids, n, s, groups=np.arange(1000) % 7, epochs=3, batch_size=64, seed=3)


def test_log_format_and_visit_cap(traj):
    steps = 3 * (1000 // 64)
    assert traj.step.size == steps * 64
    np.testing.assert_array_equal(np.unique(traj.step), np.arange(1, steps + 1))
    assert (np.diff(traj.step) >= 0).all()
    assert (traj.n == 8).all() and ((traj.s >= 0) & (traj.s <= 8)).all()
    visits = np.bincount(traj.id, minlength=1000)
    assert visits.max() <= 3
    assert (3 - visits).sum() == 3 * (1000 % 64)  # the prompts dropped with each epoch's partial batch
    for t in np.unique(traj.step):  # a batch holds a prompt once
        assert np.unique(traj.id[traj.step == t]).size == 64
    rows = traj.log_rows()
    assert set(rows[0]) == {"step", "id", "n", "s", "p_true"}
    assert rows[0]["id"] == traj.ids[traj.id[0]] and 0 < rows[0]["p_true"] < 1


def test_starts_at_the_real_rate_and_drifts_by_the_stated_model(traj):
    ids, n, s = _pool()
    np.testing.assert_allclose(traj.p0, (s + 0.5) / 129)
    x = (traj.step - 1) / (traj.step.max() - 1)
    logit0 = np.log(traj.p0 / (1 - traj.p0))
    want = 1 / (1 + np.exp(-(logit0[traj.id] + traj.speed[traj.id] * x)))
    np.testing.assert_allclose(traj.p_true, want)
    first = traj.step == 1
    np.testing.assert_allclose(traj.p_true[first], traj.p0[traj.id[first]])
    # speed = mu + tau z_group + sigma e: one group shares its z
    for g in range(7):
        v = traj.speed[traj.group == g]
        assert abs(v.mean() - (R.DRIFT_MEAN + R.DRIFT_SKILL_SD * 0)) < 3.5  # finite
        assert v.std() < 0.75  # sigma = 0.5 inside a group
    # drift direction: mu > 0, so the policy improves on average; each prompt moves the way its speed says
    late, early = traj.step > 2 * traj.step.max() / 3, traj.step <= traj.step.max() / 3
    assert traj.p_true[late].mean() > traj.p_true[early].mean() + 0.03
    assert (traj.s / traj.n)[late].mean() > (traj.s / traj.n)[early].mean()
    moved = traj.p_true - traj.p0[traj.id]
    up = traj.speed[traj.id] > 0
    assert (moved[up & ~first] > 0).all() and (moved[~up & ~first] < 0).all()
    # a negative mean makes it worse
    worse = R.simulate_from_rates(ids, n, s, epochs=3, batch_size=64, seed=3, drift_mean=-1.0)
    assert worse.p_true[late].mean() < worse.p_true[early].mean()


def test_reproducible_by_seed(traj):
    ids, n, s = _pool()
    again = R.simulate_from_rates(ids, n, s, groups=np.arange(1000) % 7, epochs=3, batch_size=64, seed=3)
    for name in ("step", "id", "n", "s", "p_true", "speed", "p0"):
        np.testing.assert_array_equal(getattr(again, name), getattr(traj, name))
    other = R.simulate_from_rates(ids, n, s, groups=np.arange(1000) % 7, epochs=3, batch_size=64, seed=4)
    assert not np.array_equal(other.id, traj.id) and not np.array_equal(other.speed, traj.speed)


def test_bad_inputs_are_refused():
    ids, n, s = _pool(100)
    with pytest.raises(InvalidArgumentError, match="batch size"):
        R.simulate_from_rates(ids, n, s, batch_size=200)
    with pytest.raises(DataError, match="success count"):
        R.simulate_from_rates(ids, n, np.where(np.arange(100) == 5, 200, s))
    with pytest.raises(DataError, match="twice"):
        R.simulate_from_rates(["a"] * 100, n, s, batch_size=10)
    with pytest.raises(DataError, match="groups"):
        R.simulate_from_rates(ids, n, s, batch_size=10, groups=np.zeros(3, dtype=np.int64))


def test_cli_writes_a_log_evaluate_reads(tmp_path):
    """`graphdiff simulate --rates` on a small rates file: the log has step, id, n, s, p_true and reads back
    through io.readers.read_log."""
    from typer.testing import CliRunner

    from graphdiff_cli.cli.app import app
    from graphdiff_cli.io.readers import IdIndex, read_log

    ids, n, s = _pool(600)
    rates = tmp_path / "rates.jsonl"
    rates.write_text("".join(json.dumps({"id": i, "problem": f"problem {i}", "n": int(a), "s": int(b)}) + "\n"
                             for i, a, b in zip(ids, n, s)))
    res = CliRunner().invoke(app, ["simulate", "--rates", str(rates), "--batch-size", "100", "--seed", "2",
                                   "--out-prompts", str(tmp_path / "p.jsonl"), "--out-log", str(tmp_path / "l.jsonl"),
                                   "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["steps"] == 18 and out["rows"] == 1800 and out["max_visits"] == 3
    log = read_log(tmp_path / "l.jsonl", IdIndex(ids, "the pool"))
    assert log["p_true"] is not None and log["step"].size == 1800
    res = CliRunner().invoke(app, ["simulate", "--rates", str(rates), "--shift", "3:x:+1",
                                   "--out-prompts", str(tmp_path / "p2.jsonl"), "--out-log", str(tmp_path / "l2.jsonl")])
    assert res.exit_code == 2 and "takes no --math or --shift" in res.output  # a usage error


@pytest.mark.skipif(not DEEPSCALER.exists(), reason=f"needs the real data at {DEEPSCALER} (../shared/ is absent)")
def test_deepscaler_rates_start_where_the_data_says():
    from graphdiff_cli.io.tables import read_rows

    rows = [r for _, r in read_rows(DEEPSCALER)]
    assert len(rows) == 29095
    ids = [r["id"] for r in rows]
    n = np.array([r["n"] for r in rows])
    s = np.array([r["s"] for r in rows])
    traj = R.simulate_from_rates(ids, n, s, epochs=3, batch_size=256, seed=0)
    assert traj.step.max() == 3 * (29095 // 256)
    assert np.bincount(traj.id, minlength=29095).max() <= 3
    first = traj.step == 1
    np.testing.assert_allclose(traj.p_true[first], (s[traj.id[first]] + 0.5) / 129)


# ----------------------------------------------------------------------------------------------------
# the cold-start protocol


class _Recorder(HistoryMean):
    """History mean that records every call it gets."""

    def __init__(self, n_nodes):
        super().__init__(n_nodes, name="recorder")
        self.updates, self.predicted = [], []

    def update(self, ids, n, s):
        self.updates.append((ids.copy(), n.copy(), s.copy()))
        super().update(ids, n, s)

    def predict(self, ids):
        self.predicted.append(ids.copy())
        return super().predict(ids)


def test_reveal_bookkeeping():
    rate = np.random.default_rng(0).uniform(size=3000)
    plan = C.reveal(rate, 0.1, seed=5, rollouts=8, batch=256)
    assert plan.revealed.size == 300 and plan.hidden.size == 2700
    assert np.intersect1d(plan.revealed, plan.hidden).size == 0
    np.testing.assert_array_equal(np.sort(np.r_[plan.revealed, plan.hidden]), np.arange(3000))
    np.testing.assert_array_equal(np.bincount(plan.step), [0, 256, 44])  # steps of 256, the last one short
    assert (plan.n == 8).all() and ((plan.s >= 0) & (plan.s <= 8)).all()
    # outcomes follow the known rates: revealing almost everything, s / n tracks them
    big = C.reveal(rate, 0.9, seed=1, rollouts=8)
    assert abs(np.corrcoef(big.s / big.n, rate[big.revealed])[0, 1]) > 0.8
    again = C.reveal(rate, 0.1, seed=5, rollouts=8, batch=256)
    np.testing.assert_array_equal(again.revealed, plan.revealed)
    np.testing.assert_array_equal(again.s, plan.s)
    assert not np.array_equal(C.reveal(rate, 0.1, seed=6).revealed, plan.revealed)
    with pytest.raises(InvalidArgumentError):
        C.reveal(rate, 0.0, seed=0)
    with pytest.raises(InvalidArgumentError):
        C.reveal(rate[:2], 0.01, seed=0)


def test_cold_start_feeds_revealed_steps_and_scores_only_hidden():
    rate = np.random.default_rng(0).uniform(size=1000)
    plan = C.reveal(rate, 0.3, seed=2, batch=128)
    rec = _Recorder(1000)
    out = C.score_cold_start([rec], plan, rate)["recorder"]
    assert [u[0].size for u in rec.updates] == [128, 128, 44]
    np.testing.assert_array_equal(np.concatenate([u[0] for u in rec.updates]), plan.revealed)
    np.testing.assert_array_equal(np.concatenate([u[2] for u in rec.updates]), plan.s)
    assert len(rec.predicted) == 1
    np.testing.assert_array_equal(rec.predicted[0], plan.hidden)
    # history predicts the revealed global mean for every hidden prompt: r = 0 (constant), MAE against it
    g = plan.s.sum() / plan.n.sum()
    assert out["pearson"] == 0.0 and out["hidden"] == 700
    assert out["mae"] == pytest.approx(np.abs(g - rate[plan.hidden]).mean(), rel=0, abs=1e-2)


def test_t_interval():
    ci = C.t_interval([0.3, 0.4, 0.5])
    assert ci["mean"] == pytest.approx(0.4)
    assert ci["lo"] == pytest.approx(0.4 - 4.302653 * 0.1 / np.sqrt(3), abs=1e-5)
    assert np.isnan(C.t_interval([0.3])["lo"])
