"""The prompt's own history: the last step of the mix, after the sources' blend m (the graph's estimate).

p-hat mixes m with the prompt's own outcomes: Section 3.6's gamma mixing (the paper), evidence mixing
p = (kappa m + S) / (kappa + C) of its forgotten counts (``core.belief.mix_by_evidence``), or offset mixing
(m plus the prompt's forgotten residuals). Its online choices: the prior strength kappa (``prior_strength``), the
belief strength nu (``belief_strength``) and the time forgetting of the counts (``time_forgetting``, with the
counts under every delta of ``core.belief.TIME_GRID`` kept in ``time_counts`` when it is "auto"); time and
kappa are the first and last axes of the mix's board (``estimator.mix``).
"""

from __future__ import annotations

import numpy as np

from ...core import belief as bl
from ...core import meanfield as mf
from ...errors import DataError
from ...io import estimator_layout as layout


class History:
    arrays = ("kappa_errors", "belief_loglik", "time_counts")

    def __init__(self, settings, n_nodes: int):
        c = self.settings = settings
        # time_forgetting as it acts: offset mixing keeps per-visit offsets of its own, which a per-step decay
        # of the counts would unbalance, so there it is 1 (a number other than 1 is refused by settings)
        self.time_setting = 1.0 if c.mixing == "offset" else c.time_forgetting
        self.kappa_auto = c.prior_strength == "auto" and c.mixing != "gamma"
        # the candidates of its axes of the mix's board: the grid when chosen online, else the one value in use
        # (under gamma mixing kappa plays no part: one column)
        self.kappas = bl.KAPPA_GRID if self.kappa_auto else \
            np.array([4.0 if c.prior_strength == "auto" else float(c.prior_strength)])
        self.times = bl.TIME_GRID if self.time_setting == "auto" else np.array([float(self.time_setting)])
        self.time_counts = np.zeros((bl.TIME_GRID.size, 2, n_nodes)) if self.time_setting == "auto" else None

    def boards(self, joint: bool) -> dict[str, tuple]:
        """kappa chosen alone (prior_strength "auto" without the mix's joint choice) and nu."""
        c = self.settings
        return {"kappa_errors": (bl.KAPPA_GRID.size,) if self.kappa_auto and not joint else (0,),
                "belief_loglik": (bl.KAPPA_GRID.size,) if c.belief_strength == "auto" else (0,)}

    # -- the values in use (``index``: this axis's index of the mix's joint choice, None without one) ------

    def kappa(self, board, index) -> float:
        c = self.settings
        if c.prior_strength != "auto":
            return float(c.prior_strength)
        if index is not None and c.mixing != "gamma":
            return float(self.kappas[index])
        if board["kappa_errors"].size:
            return bl.choose_prior_strength(board["kappa_errors"])
        return float(bl.KAPPA_GRID[0])  # gamma mixing: kappa plays no part; the grid's first, as before any error

    def nu(self, board) -> float | None:
        c = self.settings
        if c.belief_strength == "auto":
            return bl.choose_belief_strength(board["belief_loglik"])
        return None if c.belief_strength is None else float(c.belief_strength)

    def time_forgetting(self, index) -> float:
        return float(self.times[index]) if self.time_setting == "auto" else float(self.time_setting)

    # -- the mixing ----------------------------------------------------------------------------------

    def mix(self, est, rows, p_graph, u, kappa: float, counts=None):
        """(p-hat, variance of the belief) from the graph's estimate and the prompts' own evidence
        (``counts``: (successes, rollouts) forgotten otherwise than the ones in use, for scoring)."""
        c = self.settings
        succ_d, roll_d = (est.successes_decayed_, est.rollouts_decayed_) if counts is None else counts
        roll = est.rollouts_[rows]
        if c.mixing == "gamma":
            p = mf.mix_with_history(p_graph, est.successes_[rows].astype(np.float64), roll.astype(np.float64),
                                    c.gamma)
            weight = np.where(roll > 0, c.gamma, 1.0)
            return p, weight * weight * u
        if c.mixing == "offset":
            roll_d = roll_d[rows]
            p = np.clip(p_graph + est.offset_decayed_[rows] / (kappa + roll_d), 0.0, 1.0)
            return p, np.where(roll > 0, p * (1.0 - p) / (kappa + roll_d + 1.0), u)
        return bl.mix_by_evidence(p_graph, u, succ_d[rows], roll_d[rows], kappa)

    def weight(self, est, rows, kappa: float) -> np.ndarray:
        """The history's weight in p-hat: C_i / (kappa + C_i) of the forgotten rollouts C_i under evidence mixing
        (offset mixing: the weight of its own residuals, the same), 1 - gamma for a prompt rolled out under
        gamma mixing."""
        c = self.settings
        if c.mixing == "gamma":
            return np.where(est.rollouts_[rows] > 0, 1.0 - c.gamma, 0.0)
        roll = np.asarray(est.rollouts_decayed_[rows], dtype=np.float64)
        total = kappa + roll
        return np.divide(roll, total, out=np.zeros_like(roll), where=total > 0)

    def score(self, est, rows, p_graph, rate, n, s, board) -> dict[str, np.ndarray]:
        """kappa's board alone and nu's, after this step's prompts (``n`` rollouts, ``s`` successes)."""
        out = {}
        if board["kappa_errors"].size:
            no_u = np.zeros(rows.size)  # u only shapes the variance, which is not scored
            out["kappa_errors"] = board["kappa_errors"] + [
                np.abs(self.mix(est, rows, p_graph, no_u, k)[0] - rate).sum() for k in bl.KAPPA_GRID]
        if board["belief_loglik"].size:
            out["belief_loglik"] = board["belief_loglik"] + bl.belief_loglik(
                p_graph, est.successes_decayed_[rows], est.rollouts_decayed_[rows], n, s, bl.KAPPA_GRID)
        return out

    # -- the counts ----------------------------------------------------------------------------------

    def candidate_counts(self) -> list:
        """The counts under each time forgetting of its axis ((successes, rollouts)), or [None]: those in use."""
        return [None] if self.time_counts is None else [(tc[0], tc[1]) for tc in self.time_counts]

    def forget(self, index, forget, successes, rollouts):
        """(time_counts, successes, rollouts in use) after a step: ``forget(succ, roll, delta)`` applied to the
        counts under every delta when time_forgetting is "auto" (the ones in use those of ``index``, the delta
        the new board chooses), else to the counts in use with the one delta."""
        if self.time_counts is None:
            return (None, *forget(successes, rollouts, float(self.time_setting)))
        time_counts = np.stack([np.stack(forget(self.time_counts[i, 0], self.time_counts[i, 1], d))
                                for i, d in enumerate(bl.TIME_GRID)])
        return time_counts, time_counts[index, 0].copy(), time_counts[index, 1].copy()

    def grow(self, m: int):
        """``time_counts`` with m new prompts (no evidence under any delta)."""
        if self.time_counts is None:
            return None
        return layout.grow(layout.BY_NAME["time_counts"], self.time_counts, m)

    def state(self, n_nodes: int) -> np.ndarray:
        tc = self.time_counts
        return np.zeros((0, 2, n_nodes)) if tc is None else tc.copy()

    def load(self, state: dict, n_nodes: int) -> None:
        tc = np.asarray(state["time_counts"], dtype=np.float64)
        want = (0, 2, n_nodes) if self.time_counts is None else self.time_counts.shape
        if tc.shape != want:
            raise DataError(f"saved time_counts has shape {tc.shape}, expected {want} (time_forgetting 'auto' needs "
                            "the counts under every delta)")
        if self.time_counts is not None:
            self.time_counts = tc.copy()
