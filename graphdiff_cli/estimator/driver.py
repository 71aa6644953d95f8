"""``Estimator``: the Python API over the mean-field core (the contract other tools call).

    est = Estimator(graph, labels, n_states=K)                    # the default preset
    est = Estimator(graph, labels, n_states=K, preset="paper")    # Sections 3.4-3.6 exactly
    est = Estimator(graph, labels, n_states=K, preset="paper", beta=4.0, schedule="sequential")
    est = Estimator(graph, labels, n_states=K, embeddings=E)    # + the read-out of the embedding
    est = Estimator(graph, labels, n_states=K, covariates=X, reference_rate=r)  # + the read-out of covariates
    stats = est.update(ids, n, s)   # one training step; stats["elbo"], stats["iterations"], ...
    est.update(ids, n, s, live=F)   # + live features the trainer observed for those prompts (len(ids) x f)
    p = est.predict(ids=None)       # p-hat for those node indices (all if None)
    p = est.predict(ids, live=G)    # + the candidates' live features (the live read-out; without: as before)
    est.save(path); est = Estimator.load(path)

Every setting, its default, range and meaning, and the presets live in ``graphdiff_cli.settings``: a
keyword names a setting and overrides the preset's value (an unknown name, a bad value, or a setting
that cannot act under the chosen schedule or mixing is refused in one line).

An update that raises leaves the estimator exactly as it was: everything is validated first, inference
runs on copies, and the new state is committed by plain assignments at the end.
"""

from __future__ import annotations

import time

import numpy as np

from ..core import belief as bl
from ..core import meanfield as mf
from ..core.beta import DEFAULT_GROUP_SIZE, mean_variance, zero_variance_from_moments
from ..core.graph import validate_graph
from ..errors import DataError, InvalidArgumentError
from ..io import estimator_layout as layout
from ..settings import EstimatorSettings, from_dict, resolve
from .mix import Mix
from .sources import NO_CONTEXT, SOURCES, Context, Inputs, Step, global_rate
from .versions import upgrade


