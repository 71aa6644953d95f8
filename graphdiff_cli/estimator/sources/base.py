"""``Source``: the one protocol of everything the graph's estimate reads (docs/explanation/estimator.md).

A source gives each prompt an estimate of its success probability; the mix (``estimator.mix``) blends the
sources of an estimator's list in order, m_0 = the first's (the mean-field states), m_j = (1 - w_j) m_{j-1}
+ w_j source_j, and the prompt's own history (``sources.history``) mixes m with the prompt's outcomes last.

A source keeps its own state arrays (``arrays``: names of rows of ``io.estimator_layout.STATE_ARRAYS``),
computes a step's new state without assigning it (``observe``, then ``commit``: an update is all or
nothing), grows with ``extend`` (``grow``, then ``commit``), and declares its online choices: its weight's
candidates and start (``grid``, ``start``) and any board of its own (``boards``, ``score``). It reads the
evidence every source shares (the graph, the forgotten counts, the global counts) from the estimator it is
handed, never writes it, and what one call knows of its prompts besides (``Context``: the live features the
trainer observed for them) from that call's ``context``.

A source may abstain: a NaN in its mean says "no opinion" for that prompt, and the blend keeps m_{j-1} there
(``estimator.mix``); ``says`` tells which prompts it has an opinion on without computing the estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Inputs:
    """What an estimator knows of its prompts besides the graph, static, one row per prompt (None: not given):
    the ``embeddings`` (N x d float32), the encoded ``covariates`` (N x c float64, ``core.covariates``) and the
    ``reference_rate`` (N float64, NaN where a prompt has none)."""

    embeddings: np.ndarray | None = None
    covariates: np.ndarray | None = None
    reference_rate: np.ndarray | None = None


NO_INPUTS = Inputs()


@dataclass(frozen=True)
class Context:
    """What one call (a read or a step) knows of its prompts besides the estimator's state, one row per prompt of
    the call (None: not given): ``live`` (rows x f float64), the live features the trainer observed for them at
    that step (a row of NaN: none for that prompt)."""

    live: np.ndarray | None = None


NO_CONTEXT = Context()


@dataclass(frozen=True)
class Step:
    """One training step as the sources see it: ``obs`` (``core.meanfield.Observations``), ``p_then`` (the
    model's prediction for them before it), the forgotten counts (successes, rollouts) before (``old``) and
    after (``new``), ``switched`` (the time forgetting in use changed, so every prompt's counts moved) and
    the new forgotten global counts; ``context``: what the step knew of its prompts (rows of ``obs.ids``)."""

    obs: object
    p_then: np.ndarray
    old: tuple
    new: tuple
    switched: bool
    global_counts: np.ndarray
    context: Context = NO_CONTEXT


class Source:
    """A source of the graph's estimate. Subclasses set ``name``, and, to be blended in, ``grid`` and
    ``start`` and a ``weight`` ("auto": chosen online over ``grid``, a number, or None: off, skipped); the
    first source of a list is the base, which has no weight."""

    name = "source"
    # the rows of io.estimator_layout.STATE_ARRAYS that belong to it: those ``state``/``load`` save and read,
    # its boards (saved with the mix's scoreboard) and, for the states, the mean-field model the driver runs
    arrays: tuple[str, ...] = ()
    grid = np.array([0.0])        # its weight's candidates when chosen online
    start = 0.0                   # the candidate in use before any error

    def __init__(self, settings, n_nodes: int, inputs: Inputs = NO_INPUTS):
        self.weight = None

    # -- its weight in the mix -----------------------------------------------------------------------

    @property
    def on(self) -> bool:
        """Whether it plays in the estimate (an off source is skipped in the blend, never blended at weight 0)."""
        return self.weight is not None

    def candidates(self) -> np.ndarray:
        """Its axis of the mix's board: ``grid`` when chosen online, else the one weight in use (0 when off)."""
        if self.weight == "auto":
            return self.grid
        return np.array([0.0 if self.weight is None else float(self.weight)])

    def start_index(self) -> int:
        return int(np.flatnonzero(self.grid == self.start)[0]) if self.weight == "auto" else 0

    # -- the estimate --------------------------------------------------------------------------------

    def estimate(self, est, rows: np.ndarray, model, context: Context = NO_CONTEXT) -> tuple[np.ndarray,
                                                                                            np.ndarray | None]:
        """(mean, spread or None) for the prompts ``rows``; ``model``: (p_model, u) of the mean-field states
        for them; ``context``: what the call knows of them (``Context``). A NaN mean: no opinion (abstains)."""
        raise NotImplementedError

    def says(self, est, rows: np.ndarray, context: Context = NO_CONTEXT) -> np.ndarray | None:
        """Which of ``rows`` it has an opinion on (a mask), or None: every one (a source that never abstains)."""
        return None

    def estimates(self, est, rows: np.ndarray, model, counts: list) -> list[np.ndarray]:
        """The mean under each of ``counts`` ((successes, rollouts) forgotten otherwise, or None for the counts
        in use), for scoring the time forgetting; a source that reads only the counts in use gives one."""
        mean = self.estimate(est, rows, model)[0]
        return [mean for _ in counts]

    # -- its own online choices ----------------------------------------------------------------------

    def boards(self) -> dict[str, tuple]:
        """The shape of each board of its own (empty: none in play)."""
        return {}

    def score(self, est, rows: np.ndarray, rate: np.ndarray, boards: dict,
              context: Context = NO_CONTEXT) -> dict[str, np.ndarray]:
        """Its boards after this step's prompts ``rows`` (observed ``rate``; ``context``: what the step knew of
        them), scored before their outcomes."""
        return {}

    # -- a step, growth, persistence -----------------------------------------------------------------

    def observe(self, est, step: Step) -> dict:
        """Its new state after ``step``, {attribute: value}, computed without assigning anything."""
        return {}

    def grow(self, est, spec, n: int, counts: tuple) -> dict:
        """Its state once the graph grew from n prompts to ``spec``'s (new prompts have no outcomes;
        ``counts``: the grown forgotten counts), without assigning anything."""
        return {}

    def commit(self, new: dict) -> None:
        """Make ``observe``'s or ``grow``'s result its state: plain assignments."""
        for attr, value in new.items():
            setattr(self, attr, value)

    def state(self) -> dict[str, np.ndarray]:
        """Copies of the arrays it saves itself (its ``arrays`` but its boards, which the mix saves), by name, as
        ``Estimator.state_dict`` saves them."""
        return {}

    def load(self, state: dict, n_nodes: int) -> None:
        """Take its ``arrays`` from a (current-layout) state dict, checked."""


def global_rate(global_counts) -> float:
    """The observed global success rate (s + 1) / (n + 2) of (forgotten) global counts (s, n): what a source
    says where it has no evidence."""
    gs, gn = global_counts
    return (gs + 1.0) / (gn + 2.0)
