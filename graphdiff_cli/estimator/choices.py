"""The settings the estimator chooses online (beyond the paper), with one scoreboard.

prior_strength, belief_strength, label_propagation, time_forgetting, readout and readout_ridge may each be
"auto": the estimator
then scores every candidate value prequentially - by what it would have said about each step's prompts
just before their outcomes arrived - and uses the best so far (docs/estimator.md, "Improvements"). The
scoreboard holds one board per choice in play:

- ``mix_errors``: the joint choice, made when label_propagation, time_forgetting or readout is "auto": the
  summed absolute error of p-hat under every (time forgetting, propagation weight, read-out weight, kappa)
  in play (``bl.choose_mix``); kappa, when "auto" (and not under gamma mixing, where it plays no part), is
  chosen here too;
- ``readout_errors``: the read-out's ridge strength (readout_ridge "auto" with the read-out on): the summed
  absolute error of the read-out alone under each value of ``readout.RIDGE_GRID``;
- ``kappa_errors``: kappa chosen alone (prior_strength "auto" without a joint choice): the summed absolute
  error per value of ``bl.KAPPA_GRID`` (``bl.choose_prior_strength``);
- ``belief_loglik``: nu (belief_strength "auto"): the summed log-likelihood of the groups under the belief
  of each strength of the grid (``bl.choose_belief_strength``).

A board not in play is empty: no work per step, nothing saved that nothing reads. time_forgetting "auto"
also keeps the forgotten counts under every delta of ``bl.TIME_GRID`` (``time_counts``), so that the counts
of whichever delta is chosen are at hand.
"""

from __future__ import annotations

import numpy as np

from ..core import belief as bl
from ..core import readout as ro
from ..errors import DataError
from ..io import estimator_layout as layout