class Estimator:
    """Online graph-based estimator of each prompt's success probability under the current policy.

    ``settings`` (an ``EstimatorSettings``) is used as it is; otherwise ``preset`` ("default" when
    omitted, or "paper") gives the settings and any keyword of ``graphdiff_cli.settings`` overrides one.
    ``embeddings`` (N x d, row i the embedding of node i) lets the graph's estimate use the ridge read-out
    of the embedding (setting ``readout``; docs/explanation/estimator.md): "auto" (the default preset) uses it when
    they are given, a number needs them. ``covariates`` (N x c, the encoded features of ``core.covariates``) and
    ``reference_rate`` (N, a reference model's pass rate, NaN where a prompt has none) do the same for the read-out
    of the covariates (setting ``covariate_readout``).

    The graph's estimate is the mix (``estimator.mix``) of the sources of ``SOURCES`` (``estimator.sources``),
    which the prompt's own history then mixes with its outcomes; a subclass that sets ``SOURCES`` blends others.
    """

    SOURCES = SOURCES

    def __init__(self, graph, labels, n_states: int, *, embeddings=None, covariates=None, reference_rate=None,
                 preset: str | None = None,
                 settings: EstimatorSettings | None = None, _q=None, _own_q: bool = False,
                 _graph_verified: bool = False, **overrides):
        # _q (internal, from_state_dict): the N x K q to start from instead of A, so loading a state
        # never holds A and the saved q at once; _own_q: _q may be used in place (nobody else holds it);
        # _graph_verified: W was read back from graphdiff's own artifact (from_state_dict's ``verified``)
        if settings is None:
            settings = resolve(preset, **overrides)
        elif preset is not None or overrides:
            raise InvalidArgumentError("give either settings or a preset and keyword overrides, not both")
        elif not isinstance(settings, EstimatorSettings):
            raise InvalidArgumentError(f"settings must be an EstimatorSettings, got {type(settings).__name__}")
        if isinstance(n_states, bool) or not isinstance(n_states, (int, np.integer)) or n_states < 1:
            raise InvalidArgumentError(f"n_states must be a positive integer, got {n_states!r}")
        labels = np.asarray(labels)
        if labels.ndim != 1 or labels.dtype.kind not in "iu":
            raise DataError(f"labels must be a 1-D integer array, got dtype {labels.dtype}, shape {labels.shape}")
        labels = labels.astype(np.int64)
        if labels.size and (labels.min() < 0 or labels.max() >= n_states):
            i = int(np.flatnonzero((labels < 0) | (labels >= n_states))[0])
            raise DataError(f"labels[{i}] = {labels[i]} is out of range [0, {n_states})")
        w = validate_graph(graph, n_nodes=labels.size, check_symmetry=not _graph_verified)
        self._embeddings = _check_embeddings(embeddings, labels.size)
        if self._embeddings is None and settings.readout not in (None, "auto"):
            raise InvalidArgumentError(f"readout {settings.readout:g} needs the prompts' embeddings (embeddings=, or "
                                       "graphdiff init with the embeddings artifact the graph was built from)")
        self._covariates, self._reference = _check_covariates(covariates, reference_rate, labels.size)
        if self._covariates is None and settings.covariate_readout not in (None, "auto"):
            raise InvalidArgumentError(f"covariate_readout {settings.covariate_readout:g} needs the prompts' covariates "
                                       "(covariates=, or graphdiff embed with covariates)")
        self.settings = settings
        self._spec = mf.ModelSpec(graph=w, labels=labels, n_states=int(n_states), beta=settings.beta,
                                  epsilon=settings.epsilon)
        self._init_state(_q, _own_q)

    # -- state -------------------------------------------------------------------------------------

    def _init_state(self, q=None, own: bool = False) -> None:
        """t = 0: q = A (the smoothed spectral prior) unless ``q`` is given, every state Beta(1, 1), no history."""
        import torch

        from ..backends.device import resolve_device

        self.device_ = resolve_device(self.settings.device)
        if self.settings.schedule == "sequential":
            self.device_ = torch.device("cpu")  # Gauss-Seidel is inherently serial
        k, n = self.n_states, self.n_nodes
        if q is not None:
            q = np.asarray(q)
            if q.shape != (n, k):
                raise DataError(f"saved q has shape {q.shape}, expected {(n, k)}")
            # q is updated in place: share the array only when it is handed over (own), else copy
            make = torch.as_tensor if own else torch.tensor
            self._q = make(q, dtype=self._torch_dtype).to(self.device_)
        else:
            # q = A (mf.smoothed_prior), built in place in the working dtype: no N x K float64 intermediate
            self._q = torch.empty((n, k), dtype=self._torch_dtype, device=self.device_)
            mf.fill_prior(self._q, self._spec.labels, self.settings.epsilon)
        # q = A: the first step may then run in place (undone by rebuilding A), with no copy of q
        self._q_is_prior = q is None
        # the rows of q changed since the state this estimator was made from (a mask of N; None: unknown), so
        # that a STATE's step writes only those (``q_rows_changed``)
        self._q_changed = None
        for a in layout.DRIVER_ARRAYS:  # a, b, the counts, the evidence: io.estimator_layout.STATE_ARRAYS
            setattr(self, a.attr, layout.initial(a, n, k))
        # the sources (each with its own state), their mix and its one scoreboard, and the history's counts under
        # every delta for time_forgetting "auto"
        self.mix = Mix.of_settings(self.settings, n, self.inputs, self.SOURCES)
        self.step_ = 0
        # residual schedule: rows whose inputs changed since q last reached its fixed point; None means
        # q is not at a fixed point (q = A after init), so the next residual step starts from every row
        self._dirty: np.ndarray | None = None

    @property
    def _torch_dtype(self):
        import torch

        return torch.float64 if self.settings.dtype == "float64" else torch.float32

    @property
    def n_nodes(self) -> int:
        """The number of prompts N (the graph's nodes)."""
        return self._spec.n_nodes

    @property
    def n_states(self) -> int:
        """The number of latent difficulty states K."""
        return self._spec.n_states

    @property
    def graph(self):
        """The graph W (N x N, symmetric, a scipy sparse matrix) the estimator was built on."""
        return self._spec.graph

    @property
    def labels(self) -> np.ndarray:
        """Each prompt's cluster label in 0..K-1 (the spectral clustering's, Section 3.4)."""
        return self._spec.labels

    @property
    def embeddings(self) -> np.ndarray | None:
        """The prompts' embeddings (N x d, float32) the read-out reads, or None."""
        return self._embeddings

    @property
    def covariates(self) -> np.ndarray | None:
        """The prompts' encoded covariates (N x c, float64) the covariates' read-out reads, or None."""
        return self._covariates

    @property
    def reference_rate(self) -> np.ndarray | None:
        """Each prompt's reference pass rate (N, float64, NaN where it has none), or None."""
        return self._reference

    @property
    def inputs(self) -> Inputs:
        """What the estimator knows of its prompts besides the graph (``sources.Inputs``)."""
        return Inputs(self._embeddings, self._covariates, self._reference)

    @property
    def covariate_readout_(self) -> float | None:
        """The covariates' read-out's weight in the graph's estimate (None when it is off)."""
        return self._weight("covariate_readout")

    @property
    def live_readout_(self) -> float | None:
        """The live features' read-out's weight in the graph's estimate (None when it is off)."""
        return self._weight("live_readout")

    @property
    def live_features_(self) -> int | None:
        """f, the number of live features the live read-out was given at its first step with them (None before,
        or when it is off)."""
        source = self.mix.source("live_readout")
        return None if source is None or not source.on else source.n_features

    @property
    def readout_on(self) -> bool:
        """Whether the graph's estimate has the read-out of the embedding (readout set, embeddings given)."""
        return self.settings.readout is not None and self._embeddings is not None

    def _weight(self, name: str) -> float | None:
        """The weight in use of the source ``name`` in the graph's estimate (None when it is off or absent)."""
        j = next((j for j, s in enumerate(self.mix.sources) if s.name == name), 0)
        return self.mix.weight(j) if j else None

    @property
    def readout_(self) -> float | None:
        """The read-out's weight in the graph's estimate: the configured number, the online choice ("auto"), or
        None when there is no read-out."""
        return self._weight("readout")

    @property
    def readout_ridge_(self) -> float | None:
        """The read-out's ridge strength in use (None when there is no read-out)."""
        source = self.mix.source("readout")
        return source.ridge(self.mix.board) if source is not None and self.readout_on else None

    @property
    def readout_errors_(self) -> np.ndarray:
        """readout_ridge "auto": per value of core.readout.RIDGE_GRID, the summed absolute error of the read-out
        alone on each observed prompt before its outcomes (empty when not in play)."""
        return self.mix.board.get("readout_errors", np.zeros(0))

    @property
    def readout_gram_(self) -> np.ndarray:
        """The read-out's sum over prompts with evidence of x x^T, x = [1, embedding] (0 x 0 without a read-out)."""
        source = self.mix.source("readout")
        return np.zeros((0, 0)) if source is None else source.readout_gram_

    @property
    def readout_moment_(self) -> np.ndarray:
        """The read-out's sum of x times each prompt's forgotten rate (empty without a read-out)."""
        source = self.mix.source("readout")
        return np.zeros(0) if source is None else source.readout_moment_

    @property
    def lp_field_(self) -> np.ndarray | None:
        """Label propagation's harmonic field of the forgotten counts (None until first needed)."""
        source = self.mix.source("label_propagation")
        return None if source is None else source.lp_field_

    @property
    def q_(self) -> np.ndarray:
        """The assignment probabilities q (N x K) as a numpy copy."""
        return self._q.detach().cpu().numpy().copy()

    @property
    def kappa_(self) -> float:
        """The prior strength in use: the configured number, or the prequential choice ("auto"; chosen
        together with label propagation's weight, the time forgetting and the read-out's weight when any is "auto"
        too)."""
        return self.mix.kappa

    @property
    def propagation_(self) -> float | None:
        """Label propagation's weight in the graph's estimate: the configured number, the online choice
        ("auto"), or None when label_propagation is off."""
        return self._weight("label_propagation")

    @property
    def time_forgetting_(self) -> float:
        """The per-step forgetting of prompts' own counts in use: the configured number or the online choice."""
        return self.mix.time_forgetting

    @property
    def nu_(self) -> float | None:
        """The belief strength in use: the configured number or the prequential choice ("auto"); None
        when belief_strength is unset (the belief is then mix_by_evidence's, or Appendix E's)."""
        return self.mix.nu

    def source_weights(self, ids=None, live=None) -> dict[str, np.ndarray | None]:
        """Each source's weight in p-hat, per prompt of ``ids`` (node indices; all if None), summing to 1:
        ``states`` (the mean-field states' estimate, shifted by the neighbours' offsets under neighbor_smoothing),
        ``label_propagation`` and ``readout`` (None when off) - the parts of the graph's estimate m = (1 - r)
        ((1 - w) states + w propagated) + r readout, w and r the weights in use (one entry per source of
        ``SOURCES``) - and ``history``, the prompt's own outcomes: C_i / (kappa + C_i) of its forgotten rollouts
        C_i under evidence mixing (offset mixing: the weight of its own residuals, the same), 1 - gamma for a
        prompt rolled out under gamma mixing, else 0. ``live``: the prompts' live features, as ``estimates`` takes
        them (a source's share is 0 for a prompt it abstains for)."""
        rows = self._rows(ids)
        return self.mix.shares(self, rows, self._context(live, rows.size))

    def state_occupancy(self, ids=None) -> tuple[np.ndarray, np.ndarray]:
        """(sum_i q_ik: the expected number of the prompts ``ids`` (node indices; all if None) in state k, how many
        of them have k as their most probable state), read a block of rows of q at a time."""
        rows = self._rows(ids)
        k = self.n_states
        expected, counts = np.zeros(k), np.zeros(k, dtype=np.int64)
        for i in range(0, rows.size, mf.RESIDUAL_BLOCK_ROWS):
            q = self._q_rows(rows[i:i + mf.RESIDUAL_BLOCK_ROWS])
            expected += q.sum(axis=0, dtype=np.float64)
            counts += np.bincount(q.argmax(axis=1), minlength=k)
        return expected, counts

    @property
    def kappa_errors_(self) -> np.ndarray:
        """prior_strength "auto" chosen alone: per kappa of bl.KAPPA_GRID, the summed absolute error of the
        p-hat it would have given each observed prompt before its outcomes (empty when not in play)."""
        return self.mix.board["kappa_errors"]

    @property
    def belief_loglik_(self) -> np.ndarray:
        """belief_strength "auto": per value of bl.KAPPA_GRID, the summed log-likelihood of each observed group
        under the belief it would have given before the group's outcomes (empty when not in play)."""
        return self.mix.board["belief_loglik"]

    @property
    def mix_errors_(self) -> np.ndarray:
        """The joint choice (label_propagation, time_forgetting or readout "auto"): the summed absolute error of
        every (time forgetting, propagation weight, read-out weight, kappa) in play (empty when not in play)."""
        return self.mix.board["mix_errors"]

    @property
    def time_counts_(self) -> np.ndarray | None:
        """time_forgetting "auto": the forgotten counts (successes, rollouts) under every delta of bl.TIME_GRID."""
        return self.mix.history.time_counts

    def _history_prior(self) -> tuple[np.ndarray, np.ndarray]:
        """(a_hist, b_hist) for the coming step.

        Cumulative: the previous posterior (Section 3.4). Windowed (Appendix G): Beta(1, 1) plus the
        responsibility-weighted counts of the previous L - 1 steps, each weighted by the q that step
        converged to (S^(L), F^(L) of Appendix G.1); with the coming step that makes the L-step window.
        When L covers every step this is exactly the cumulative posterior, as the paper states.
        """
        c = self.settings
        if c.window is None and c.paper_exact:
            return self.a_.copy(), self.b_.copy()
        a0, b0 = self._state_prior()
        if c.window is None:
            ev = c.state_forgetting * self.state_evidence_
        else:
            ev = self._window_evidence.sum(axis=0)
        return a0 + ev[0], b0 + ev[1]

    def _state_prior(self) -> tuple[float, float]:
        """(a0, b0): Beta(1, 1) as in the paper, or, with state_prior="observed", a prior of the same
        strength (2 pseudo-rollouts) centred on the recent global success rate (s + 1) / (n + 2), so that
        a state without recent evidence predicts what the policy solves on average rather than 0.5 (the
        weakness Appendix G points out)."""
        if self.settings.state_prior == "uniform":
            return 1.0, 1.0
        g = global_rate(self.global_counts_)
        return 2.0 * g, 2.0 * (1.0 - g)

    # -- the API -----------------------------------------------------------------------------------

    def update(self, ids, n, s, live=None) -> dict:
        """Apply one training step: prompts ``ids`` (node indices) got ``n`` rollouts, ``s`` successes.
        ``live``: len(ids) x f live features the trainer observed for those prompts at this step (a row of NaN:
        none for that prompt; f is fixed by the first step that gives them), for the live read-out (setting
        ``live_readout``): it is scored on them and learns from them.

        Returns {"step", "elbo" (one value per evaluated state), "iterations", "converged",
        "n_observed", "rollouts", "successes", "seconds"}.
        """
        t0 = time.perf_counter()
        obs = mf.make_observations(ids, n, s, self.n_nodes)
        context = self._step_context(live, ids, n, obs)
        p_then = self._model_prediction(obs.ids)[0] if len(obs) else np.zeros(0)
        board = self.mix.score(self, obs, p_then, context)
        a_hist, b_hist = self._history_prior()
        if self.settings.schedule == "residual":
            # in place: q is updated where it lies, with a journal of the touched rows that undoes the
            # step should anything below raise (an update is all or nothing)
            res = mf.run_step_residual(self._spec, self._q, a_hist, b_hist, obs, self._dirty,
                                       max_iters=self.settings.max_iters, tol=self.settings.residual_tol,
                                       in_place=True, q0_is_prior=self._q_is_prior)
            dirty = obs.ids.copy() if res.converged else None  # their l_ik leaves at the next step
        else:
            res = mf.run_step(self._spec, self._q, a_hist, b_hist, obs, schedule=self.settings.schedule,
                              max_iters=self.settings.max_iters, tol=self.settings.tol)
            dirty = None
        try:
            self._commit(res, obs, p_then, board, dirty, context)
        except BaseException:
            res.undo()
            raise
        return {
            "step": self.step_,
            "elbo": res.elbo,
            "iterations": res.iterations,
            "converged": res.converged,
            "rows_updated": res.rows_updated,
            "n_observed": len(obs),
            "rollouts": int(obs.n.sum()),
            "successes": int(obs.s.sum()),
            "seconds": time.perf_counter() - t0,
        }

    def extend(self, graph, labels, embeddings=None, covariates=None, reference_rate=None) -> np.ndarray:
        """Append prompts: nodes N.. of ``graph`` (the old W with the new prompts' edges, ``graphdiff
        extend``) are new, with prior states ``labels[N:]`` (``labels[:N]`` must be the current ones) and, when
        the estimator has embeddings, embeddings ``embeddings`` (one row per new prompt; the read-out gives
        them its estimate at once), and likewise the new prompts' ``covariates`` and ``reference_rate`` when it has
        covariates (encoded by the spec the first ones were: ``core.covariates.encode``).

        A new prompt starts as a prompt does at init (q_i = A_i, no outcomes); when q is at a fixed point
        (the residual schedule after a converged step) the new rows are then relaxed by Proposition 1 with
        every old row held (``mf.relax_unobserved``), as the next residual step would relax them. Nothing
        learned is lost: a, b, the online choices and every prompt's counts stay. The rows whose inputs
        changed (the new ones and every old prompt whose edges did) are marked for the next residual step.
        All or nothing:
        everything is checked and built before anything is assigned. Returns the rows whose edges changed.
        """
        import torch

        n = self.n_nodes
        labels = np.asarray(labels)
        if labels.ndim != 1 or labels.dtype.kind not in "iu" or labels.size < n:
            raise DataError(f"extend needs integer labels for at least the {n} current prompts, got shape "
                            f"{labels.shape}, dtype {labels.dtype}")
        labels = labels.astype(np.int64)
        if not np.array_equal(labels[:n], self._spec.labels):
            raise DataError("extend: the labels of the current prompts must stay as they are")
        if labels.size > n and (labels[n:].min() < 0 or labels[n:].max() >= self.n_states):
            raise DataError(f"extend: new labels must be in [0, {self.n_states})")
        w = validate_graph(graph, n_nodes=labels.size)
        m = labels.size - n
        emb = self._embeddings
        if emb is not None:
            if embeddings is None:
                raise DataError(f"extend: this estimator has the prompts' embeddings; give the {m} new prompts' too")
            new = _check_embeddings(embeddings, m)
            if new.shape[1] != emb.shape[1]:
                raise DataError(f"extend: the new embeddings have {new.shape[1]} coordinates, the estimator's "
                                f"{emb.shape[1]}")
            emb = np.concatenate([emb, new])
        elif embeddings is not None:
            raise DataError("extend: this estimator has no embeddings; the new prompts' cannot be used")
        cov, ref = self._covariates, self._reference
        if cov is not None:
            if covariates is None:
                raise DataError(f"extend: this estimator has the prompts' covariates; give the {m} new prompts' too")
            new_cov, new_ref = _check_covariates(covariates, reference_rate, m)
            if new_cov.shape[1] != cov.shape[1] or (new_ref is None) != (ref is None):
                raise DataError(f"extend: the new covariates have {new_cov.shape[1]} features"
                                f"{'' if new_ref is None else ' and a reference rate'}, the estimator's "
                                f"{cov.shape[1]}{'' if ref is None else ' and a reference rate'}")
            cov = np.concatenate([cov, new_cov])
            ref = None if ref is None else np.concatenate([ref, new_ref])
        elif covariates is not None or reference_rate is not None:
            raise DataError("extend: this estimator has no covariates; the new prompts' cannot be used")
        old = self._spec.graph
        top = w[:n, :n]
        changed = np.flatnonzero((np.diff(top.indptr) != np.diff(old.indptr))
                                 | (np.asarray(abs(top - old).sum(axis=1)).ravel() > 0))
        changed = np.union1d(changed, np.unique(w[:n, n:].tocoo().row)).astype(np.int64)
        spec = mf.ModelSpec(graph=w, labels=labels, n_states=self.n_states, beta=self.settings.beta,
                            epsilon=self.settings.epsilon)
        q_new = torch.empty((m, self.n_states), dtype=self._torch_dtype, device=self.device_)
        mf.fill_prior(q_new, labels[n:], self.settings.epsilon)
        q = torch.cat([self._q, q_new])
        if self._dirty is not None and m:
            mf.relax_unobserved(spec, q, np.arange(n, n + m), max_rounds=self.settings.max_iters,
                                tol=self.settings.residual_tol)
        grown = {a.attr: layout.grow(a, getattr(self, a.attr), m)  # a new prompt has no outcomes
                 for a in layout.DRIVER_ARRAYS if a.grows == layout.ZEROS}
        time_counts = self.mix.history.grow(m)
        dirty = None if self._dirty is None else np.union1d(self._dirty, np.concatenate(
            [changed, np.arange(n, n + m)])).astype(np.int64)
        counts = (grown["successes_decayed_"], grown["rollouts_decayed_"])
        sources = [s.grow(self, spec, n, counts) for s in self.mix.sources]
        q_changed = None if self._q_changed is None else np.concatenate([self._q_changed, np.ones(m, dtype=bool)])
        # commit: plain assignments only
        self._spec, self._q, self._embeddings = spec, q, emb
        self._covariates, self._reference = cov, ref
        self._q_changed = q_changed
        for attr, value in grown.items():
            setattr(self, attr, value)
        for source, new in zip(self.mix.sources, sources):
            source.commit(new)
        self.mix.commit(self.mix.board, time_counts)
        self._dirty = dirty
        return changed

    def _commit(self, res, obs, p_then, board, dirty, context=NO_CONTEXT) -> None:
        """Make the step's results the estimator's state (everything is computed before any assignment)."""
        successes = self.successes_.copy()
        rollouts = self.rollouts_.copy()
        successes[obs.ids] += obs.s.astype(np.int64)
        rollouts[obs.ids] += obs.n.astype(np.int64)
        lam = self.settings.prompt_forgetting

        def forget(succ, roll, delta):  # delta at every step, then lambda at the visit, then the visit's counts
            succ, roll = delta * succ, delta * roll  # fresh arrays
            succ[obs.ids] = lam * succ[obs.ids] + obs.s
            roll[obs.ids] = lam * roll[obs.ids] + obs.n
            return succ, roll

        chosen = self.mix.time_index(board)  # the time forgetting in use after this step
        time_counts, succ_d, roll_d = self.mix.history.forget(chosen, forget, self.successes_decayed_,
                                                              self.rollouts_decayed_)
        off_d = self.offset_decayed_.copy()
        off_d[obs.ids] = lam * off_d[obs.ids] + (obs.s - obs.n * p_then)
        rho = self.settings.state_forgetting
        state_ev = rho * self.state_evidence_ + np.stack(res.evidence)
        global_counts = rho * self.global_counts_ + np.array([obs.s.sum(), obs.n.sum()])
        window_ev = self._window_evidence
        if self.settings.window is not None:
            keep = self.settings.window - 1
            window_ev = np.concatenate([window_ev, np.stack(res.evidence)[None]])[-keep:] if keep else \
                window_ev[:0]
        step = Step(obs, p_then, (self.successes_decayed_, self.rollouts_decayed_), (succ_d, roll_d),
                    chosen != self.mix.time_index(), global_counts, context)
        sources = [s.observe(self, step) for s in self.mix.sources]
        changed = None if self._q_changed is None or res.rows_touched is None else self._q_changed | res.rows_touched
        self._q, self.a_, self.b_ = res.q, res.a, res.b
        self._q_changed = changed
        for source, new in zip(self.mix.sources, sources):
            source.commit(new)
        self.mix.commit(board, time_counts)
        self.successes_, self.rollouts_, self._window_evidence = successes, rollouts, window_ev
        self.successes_decayed_, self.rollouts_decayed_, self.offset_decayed_ = succ_d, roll_d, off_d
        self.state_evidence_, self.global_counts_ = state_ev, global_counts
        self._dirty = dirty
        self._q_is_prior = False
        self.step_ += 1

    def _rows(self, ids) -> np.ndarray:
        if ids is None:
            return np.arange(self.n_nodes)
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise DataError("ids must be a 1-D array of integer node indices")
        ids = ids.astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_nodes):
            i = int(np.flatnonzero((ids < 0) | (ids >= self.n_nodes))[0])
            raise DataError(f"ids[{i}] = {ids[i]} is out of range: the graph has {self.n_nodes} prompts")
        return ids

    def _q_rows(self, rows: np.ndarray) -> np.ndarray:
        import torch

        idx = torch.as_tensor(rows, device=self.device_)
        return self._q.index_select(0, idx).cpu().numpy()

    def _model_prediction(self, rows: np.ndarray, block: int = mf.RESIDUAL_BLOCK_ROWS) -> tuple[np.ndarray, np.ndarray]:
        """mf.model_prediction for ``rows``, a block of rows of q at a time (no N x K float64 copy)."""
        if rows.size <= block:
            return mf.model_prediction(self._q_rows(rows), self.a_, self.b_)
        parts = [mf.model_prediction(self._q_rows(rows[i:i + block]), self.a_, self.b_)
                 for i in range(0, rows.size, block)]
        return np.concatenate([p for p, _ in parts]), np.concatenate([u for _, u in parts])

    def predict(self, ids=None, live=None) -> np.ndarray:
        """p-hat_i (Section 3.6) for the given node indices, all prompts if None; ``live``: as ``estimates``."""
        return self.estimates(ids, live=live)["p"]

    def estimates(self, ids=None, group_size: int = DEFAULT_GROUP_SIZE, live=None) -> dict[str, np.ndarray]:
        """Everything a scheduler needs per prompt.

        p (Section 3.6), difficulty = 1 - p, p_model = sum_k q_ik mu_k, uncertainty = u-hat_i of
        Appendix E, n_seen (rollouts observed so far), and the belief about the success probability
        that decisions use: its mean and variance (what Thompson sampling and the target rule read) and
        p_zero_variance = E[p^g + (1 - p)^g], the probability that a group of ``group_size`` rollouts is
        all-correct or all-wrong. With belief_strength set, the belief is bl.belief_parameters' Beta of
        strength ``nu_`` (under "evidence" mixing its mean is p when nu = kappa); unset, it is a Beta
        with mean p and the mixing's variance: for "gamma" (the paper) (weight of the model in p)^2 *
        u-hat, since the prompt's own history enters p as a fixed number and the model part carries the
        uncertainty.

        ``live``: len(ids) x f live features observed for these prompts at the coming step (N x f for all; a row
        of NaN: none for that prompt), read by the live read-out; a prompt without them gets exactly what it would
        without the live read-out.
        """
        rows = self._rows(ids)
        context = self._context(live, rows.size)
        p_model, u = self._model_prediction(rows)
        p_graph = self._graph_estimate(rows, p_model, u, context)
        p, var = self.mix.history.mix(self, rows, p_graph, u, self.kappa_)
        mean = p
        nu = self.nu_
        if nu is not None:
            a, b = bl.belief_parameters(p_graph, self.successes_decayed_[rows], self.rollouts_decayed_[rows], nu)
            mean, var = mean_variance(a, b)
        pzv = zero_variance_from_moments(mean, var, group_size)
        return {"p": p, "difficulty": 1.0 - p, "p_model": p_model, "uncertainty": u, "mean": mean,
                "variance": var, "n_seen": self.rollouts_[rows], "p_zero_variance": pzv}

    def _graph_estimate(self, rows: np.ndarray, p_model: np.ndarray, u: np.ndarray | None = None,
                        context: Context = NO_CONTEXT) -> np.ndarray:
        """The graph's estimate m_i that the history mixes with the prompt's own outcomes (``Mix.graph_estimate``)."""
        return self.mix.graph_estimate(self, rows, (p_model, u), context)

    def _context(self, live, m: int) -> Context:
        """The ``Context`` of a call on m prompts: ``live`` checked (``check_live``) against the number of live
        features the live read-out was first given."""
        if live is None:
            return NO_CONTEXT
        return Context(live=check_live(live, m, self.live_features_))

    def _step_context(self, live, ids, n, obs) -> Context:
        """The ``Context`` of a step: ``live`` (a row per row of ``ids``) checked, then one row per prompt of
        ``obs.ids`` (rows with n = 0 dropped; a prompt listed twice takes its first row's features)."""
        context = self._context(live, np.asarray(ids).size)
        if context.live is None:
            return context
        keep = np.flatnonzero(np.asarray(n) > 0)
        _, first = np.unique(np.asarray(ids)[keep], return_index=True)  # sorted as obs.ids
        return Context(live=context.live[keep[first]])

    # -- persistence -------------------------------------------------------------------------------

    def state_dict(self, copy: bool = True) -> dict:
        """Arrays and config that determine the estimator completely (what ``save`` writes): ``version``
        (io.estimator_layout.VERSION), ``n_states``, ``config`` (the settings), ``step``, ``graph``, ``labels``
        and every array of io.estimator_layout.STATE_ARRAYS.

        ``copy=False`` returns q as a view of the estimator's own (on the CPU), valid until its next update:
        for writers that consume it at once, without an N x K copy. The other arrays are always copies.
        """
        out = {"version": layout.VERSION, "n_states": self.n_states, "config": self.settings.as_dict(),
               "step": self.step_, "graph": self._spec.graph, "labels": self._spec.labels,
               "embeddings": self._embeddings, "covariates": self._covariates, "reference_rate": self._reference,
               "q": self.q_ if copy else self._q.detach().cpu().numpy()}
        for a in layout.DRIVER_ARRAYS:
            out[a.name] = getattr(self, a.attr).copy()
        out.update(self.mix.arrays(self.n_nodes))
        for source in self.mix.sources:
            out.update(source.state())
        for a in layout.STATE_ARRAYS:  # a source this estimator's list lacks: its arrays empty, as when it is off
            if a.name not in out and a.name not in ("dirty", "at_fixed_point"):
                out[a.name] = np.zeros((0,) * len(a.shape), dtype=a.dtype)
        out["dirty"] = np.zeros(0, dtype=np.int64) if self._dirty is None else self._dirty.copy()
        out["at_fixed_point"] = np.array(self._dirty is not None)
        return out

    @classmethod
    def from_state_dict(cls, state: dict, device: str | None = None, copy: bool = True,
                        verified: bool = False) -> "Estimator":
        """The estimator ``state`` describes: ``state_dict``'s, or a state dict of any version read from disk
        (``io.estimator_store.read_state``), migrated first (``versions.upgrade``). ``copy=False`` lets it
        update ``state["q"]`` in place instead of copying it (for callers that hand the arrays over, as
        ``load`` does). ``verified=True``: the state was just read from an artifact graphdiff wrote, its
        checksums checked, so W's symmetry, checked when it was written, is not tested again
        (``validate_graph``'s ``check_symmetry``); every other check is made."""
        state = upgrade(state)
        missing = [name for name in layout.STATE_NAMES if name not in state]
        if missing:
            raise DataError(f"the saved estimator state lacks {', '.join(missing)}")
        cfg = dict(state["config"])
        if device is not None:
            cfg["device"] = device
        est = cls(state["graph"], state["labels"], state["n_states"], embeddings=state.get("embeddings"),
                  covariates=state.get("covariates"), reference_rate=state.get("reference_rate"),
                  settings=from_dict(cfg, "saved estimator settings"), _q=state["q"], _own_q=not copy,
                  _graph_verified=verified)
        n, k = est.n_nodes, est.n_states
        for a in layout.DRIVER_ARRAYS:
            value = np.array(state[a.name], dtype=a.dtype)  # a fresh array, owned by the estimator
            want = layout.resolve_shape(a, n, k)
            if value.ndim != len(want) or any(w is not None and w != d for w, d in zip(want, value.shape)):
                raise DataError(f"saved {a.name} has shape {value.shape}, expected {want} (None: any length)")
            setattr(est, a.attr, value)
        est.mix.load(state, n)
        for source in est.mix.sources:
            source.load(state, n)
        est.step_ = int(state["step"])
        if bool(np.asarray(state["at_fixed_point"])):
            est._dirty = np.asarray(state["dirty"], dtype=np.int64).copy()
        est._q_changed = np.zeros(n, dtype=bool)  # q is the state's
        # a saved step-0 state (what init writes) holds A: checked, so its first step can run in place
        est._q_is_prior = est.step_ == 0 and est._dirty is None and mf.is_prior(est._q, est._spec.labels,
                                                                                  est.settings.epsilon)
        return est

    def q_rows_changed(self) -> np.ndarray | None:
        """The rows of q that changed since the state this estimator was made from (``from_state_dict``, ``load``)
        or last marked saved (``mark_saved``), sorted; None when unknown (an estimator built from a graph, or a
        step that may have moved every row: the first after init, the full-sweep schedules)."""
        return None if self._q_changed is None else np.flatnonzero(self._q_changed)

    def mark_saved(self) -> None:
        """Say that the estimator's state as it is now is on disk: ``q_rows_changed`` counts from here."""
        self._q_changed = np.zeros(self.n_nodes, dtype=bool)

    def save(self, path) -> None:
        """Write the estimator as a stamped Zarr v3 group, atomically (staging folder, then rename).

        ``path`` must be new, an empty folder, or an estimator saved there before (which is replaced);
        a STATE directory, a file, another artifact or a folder holding other files is refused in one line
        and left as it was (``io.estimator_store.check_save_target``).
        """
        from ..io.estimator_store import write_state

        write_state(self.state_dict(copy=False), path)  # written at once: no N x K copy

    @classmethod
    def load(cls, path, device: str | None = None) -> "Estimator":
        """Read a saved estimator, or the current state of a STATE directory (checked as every handoff
        command checks it: CURRENT, the step it names, the log)."""
        from ..io.estimator_store import is_state_dir, read_state
        from ..io.state_dir import StateDir

        state = StateDir.open(path).read_state() if is_state_dir(path) else read_state(path)
        return cls.from_state_dict(state, device=device, copy=False, verified=True)  # the arrays were just read

    def __repr__(self) -> str:
        c = self.settings
        mode = "cumulative" if c.window is None else f"window={c.window}"
        return (f"Estimator(N={self.n_nodes}, K={self.n_states}, beta={c.beta}, epsilon={c.epsilon}, "
                f"gamma={c.gamma}, {mode}, schedule={c.schedule}, device={self.device_}, step={self.step_})")


