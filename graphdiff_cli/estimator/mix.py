"""The mix: one combinator over an estimator's list of sources, and its one scoreboard of online choices.

The graph's estimate is the nested blend of the sources in order (``sources``): m_0 = the first's (the
mean-field states), m_j = (1 - w_j) m_{j-1} + w_j source_j, a source that is off skipped (never blended at
weight 0: that would not be the same numbers), and a source that abstains for a prompt (a NaN mean: no opinion,
as the read-out of live features for a prompt read without them) leaves m_{j-1} as it is there; the prompt's own
history (``sources.history``) then mixes m with the prompt's outcomes into p-hat. What a call knows of its prompts
besides the estimator's state (``sources.Context``: live features) is handed to every source's ``estimate`` and
``score``.

Every setting that may be "auto" is chosen prequentially - by what each candidate would have said about each
step's prompts just before their outcomes arrived - and the best so far is used (docs/explanation/estimator.md,
"Improvements"). The scoreboard holds one board per choice in play:

- ``mix_errors``: the joint choice, made when the time forgetting or any source's weight is "auto": the summed
  absolute error of p-hat under every (time forgetting, w_1, ..., w_J, kappa) in play, one axis per blended
  source of the list (``bl.choose_mix``; an axis of one value where that choice is fixed or the source off), so
  (time, propagation weight, read-out weight, covariates weight, live weight, kappa) for today's (a prompt a
  source abstains for scores every weight of that source alike); kappa, when "auto" (and not under gamma
  mixing, where it plays no part), is chosen here too;
- ``kappa_errors`` and ``belief_loglik``: the history's kappa chosen alone and nu (``History.boards``);
- each source's own boards (the read-outs' ridge strengths: ``readout_errors``, ``covariate_errors``,
  ``live_errors``).

A board not in play is empty: no work per step, nothing saved that nothing reads.
"""

from __future__ import annotations

import numpy as np

from ..core import belief as bl
from ..errors import DataError
from .sources import NO_CONTEXT, SOURCES, History


