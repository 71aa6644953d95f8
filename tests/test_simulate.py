"""Simulated trajectories: deterministic per seed, difficulty ordered as designed, epoch-wise batches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from graphdiff_cli.evaluation import simulate as S
from graphdiff_cli.errors import DataError, InvalidArgumentError

MATH_TRAIN = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "math" / "math_train.jsonl"


@pytest.fixture(scope="module")
def sim():
    return S.simulate(n_prompts=500, steps=40, batch_size=50, rollouts=8, seed=7)


def test_deterministic_per_seed(sim):
    again = S.simulate(n_prompts=500, steps=40, batch_size=50, rollouts=8, seed=7)
    assert again.prompts == sim.prompts
    for name in ("step", "id", "n", "s", "p_true", "ability"):
        np.testing.assert_array_equal(getattr(again, name), getattr(sim, name))
    other = S.simulate(n_prompts=500, steps=40, batch_size=50, rollouts=8, seed=8)
    assert not np.array_equal(other.s, sim.s)
    assert other.prompts != sim.prompts


def test_shapes_counts_and_batches(sim):
    assert sim.step.size == 40 * 50
    np.testing.assert_array_equal(np.unique(sim.step), np.arange(1, 41))
    assert (sim.n == 8).all() and ((sim.s >= 0) & (sim.s <= 8)).all()
    assert len({p["id"] for p in sim.prompts}) == 500
    assert len({p["prompt"] for p in sim.prompts}) == 500  # texts redrawn until unique
    # 10 batches per epoch, each epoch a permutation: no prompt twice within one epoch
    for e in range(4):
        rows = (sim.step > 10 * e) & (sim.step <= 10 * (e + 1))
        assert np.unique(sim.id[rows]).size == 500


def test_difficulty_and_success_follow_the_design(sim):
    level = np.array([p["level"] for p in sim.prompts])
    topic = np.array([p["topic"] for p in sim.prompts])
    diff = np.array([p["difficulty"] for p in sim.prompts])
    for u in S.TOPICS:
        means = [diff[(topic == u) & (level == lvl)].mean() for lvl in S.LEVELS]
        assert np.all(np.diff(means) > 0), (u, means)
    # the true success probability falls with level and matches the logistic model
    lv_rows = level[sim.id]
    by_level = [sim.p_true[lv_rows == lvl].mean() for lvl in S.LEVELS]
    assert np.all(np.diff(by_level) < 0)
    names = sim.topics
    t_idx = np.array([names.index(u) for u in topic])
    want = 1 / (1 + np.exp(-(sim.ability[sim.step - 1, t_idx[sim.id]] - diff[sim.id])))
    np.testing.assert_allclose(sim.p_true, want)
    # ability rises for every topic, by different amounts (uneven improvement)
    gain = sim.ability[-1] - sim.ability[0]
    assert (gain > 0).all() and gain.max() > 2 * gain.min()
    np.testing.assert_allclose(sim.ability[0], S.ABILITY0)
    # outcomes agree with p_true on average (binomial noise only)
    assert abs((sim.s / sim.n).mean() - sim.p_true.mean()) < 0.02


def test_templates_cover_every_topic_and_level():
    rng = np.random.default_rng(0)
    for u in S.TOPICS:
        for lvl in S.LEVELS:
            text = S.write_prompt(u, lvl, rng)
            assert isinstance(text, str) and len(text) > 15 and any(ch.isdigit() for ch in text)
    with pytest.raises(InvalidArgumentError):
        S.write_prompt("poetry", 1, rng)


def test_bad_sizes_are_refused():
    with pytest.raises(InvalidArgumentError, match="batch size"):
        S.simulate(n_prompts=10, batch_size=20)
    with pytest.raises(InvalidArgumentError, match="steps"):
        S.simulate(n_prompts=10, batch_size=5, steps=0)


def _fake_math_rows(n=300):
    subjects = list(S.MATH_SUBJECTS)
    return [{"unique_id": f"train/x/{i}.json", "problem": f"Problem {i}", "subject": subjects[i % 7],
             "level": None if i == 5 else 1 + (i // 7) % 5} for i in range(n)]


def test_math_variant_follows_level_and_subject():
    rows = _fake_math_rows()
    sim = S.simulate_math(rows, epochs=2, batch_size=50, seed=1)
    assert sim.step.max() == 2 * (300 // 50)
    assert [p["id"] for p in sim.prompts] == [r["unique_id"] for r in rows]
    assert sim.prompts[5]["level"] is None  # kept, with the middle level's difficulty
    diff = np.array([p["difficulty"] for p in sim.prompts])
    level = np.array([r["level"] or 3 for r in rows])
    means = [diff[level == lvl].mean() for lvl in S.LEVELS]
    assert np.all(np.diff(means) > 0)
    with pytest.raises(DataError, match="unknown subject"):
        S.simulate_math([{"unique_id": "a", "problem": "p", "subject": "Poetry", "level": 1}], batch_size=1)


@pytest.mark.shared_data
@pytest.mark.skipif(not MATH_TRAIN.is_file(), reason="../shared/data/math is absent (real MATH data not available)")
def test_math_variant_on_the_real_training_split():
    with open(MATH_TRAIN, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    sim = S.simulate_math(rows, epochs=3, batch_size=256, seed=0)
    assert len(sim.prompts) == 7500
    assert sim.step.max() == 3 * (7500 // 256) and sim.step.size == 87 * 256
    lv = np.array([r["level"] or 3 for r in rows])[sim.id]
    by_level = [sim.p_true[lv == lvl].mean() for lvl in S.LEVELS]
    assert np.all(np.diff(by_level) < 0)


def test_a_shift_moves_one_topic_from_its_step_and_changes_nothing_before(sim):
    shifted = S.simulate(n_prompts=500, steps=40, batch_size=50, rollouts=8, seed=7,
                         shifts=[S.Shift.parse("21:algebra:+2"), S.Shift(31, "geometry", -1.5)])
    assert shifted.prompts == sim.prompts
    np.testing.assert_array_equal(shifted.id, sim.id)  # same batches: a shift draws no random numbers
    col = {u: j for j, u in enumerate(sim.topics)}
    diff = shifted.ability - sim.ability
    np.testing.assert_allclose(diff[:20], 0.0)
    np.testing.assert_allclose(diff[20:, col["algebra"]], 2.0)
    np.testing.assert_allclose(diff[20:30, col["geometry"]], 0.0)
    np.testing.assert_allclose(diff[30:, col["geometry"]], -1.5)
    others = [j for u, j in col.items() if u not in ("algebra", "geometry")]
    np.testing.assert_allclose(diff[:, others], 0.0)
    before = sim.step <= 20
    np.testing.assert_array_equal(shifted.s[before], sim.s[before])
    alg = np.array([sim.prompts[i]["topic"] == "algebra" for i in sim.id])
    after = sim.step >= 21
    assert (shifted.p_true[after & alg] > sim.p_true[after & alg]).all()
    assert shifted.params["shifts"] == [[21, "algebra", 2.0], [31, "geometry", -1.5]]


@pytest.mark.parametrize("text, match", [("21:algebra", "STEP:TOPIC:DELTA"), ("x:algebra:1", "integer step"),
                                         ("21:algebra:nan", "finite"), ("21:poetry:1", "unknown topic"),
                                         ("0:algebra:1", r"\[1, 40\]"), ("41:algebra:1", r"\[1, 40\]")])
def test_bad_shifts_are_refused_in_one_line(text, match):
    with pytest.raises(InvalidArgumentError, match=match):
        S.simulate(n_prompts=500, steps=40, batch_size=50, rollouts=8, seed=7, shifts=[S.Shift.parse(text)])


def test_a_negative_seed_is_a_usage_error_not_numpys_value_error(tmp_path):
    from graphdiff_cli.stages.evaluate import evaluate
    from graphdiff_cli.stages.simulate import simulate

    with pytest.raises(InvalidArgumentError, match="--seed must be >= 0, got -5"):
        simulate(tmp_path / "p.jsonl", tmp_path / "l.jsonl", prompts=50, batch_size=8, steps=2, seed=-5)
    with pytest.raises(InvalidArgumentError, match="--seed must be >= 0, got -5"):
        evaluate(tmp_path / "log.jsonl", tmp_path / "g.zarr", tmp_path / "c.zarr", tmp_path / "out", seed=-5)
    assert not any(tmp_path.iterdir())