def _check_embeddings(embeddings, n: int) -> np.ndarray | None:
    """``embeddings`` as an n x d float32 array of finite values (None stays None)."""
    if embeddings is None:
        return None
    e = np.asarray(embeddings)
    if e.ndim != 2 or e.shape[0] != n or e.shape[1] < 1 or e.dtype.kind not in "fiu":
        raise DataError(f"embeddings must be a numeric {n} x d array (one row per prompt), got dtype {e.dtype}, "
                        f"shape {e.shape}")
    e = np.ascontiguousarray(e, dtype=np.float32)
    if not np.isfinite(e).all():
        i = int(np.flatnonzero(~np.isfinite(e).all(axis=1))[0])
        raise DataError(f"embeddings row {i} holds a NaN or infinite value")
    return e


def _check_covariates(covariates, reference_rate, n: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(``covariates`` as an n x c float64 array of finite values, ``reference_rate`` as n float64 in [0, 1] or
    NaN); a reference rate needs covariates (its encoded feature is one of them)."""
    if covariates is None:
        if reference_rate is not None:
            raise DataError("a reference rate comes with the covariates it is encoded in (core.covariates.encode)")
        return None, None
    x = np.asarray(covariates)
    if x.ndim != 2 or x.shape[0] != n or x.dtype.kind not in "fiu":
        raise DataError(f"covariates must be a numeric {n} x c array (one row per prompt), got dtype {x.dtype}, "
                        f"shape {x.shape}")
    x = np.array(x, dtype=np.float64)
    if not np.isfinite(x).all():
        i = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
        raise DataError(f"covariates row {i} holds a NaN or infinite value (encode missing values: "
                        "core.covariates.encode)")
    if reference_rate is None:
        return x, None
    r = np.asarray(reference_rate)
    if r.shape != (n,) or r.dtype.kind not in "fiu":
        raise DataError(f"reference_rate must be {n} numbers (NaN where a prompt has none), got dtype {r.dtype}, "
                        f"shape {r.shape}")
    r = np.array(r, dtype=np.float64)
    bad = ~np.isnan(r) & ~((r >= 0) & (r <= 1))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataError(f"reference_rate[{i}] = {r[i]} is not a pass rate in [0, 1] (NaN: none)")
    return x, r


def check_live(live, m: int, f: int | None = None) -> np.ndarray:
    """``live`` as an m x f float64 array of live features (one row per prompt of a call): finite numbers, or a
    whole row of NaN (none for that prompt); ``f``: the number of features fixed by the first step that gave them
    (None: any)."""
    x = np.asarray(live)
    if x.ndim == 1 and m and x.size == m and f in (None, 1):
        x = x[:, None]
    if x.ndim != 2 or x.shape[0] != m or x.shape[1] < 1 or x.dtype.kind not in "fiu":
        raise DataError(f"live features must be a numeric {m} x f array (one row per prompt), got dtype {x.dtype}, "
                        f"shape {x.shape}")
    if f is not None and x.shape[1] != f:
        raise DataError(f"live features have {x.shape[1]} columns; this estimator's live read-out was first given "
                        f"{f} (the number of live features is fixed by the first step that gives them)")
    x = np.array(x, dtype=np.float64)
    nan = np.isnan(x)
    bad = np.isinf(x).any(axis=1) | (nan.any(axis=1) & ~nan.all(axis=1))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataError(f"live features row {i} holds an infinite value or a NaN among numbers (a whole row of NaN: "
                        "no features for that prompt)")
    return x
