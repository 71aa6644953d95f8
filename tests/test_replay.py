"""Replay: predictions strictly before outcomes, bookkeeping of seen prompts, times and zero-variance scores."""

from __future__ import annotations

import numpy as np
import pytest

from graphdiff_cli.evaluation.baselines import GRESO, HistoryMean, MoPPS, SampleBeforeStep
from graphdiff_cli.evaluation.replay import replay
from graphdiff_cli.errors import DataError, InvalidArgumentError


class Cheater:
    """Predicts, for each prompt, the last outcome it was shown for it: if replay ever updated before
    predicting, its predictions would equal the batch's own observed rates."""

    name = "cheater"

    def __init__(self, n_nodes):
        self.last = np.full(n_nodes, 0.5)
        self.calls = []

    def estimates(self, ids, group_size):
        self.calls.append("estimates")
        return {"p": self.last[ids].copy()}

    def update(self, ids, n, s):
        self.calls.append("update")
        self.last[ids] = s / n
        ids[:] = 0  # vandalise the arrays it is handed: the replay's log must not change
        s[:] = 0


def _log():
    # prompt 0 visited at steps 1, 2, 3 with rates 0, 1, 0.5; prompts 1, 2 once each
    step = np.array([1, 1, 2, 2, 3])
    ids = np.array([0, 1, 0, 2, 0])
    n = np.array([4, 4, 4, 4, 4])
    s = np.array([0, 4, 4, 2, 2])
    return step, ids, n, s


def test_replay_never_shows_a_batch_its_own_outcomes():
    step, ids, n, s = _log()
    c = Cheater(3)
    res = replay(step, ids, n, s, [c])
    # each prediction is the previous visit's rate (0.5 for a first visit), never the current one
    np.testing.assert_allclose(res.predictions["cheater"], [0.5, 0.5, 0.0, 0.5, 1.0])
    assert not np.allclose(res.predictions["cheater"], s / n)
    assert c.calls == ["estimates", "update"] * 3
    np.testing.assert_array_equal(res.s, [0, 4, 4, 2, 2])  # the log survived the vandalism
    np.testing.assert_array_equal(res.ids, [0, 1, 0, 2, 0])


def test_oracles_and_estimators_side_by_side():
    step, ids, n, s = _log()
    res = replay(step, ids, n, s, [HistoryMean(3), SampleBeforeStep(3, probe="exact")])
    np.testing.assert_allclose(res.predictions["oracle-sbs"], s / n)  # shown the outcomes by design
    assert res.oracle == {"history": False, "oracle-sbs": True}
    # history mean by hand: step 1 nothing seen; step 2: prompt 0 -> 0, prompt 2 -> global 4/8;
    # step 3: prompt 0 -> (0 + 4) / 8
    np.testing.assert_allclose(res.predictions["history"], [0.5, 0.5, 0.0, 0.5, 0.5])


def test_seen_flags_steps_and_times():
    step, ids, n, s = _log()
    res = replay(step, ids, n, s, [HistoryMean(3), MoPPS(3)])
    np.testing.assert_array_equal(res.seen, [False, False, True, False, True])
    np.testing.assert_array_equal(res.steps, [1, 2, 3])
    for name in ("history", "mopps(lam=1)"):
        assert res.seconds[name].shape == (3,) and (res.seconds[name] >= 0).all()
    np.testing.assert_allclose(res.rate, s / n)


def test_zero_variance_native_or_plug_in():
    step, ids, n, s = _log()
    res = replay(step, ids, n, s, [HistoryMean(3), MoPPS(3), GRESO(3)])
    assert res.zero_variance_source == {"history": "plug-in", "mopps(lam=1)": "native", "greso": "native"}
    p = res.predictions["history"]
    np.testing.assert_allclose(res.zero_variance["history"], p ** 4 + (1 - p) ** 4)
    # MoPPS Beta(1, 1) before any outcome, g = 4: E[p^4] + E[(1-p)^4] = 2 / 5
    assert res.zero_variance["mopps(lam=1)"][0] == pytest.approx(0.4)
    assert res.zero_variance["greso"][0] == 0.0


def test_replay_passes_each_group_size_to_estimates():
    seen = []

    class Spy(HistoryMean):
        def estimates(self, ids, group_size=8):
            seen.append((tuple(ids), group_size))
            return {"p": self.predict(ids), "p_zero_variance": np.zeros(len(ids))}

    res = replay(np.array([1, 1, 1]), np.array([0, 1, 2]), np.array([8, 4, 8]), np.array([1, 1, 1]), [Spy(3)])
    assert sorted(seen) == [((0, 2), 8), ((1,), 4)]
    assert res.zero_variance_source["history"] == "native" and not res.zero_variance["history"].any()


def test_replay_takes_graphdiffs_estimator_as_it_is_under_a_name():
    """A mapping {name: estimator} replays graphdiff's Estimator with no adapter, as GraphdiffMethod does."""
    import scipy.sparse as sp

    from graphdiff_cli.estimator import Estimator
    from graphdiff_cli.evaluation.methods import GraphdiffMethod

    w = sp.csr_matrix(np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=np.float64))
    step, ids, n, s = _log()
    labels = np.array([0, 0, 1])
    bare = replay(step, ids, n, s, {"gd": Estimator(w, labels, 2, device="cpu")})
    named = replay(step, ids, n, s, [GraphdiffMethod(Estimator(w, labels, 2, device="cpu"), name="gd")])
    np.testing.assert_allclose(bare.predictions["gd"], named.predictions["gd"], rtol=1e-12, atol=0)
    assert bare.zero_variance_source["gd"] == "native"


def test_replay_refuses_bad_logs():
    step, ids, n, s = _log()
    with pytest.raises(DataError, match="step order"):
        replay(step[::-1], ids, n, s, [HistoryMean(3)])
    with pytest.raises(DataError, match="outside"):
        replay(step, ids, n, s + 5, [HistoryMean(3)])
    with pytest.raises(DataError, match="at least one rollout"):
        replay(step, ids, n * 0, s * 0, [HistoryMean(3)])
    with pytest.raises(DataError, match="node index"):
        replay(step, ids + 10, n, s, [HistoryMean(3)], n_nodes=3)
    with pytest.raises(InvalidArgumentError, match="unique"):
        replay(step, ids, n, s, [HistoryMean(3), HistoryMean(3)])


def test_replay_refuses_predictions_outside_the_unit_interval():
    class Bad(HistoryMean):
        def predict(self, ids):
            return np.full(len(ids), 1.5)

    step, ids, n, s = _log()
    with pytest.raises(DataError, match="outside"):
        replay(step, ids, n, s, [Bad(3)])


def test_progress_callback():
    step, ids, n, s = _log()
    calls = []
    replay(step, ids, n, s, [HistoryMean(3)], progress=lambda d, t: calls.append((d, t)))
    assert calls == [(1, 3), (2, 3), (3, 3)]