class OnlineChoices:
    """The online choices of one estimator: what is in play under its ``settings``, the scoreboard, and
    the values in use. ``score`` computes a step's new boards without changing anything; ``commit`` makes
    them (and the forgotten counts under every delta) the state."""

    def __init__(self, settings, n_nodes: int, readout: bool = False):
        # readout: whether the estimator has a read-out (readout set and embeddings given)
        c = settings
        self.settings = c
        # time_forgetting as it acts: offset mixing keeps per-visit offsets of its own, which a per-step decay
        # of the counts would unbalance, so there it is 1 (a number other than 1 is refused by settings)
        self.time_setting = 1.0 if c.mixing == "offset" else c.time_forgetting
        kappa_auto = c.prior_strength == "auto" and c.mixing != "gamma"
        # the candidates of each axis of the joint choice: the grid when chosen online, else the one value in
        # use (under gamma mixing kappa plays no part: one column)
        self.kappas = bl.KAPPA_GRID if kappa_auto else \
            np.array([4.0 if c.prior_strength == "auto" else float(c.prior_strength)])
        w = c.label_propagation
        self.weights = bl.PROPAGATION_GRID if w == "auto" else np.array([0.0 if w is None else float(w)])
        self.times = bl.TIME_GRID if self.time_setting == "auto" else np.array([float(self.time_setting)])
        r = c.readout if readout else None
        self.readout_on = r is not None
        self.readouts = ro.READOUT_GRID if r == "auto" else np.array([0.0 if r is None else float(r)])
        self.joint = w == "auto" or self.time_setting == "auto" or r == "auto"
        # before any error: no time forgetting, propagation's start weight, the read-out's, the first kappa
        self.start = (0, int(np.flatnonzero(bl.PROPAGATION_GRID == bl.PROPAGATION_START)[0]) if w == "auto" else 0,
                      int(np.flatnonzero(ro.READOUT_GRID == ro.READOUT_START)[0]) if r == "auto" else 0, 0)
        ridge_auto = self.readout_on and c.readout_ridge == "auto"
        self.shapes = {
            "kappa_errors": (bl.KAPPA_GRID.size,) if kappa_auto and not self.joint else (0,),
            "belief_loglik": (bl.KAPPA_GRID.size,) if c.belief_strength == "auto" else (0,),
            "mix_errors": (self.times.size, self.weights.size, self.readouts.size, self.kappas.size) if self.joint
            else (0,),
            "readout_errors": (ro.RIDGE_GRID.size,) if ridge_auto else (0,),
        }
        self.board = {name: np.zeros(shape) for name, shape in self.shapes.items()}
        self.time_counts = np.zeros((bl.TIME_GRID.size, 2, n_nodes)) if self.time_setting == "auto" else None

    def in_play(self, name: str) -> bool:
        return self.board[name].size > 0

    # -- the values in use ---------------------------------------------------------------------------

    def _mix_choice(self, board=None) -> tuple[int, int, int, int]:
        """(time, weight, read-out weight, kappa) indices of the joint choice, into ``times``, ``weights``,
        ``readouts``, ``kappas``."""
        return bl.choose_mix(self.board["mix_errors"] if board is None else board, self.start)

    @property
    def kappa(self) -> float:
        """The prior strength in use: the configured number, or the prequential choice ("auto")."""
        c = self.settings
        if c.prior_strength != "auto":
            return float(c.prior_strength)
        if self.joint and c.mixing != "gamma":
            return float(self.kappas[self._mix_choice()[3]])
        if self.in_play("kappa_errors"):
            return bl.choose_prior_strength(self.board["kappa_errors"])
        return float(bl.KAPPA_GRID[0])  # gamma mixing: kappa plays no part; the grid's first, as before any error

    @property
    def nu(self) -> float | None:
        """The belief strength in use: the configured number, the prequential choice ("auto"), or None."""
        c = self.settings
        if c.belief_strength == "auto":
            return bl.choose_belief_strength(self.board["belief_loglik"])
        return None if c.belief_strength is None else float(c.belief_strength)

    @property
    def propagation(self) -> float | None:
        """Label propagation's weight: the configured number, the online choice ("auto"), or None when off."""
        w = self.settings.label_propagation
        if w == "auto":
            return float(self.weights[self._mix_choice()[1]])
        return None if w is None else float(w)

    @property
    def readout(self) -> float | None:
        """The read-out's weight in the graph's estimate: the configured number, the online choice ("auto"), or
        None when there is no read-out (readout null, or no embeddings)."""
        if not self.readout_on:
            return None
        if self.settings.readout == "auto":
            return float(self.readouts[self._mix_choice()[2]])
        return float(self.settings.readout)

    @property
    def ridge(self) -> float:
        """The read-out's ridge strength: the configured number or the online choice ("auto")."""
        if self.settings.readout_ridge != "auto":
            return float(self.settings.readout_ridge)
        return ro.choose_ridge(self.board["readout_errors"]) if self.in_play("readout_errors") else \
            float(ro.RIDGE_GRID[1])

    @property
    def time_forgetting(self) -> float:
        """The per-step forgetting of prompts' own counts: the configured number or the online choice."""
        if self.time_setting == "auto":
            return float(self.times[self._mix_choice()[0]])
        return float(self.time_setting)

    # -- a step --------------------------------------------------------------------------------------

    def score(self, est, obs, p_then) -> dict[str, np.ndarray]:
        """The boards after scoring every candidate on this step's prompts (``obs``) by what it said before
        their outcomes (``p_then``: the model's prediction then); ``est`` gives the graph's estimate and the
        mixing. Nothing is changed."""
        board = dict(self.board)
        score_kappa, score_belief = self.in_play("kappa_errors"), self.in_play("belief_loglik")
        score_ridge = self.in_play("readout_errors")
        if not len(obs) or not (score_kappa or score_belief or self.joint or score_ridge):
            return board
        # the states' estimate under the counts in use and under every time forgetting in play, from one read
        # of the prompts' neighbourhood (their rows of W and their neighbours' rows of q)
        counts = self._candidate_counts()
        in_use = shifted = None
        if self.joint:  # the counts in use are the candidates' own when no time forgetting is chosen online
            lead = [] if self.time_counts is None else [None]
            every = est._states_estimates(obs.ids, p_then, lead + counts)
            in_use, shifted = every[0], every[len(lead):]
        states, propagated, readout = est._graph_parts(obs.ids, p_then, states=in_use)
        p_graph = est._combine(states, propagated, readout)
        rate = obs.s / np.maximum(obs.n, 1)
        no_u = np.zeros(len(obs))  # u only shapes the variance, which is not scored
        if score_ridge:
            board["readout_errors"] = board["readout_errors"] + [
                np.abs(r - rate).sum() for r in est._readout_estimates(obs.ids, ro.RIDGE_GRID)]
        if self.joint:
            board["mix_errors"] = board["mix_errors"] + self._candidate_errors(est, obs.ids, propagated, readout,
                                                                               rate, counts, shifted)
        if score_kappa:
            board["kappa_errors"] = board["kappa_errors"] + [
                np.abs(est._mix(obs.ids, p_graph, no_u, k)[0] - rate).sum() for k in bl.KAPPA_GRID]
        if score_belief:
            board["belief_loglik"] = board["belief_loglik"] + bl.belief_loglik(
                p_graph, est.successes_decayed_[obs.ids], est.rollouts_decayed_[obs.ids], obs.n, obs.s, bl.KAPPA_GRID)
        return board

    def _candidate_counts(self) -> list:
        """The counts under each time forgetting in play ((successes, rollouts)), or [None]: the counts in use."""
        return [None] if self.time_counts is None else [(tc[0], tc[1]) for tc in self.time_counts]

    def _candidate_errors(self, est, rows, propagated, readout, rate, counts, shifted) -> np.ndarray:
        """Absolute errors, summed over these prompts, of the p-hat each (time forgetting, propagation
        weight, read-out weight, kappa) in play would have given them before their outcomes (the propagated
        estimate and the read-out are those of the counts in use: one harmonic field and one fit per step);
        ``shifted``: the states' estimate under each of ``counts``."""
        out = np.zeros((self.times.size, self.weights.size, self.readouts.size, self.kappas.size))
        no_u = np.zeros(rows.size)
        for i, states in enumerate(shifted):
            # every (weight, read-out weight) candidate of the graph's estimate at once: W x R x rows
            wt = self.weights[:, None, None]
            graph = states[None, None] if propagated is None else (1.0 - wt) * states + wt * propagated
            wr = self.readouts[None, :, None]
            m = np.broadcast_to(graph, (self.weights.size, self.readouts.size, rows.size)) if readout is None \
                else (1.0 - wr) * graph + wr * readout
            if est.settings.mixing == "evidence":  # p = (kappa m + S) / (kappa + C), every kappa at once
                sd, rd = (est.successes_decayed_, est.rollouts_decayed_) if counts[i] is None else counts[i]
                k = self.kappas[:, None]
                p = (k * m[:, :, None, :] + sd[rows]) / (k + rd[rows])
                out[i] = np.abs(p - rate).sum(axis=-1)
                continue
            for j in range(self.weights.size):
                for r in range(self.readouts.size):
                    out[i, j, r] = [np.abs(est._mix(rows, m[j, r], no_u, k, counts[i])[0] - rate).sum()
                                    for k in self.kappas]
        return out

    def forget(self, board, forget, successes, rollouts):
        """(time_counts, successes, rollouts in use) after a step: ``forget(succ, roll, delta)`` applied to the
        counts under every delta when time_forgetting is "auto" (the ones in use are those of the delta the
        new ``board`` chooses), else to the counts in use with the one delta."""
        if self.time_counts is None:
            return (None, *forget(successes, rollouts, float(self.time_setting)))
        time_counts = np.stack([np.stack(forget(self.time_counts[i, 0], self.time_counts[i, 1], d))
                                for i, d in enumerate(bl.TIME_GRID)])
        i = self.time_index(board)  # the time forgetting in use after this step
        return time_counts, time_counts[i, 0].copy(), time_counts[i, 1].copy()

    def time_index(self, board=None) -> int:
        """Index into ``times`` of the time forgetting in use (after ``board``, when given)."""
        if not self.joint:
            return 0
        return self._mix_choice(None if board is None else board["mix_errors"])[0]

    def commit(self, board, time_counts) -> None:
        self.board, self.time_counts = board, time_counts

    # -- growth and persistence ------------------------------------------------------------------------

    def extend(self, m: int):
        """``time_counts`` with m new prompts (no evidence under any delta), to be committed with ``grown``."""
        if self.time_counts is None:
            return None
        return layout.grow(layout.BY_NAME["time_counts"], self.time_counts, m)

    def arrays(self, n_nodes: int) -> dict[str, np.ndarray]:
        """Copies of the scoreboard and ``time_counts``, as ``Estimator.state_dict`` saves them (a board not in
        play empty; ``time_counts`` 0 x 2 x N unless time_forgetting is "auto")."""
        out = {name: b.copy() for name, b in self.board.items()}
        tc = self.time_counts
        out["time_counts"] = np.zeros((0, 2, n_nodes)) if tc is None else tc.copy()
        return out

    def load(self, state: dict, n_nodes: int) -> None:
        """Take the scoreboard and ``time_counts`` of a (current-layout) state dict, each checked to be
        what these settings keep."""
        for name, shape in self.shapes.items():
            got = np.asarray(state[name], dtype=np.float64)
            if got.shape != shape:
                raise DataError(f"saved {name} has shape {got.shape}, expected {shape} (the online choices these "
                                "settings make continue from their scoreboard)")
            self.board[name] = got.copy()
        tc = np.asarray(state["time_counts"], dtype=np.float64)
        want = (0, 2, n_nodes) if self.time_counts is None else self.time_counts.shape
        if tc.shape != want:
            raise DataError(f"saved time_counts has shape {tc.shape}, expected {want} (time_forgetting 'auto' needs "
                            "the counts under every delta)")
        if self.time_counts is not None:
            self.time_counts = tc.copy()