class Mix:
    """The mix of ``sources`` (the first the base) and the history, the scoreboard, and the values in use.
    ``score`` computes a step's new boards without changing anything; ``commit`` makes them (and the history's
    counts under every delta) the state."""

    def __init__(self, settings, n_nodes: int, sources):
        self.settings = settings
        self.sources = list(sources)
        self.history = h = History(settings, n_nodes)
        blended = self.sources[1:]
        self.joint = h.time_setting == "auto" or any(s.weight == "auto" for s in blended)
        # the axes of the joint choice and, before any error, its start: no time forgetting, each source's
        # start weight, the first kappa
        self.axes = (h.times, *[s.candidates() for s in blended], h.kappas)
        self.start = (0, *[s.start_index() for s in blended], 0)
        self.shapes = h.boards(self.joint)
        self.shapes["mix_errors"] = tuple(a.size for a in self.axes) if self.joint else (0,)
        for s in self.sources:
            self.shapes.update(s.boards())
        self.board = {name: np.zeros(shape) for name, shape in self.shapes.items()}

    @classmethod
    def of_settings(cls, settings, n_nodes: int, inputs=None, sources=SOURCES) -> "Mix":
        """The mix an estimator with these settings (and ``inputs``: ``sources.Inputs``) makes of the source classes
        ``sources``."""
        return cls(settings, n_nodes, [s(settings, n_nodes, inputs) for s in sources])

    def source(self, name: str):
        """The source of that name, or None."""
        return next((s for s in self.sources if s.name == name), None)

    # -- the values in use ---------------------------------------------------------------------------

    def choice(self, board=None) -> tuple[int, ...]:
        """The joint choice's indices into ``axes`` (time, one per blended source, kappa)."""
        return bl.choose_mix(self.board["mix_errors"] if board is None else board, self.start)

    def weight(self, j: int) -> float | None:
        """Source j's weight in the blend (j >= 1): the configured number, the online choice ("auto"), or None
        when it is off."""
        s = self.sources[j]
        if s.weight == "auto":
            return float(s.grid[self.choice()[j]])
        return None if s.weight is None else float(s.weight)

    @property
    def kappa(self) -> float:
        return self.history.kappa(self.board, self.choice()[-1] if self.joint else None)

    @property
    def nu(self) -> float | None:
        return self.history.nu(self.board)

    @property
    def time_forgetting(self) -> float:
        return self.history.time_forgetting(self.choice()[0] if self.history.time_setting == "auto" else None)

    def time_index(self, board=None) -> int:
        """Index into the time axis of the time forgetting in use (after ``board``, when given)."""
        if not self.joint:
            return 0
        return self.choice(None if board is None else board["mix_errors"])[0]

    # -- the estimate --------------------------------------------------------------------------------

    def means(self, est, rows, model, base=None, context=NO_CONTEXT) -> list:
        """Each source's estimate for ``rows`` (None for a source that is off; NaN where it abstains); ``base``: the
        first's, when the caller has it already; ``context``: what the call knows of the prompts (``Context``)."""
        first = self.sources[0].estimate(est, rows, model, context)[0] if base is None else base
        return [first] + [s.estimate(est, rows, model, context)[0] if s.on else None for s in self.sources[1:]]

    def blend(self, means) -> np.ndarray:
        """m_0 = means[0], m_j = (1 - w_j) m_{j-1} + w_j means[j], w_j the weights in use (m_j = m_{j-1} where
        means[j] is NaN: the source abstains)."""
        m = means[0]
        for j in range(1, len(means)):
            if means[j] is not None:
                m = _blend(m, self.weight(j), means[j])
        return m

    def graph_estimate(self, est, rows, model, context=NO_CONTEXT) -> np.ndarray:
        """The graph's estimate m_i that the history mixes with the prompt's own outcomes."""
        return self.blend(self.means(est, rows, model, context=context))

    def shares(self, est, rows, context=NO_CONTEXT) -> dict[str, np.ndarray | None]:
        """Each source's weight in p-hat and the history's (``Estimator.source_weights``): 0 for the prompts a
        source abstains for."""
        history = self.history.weight(est, rows, self.kappa)
        rest = 1.0 - history
        out = {}
        for j in range(len(self.sources) - 1, 0, -1):  # the last blended first: its share is the rest's w_j
            w = self.weight(j)
            says = None if w is None else self.sources[j].says(est, rows, context)
            if says is not None:
                w = np.where(says, w, 0.0)
            out[self.sources[j].name] = None if w is None else rest * w
            rest = rest * (1.0 - (0.0 if w is None else w))
        out[self.sources[0].name] = rest
        return {**{s.name: out[s.name] for s in self.sources}, "history": history}

    # -- a step --------------------------------------------------------------------------------------

    def score(self, est, obs, p_then, context=NO_CONTEXT) -> dict[str, np.ndarray]:
        """The boards after scoring every candidate on this step's prompts (``obs``) by what it said before
        their outcomes (``p_then``: the model's prediction then; ``context``: what the step knew of them, a row
        per prompt of ``obs.ids``). Nothing is changed."""
        board = dict(self.board)
        if not len(obs) or not any(b.size for b in board.values()):
            return board
        model = (p_then, None)
        # the base's estimate under the counts in use and under every time forgetting in play, from one read of
        # the prompts' neighbourhood (their rows of W and their neighbours' rows of q)
        counts = self.history.candidate_counts()
        base = shifted = None
        if self.joint:  # the counts in use are the candidates' own when no time forgetting is chosen online
            lead = [] if self.history.time_counts is None else [None]
            every = self.sources[0].estimates(est, obs.ids, model, lead + counts)
            base, shifted = every[0], every[len(lead):]
        means = self.means(est, obs.ids, model, base=base, context=context)
        rate = obs.s / np.maximum(obs.n, 1)
        for s in self.sources:
            board.update(s.score(est, obs.ids, rate, board, context))
        if self.joint:
            board["mix_errors"] = board["mix_errors"] + self._candidate_errors(est, obs.ids, means, rate, counts,
                                                                               shifted)
        board.update(self.history.score(est, obs.ids, self.blend(means), rate, obs.n, obs.s, board))
        return board

    def _candidate_errors(self, est, rows, means, rate, counts, shifted) -> np.ndarray:
        """Absolute errors, summed over these prompts, of the p-hat each (time forgetting, w_1, ..., w_J, kappa)
        in play would have given them before their outcomes (the blended sources' estimates are those of the
        counts in use: one harmonic field and one fit per step); ``shifted``: the base's estimate under each of
        ``counts``."""
        out = np.zeros(tuple(a.size for a in self.axes))
        grid = out.shape[1:-1]
        n_blended = len(grid)
        kappas = self.history.kappas
        no_u = np.zeros(rows.size)
        for i, base in enumerate(shifted):
            # every candidate blend at once: G_1 x ... x G_J x rows
            m = base[(None,) * n_blended]
            for j in range(1, n_blended + 1):
                # a source off, or abstaining for every prompt (live features not given), leaves its axis of one
                # value: every candidate weight of it scores alike, computed once and broadcast below
                if means[j] is not None and not np.isnan(means[j]).all():
                    m = _blend(m, self.axes[j].reshape((1,) * (j - 1) + (-1,) + (1,) * (n_blended - j + 1)),
                               means[j])
            if est.settings.mixing == "evidence":  # p = (kappa m + S) / (kappa + C), every kappa at once
                sd, rd = (est.successes_decayed_, est.rollouts_decayed_) if counts[i] is None else counts[i]
                k = kappas[:, None]
                p = (k * m[..., None, :] + sd[rows]) / (k + rd[rows])
                out[i] = np.broadcast_to(np.abs(p - rate).sum(axis=-1), grid + (kappas.size,))
                continue
            m = np.broadcast_to(m, grid + (rows.size,))
            for idx in np.ndindex(grid):
                out[(i, *idx)] = [np.abs(self.history.mix(est, rows, m[idx], no_u, k, counts[i])[0] - rate).sum()
                                  for k in kappas]
        return out

    def commit(self, board, time_counts) -> None:
        self.board, self.history.time_counts = board, time_counts

    # -- persistence ---------------------------------------------------------------------------------

    def arrays(self, n_nodes: int) -> dict[str, np.ndarray]:
        """Copies of the scoreboard and the history's ``time_counts``, as ``Estimator.state_dict`` saves them (a
        board not in play empty; ``time_counts`` 0 x 2 x N unless time_forgetting is "auto")."""
        out = {name: b.copy() for name, b in self.board.items()}
        out["time_counts"] = self.history.state(n_nodes)
        return out

    def load(self, state: dict, n_nodes: int) -> None:
        """Take the scoreboard and ``time_counts`` of a (current-layout) state dict, each checked to be what
        these settings keep."""
        for name, shape in self.shapes.items():
            got = np.asarray(state[name], dtype=np.float64)
            if got.shape != shape:
                raise DataError(f"saved {name} has shape {got.shape}, expected {shape} (the online choices these "
                                "settings make continue from their scoreboard)")
            self.board[name] = got.copy()
        self.history.load(state, n_nodes)


def _blend(m, w, mean):
    """(1 - w) m + w mean, and m where ``mean`` is NaN (the source abstains for that prompt; ``w`` may be an array
    of candidate weights that broadcasts against the prompts' last axis)."""
    gap = np.isnan(mean)
    if gap.all():  # no opinion on any prompt: m itself, along the candidates' axis too
        return np.broadcast_to(m, np.broadcast_shapes(np.shape(m), np.shape(w), np.shape(mean)))
    mixed = (1.0 - w) * m + w * mean
    return np.where(gap, np.broadcast_to(m, mixed.shape), mixed) if gap.any() else mixed
