"""Online mean-field variational inference for the graph-structured latent difficulty model.

Notation follows the paper (Sections 3.4-3.6, Appendices A, E, G):

- q      N x K assignment probabilities q_ik = q_i(z_i = k)
- a, b   K Beta parameters of q(theta_k) = Beta(a_k, b_k)
- A      smoothed prior, A_ik = 1 - eps if k = c_i else eps / (K - 1); only the labels c_i are stored
- W      symmetric mutual-kNN graph with zero diagonal; beta the Potts coupling strength
- O_t    prompts observed at step t with n_i rollouts and s_i successes

One training step (``run_step``) starts from the previous state (q_{t-1}, a_hist, b_hist), keeps
(a_hist, b_hist) frozen, and alternates

- Proposition 1  q_ik <- Softmax_k[log A_ik + beta sum_j W_ij q_jk + I(i in O_t) l_ik],
                 l_ik = s_i [psi(a_k) - psi(a_k + b_k)] + (n_i - s_i) [psi(b_k) - psi(a_k + b_k)]
- Proposition 2  a_k <- a_hist_k + sum_{i in O_t} q_ik s_i,  b_k <- b_hist_k + sum_{i in O_t} q_ik (n_i - s_i)

until the ELBO of Section 3.5 (Beta KL term included) rises by less than ``tol`` per prompt, or
``max_iters`` rounds. ``schedule="synchronous"`` applies Proposition 1 to all prompts at once (Jacobi,
torch, CPU or GPU); ``"sequential"`` sweeps i = 1..N using the newest q_j (Gauss-Seidel, Eq. (A.4)), the
exact coordinate ascent whose ELBO never decreases (Proposition 3).

Everything here is arrays in, arrays out: numpy and scipy at import time, torch inside the functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import scipy.sparse as sp
from scipy.special import betaln, digamma

from ..errors import DataError, InvalidArgumentError
from .beta import mean_variance

SCHEDULES = ("residual", "synchronous", "sequential")

# The paper leaves the smoothing eps of A open. eps = 0.1 puts 90% of a prompt's prior mass on its
# spectral cluster. For K = 320 that is a prior log-odds of log(0.9 * 319 / 0.1) = 8.0 nats for the
# cluster over any single other state: more than one group of 8 rollouts can move (at most
# 8 * |log(mu_k / mu_l)|, about 4.7 nats between states at 0.5 and 0.9), so one noisy group cannot flip
# a prompt's state, while the Potts field of a few agreeing neighbours (beta * W_ij ~ 1-2 nats each) or
# repeated evidence can. It also keeps A_ik > 0, which Proposition 3 needs.
DEFAULT_EPSILON = 0.1


# ----------------------------------------------------------------------------------------------------
# observations


@dataclass(frozen=True)
class Observations:
    """One step's outcomes: unique prompt indices (sorted), rollouts n_i >= 1 and successes s_i."""

    ids: np.ndarray  # int64
    n: np.ndarray  # float64
    s: np.ndarray  # float64

    @property
    def failures(self) -> np.ndarray:
        return self.n - self.s

    def __len__(self) -> int:
        return int(self.ids.size)


def _as_counts(x, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise DataError(f"{name} must be a 1-D array, got shape {arr.shape}")
    if arr.dtype == bool:
        arr = arr.astype(np.int64)
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)):
            raise DataError(f"{name} contains NaN or infinite values")
        if not np.all(arr == np.round(arr)):
            bad = int(np.flatnonzero(arr != np.round(arr))[0])
            raise DataError(f"{name}[{bad}] = {arr[bad]} is not an integer count")
    elif arr.dtype.kind not in "iu":
        raise DataError(f"{name} must hold integer counts, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def make_observations(ids, n, s, n_nodes: int) -> Observations:
    """Validate one step's rows and aggregate them per prompt.

    Rows with n = 0 carry no evidence and are dropped; a prompt listed twice in one step (rolled out
    in two groups) has its counts summed.
    """
    ids_a = _as_counts(ids, "ids")
    n_a = _as_counts(n, "n")
    s_a = _as_counts(s, "s")
    if not (ids_a.size == n_a.size == s_a.size):
        raise DataError(f"ids, n and s must have the same length, got {ids_a.size}, {n_a.size}, {s_a.size}")
    for name, arr in (("ids", ids_a), ("n", n_a), ("s", s_a)):
        if (arr < 0).any():
            i = int(np.flatnonzero(arr < 0)[0])
            raise DataError(f"{name}[{i}] = {arr[i]} is negative")
    if (ids_a >= n_nodes).any():
        i = int(np.flatnonzero(ids_a >= n_nodes)[0])
        raise DataError(f"ids[{i}] = {ids_a[i]} is out of range: the graph has {n_nodes} prompts")
    if (s_a > n_a).any():
        i = int(np.flatnonzero(s_a > n_a)[0])
        raise DataError(f"s[{i}] = {s_a[i]} is larger than n[{i}] = {n_a[i]}")
    keep = n_a > 0
    ids_a, n_a, s_a = ids_a[keep], n_a[keep], s_a[keep]
    uniq, inv = np.unique(ids_a, return_inverse=True)
    n_sum = np.bincount(inv, weights=n_a, minlength=uniq.size)
    s_sum = np.bincount(inv, weights=s_a, minlength=uniq.size)
    return Observations(uniq.astype(np.int64), n_sum.astype(np.float64), s_sum.astype(np.float64))


# ----------------------------------------------------------------------------------------------------
# the pieces of the model


def log_prior_weights(epsilon: float, n_states: int) -> tuple[float, float]:
    """(log A_ik for k = c_i, log A_ik for k != c_i). With K = 1, A = 1 and eps plays no role."""
    if n_states == 1:
        return 0.0, 0.0
    return math.log1p(-epsilon), math.log(epsilon / (n_states - 1))


def smoothed_prior(labels: np.ndarray, n_states: int, epsilon: float) -> np.ndarray:
    """A as a dense N x K array (for tests and small problems; the kernels never materialize it)."""
    on, off = log_prior_weights(epsilon, n_states)
    a = np.full((labels.size, n_states), math.exp(off))
    a[np.arange(labels.size), labels] = math.exp(on)
    return a


def fill_prior(q, labels: np.ndarray, epsilon: float) -> None:
    """Write A into the N x K torch tensor ``q`` in place (no N x K intermediate)."""
    import torch

    on, off = log_prior_weights(epsilon, q.shape[1])
    q.fill_(math.exp(off))
    if q.shape[0]:
        q[torch.arange(q.shape[0], device=q.device), torch.as_tensor(labels, device=q.device)] = math.exp(on)


def is_prior(q, labels: np.ndarray, epsilon: float, block: int = 16384) -> bool:
    """Whether the torch tensor ``q`` holds exactly A (as ``fill_prior`` writes it), checked in row blocks."""
    import torch

    for start in range(0, q.shape[0], block):
        blk = q[start:start + block]
        want = torch.empty_like(blk)
        fill_prior(want, labels[start:start + block], epsilon)
        if not torch.equal(blk, want):
            return False
    return True


def expected_log_theta(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(E[log theta_k], E[log(1 - theta_k)]) under Beta(a_k, b_k)."""
    ab = digamma(a + b)
    return digamma(a) - ab, digamma(b) - ab


def beta_kl(a, b, a0, b0) -> np.ndarray:
    """KL[Beta(a, b) || Beta(a0, b0)], elementwise."""
    return (betaln(a0, b0) - betaln(a, b) + (a - a0) * digamma(a) + (b - b0) * digamma(b)
            + (a0 - a + b0 - b) * digamma(a + b))


def beta_update(q_obs, obs: Observations, a_hist: np.ndarray, b_hist: np.ndarray):
    """Proposition 2: a = a_hist + sum_i q_ik s_i, b = b_hist + sum_i q_ik (n_i - s_i).

    ``q_obs`` holds the rows of q for the observed prompts (numpy or torch). Returns float64 numpy.
    """
    ds, df = responsibility_counts(q_obs, obs)
    return a_hist + ds, b_hist + df


def responsibility_counts(q_obs, obs: Observations) -> tuple[np.ndarray, np.ndarray]:
    """sum_{i in O} q_ik s_i and sum_{i in O} q_ik (n_i - s_i): one step's evidence per state."""
    k = q_obs.shape[1]
    if len(obs) == 0:
        return np.zeros(k), np.zeros(k)
    if isinstance(q_obs, np.ndarray):
        q64 = q_obs.astype(np.float64, copy=False)
        return q64.T @ obs.s, q64.T @ obs.failures
    import torch

    sf = torch.as_tensor(np.stack([obs.s, obs.failures], axis=1), dtype=torch.float64, device=q_obs.device)
    out = (q_obs.to(torch.float64).T @ sf).cpu().numpy()
    return out[:, 0].copy(), out[:, 1].copy()


# ----------------------------------------------------------------------------------------------------
# the step


@dataclass
class StepResult:
    """What one step of inference produced."""

    q: object  # torch tensor, N x K, on the device it ran on
    a: np.ndarray
    b: np.ndarray
    elbo: list[float]
    iterations: int
    converged: bool
    evidence: tuple[np.ndarray, np.ndarray]  # (sum q s, sum q f) over O_t at the final q
    rows_updated: int = 0  # applications of Proposition 1 to a single row (N per full sweep)
    # in_place=True (run_step_residual): q is the q0 passed in, updated in place, and restore() puts
    # q0 back as it was (``undo``) if the caller must not commit
    restore: Callable[[], None] | None = None
    # which rows of q the step wrote (a boolean mask of N; the in-place residual step's journal), None: any row
    rows_touched: np.ndarray | None = None

    def undo(self) -> None:
        """Put the rows an in-place step changed back as they were (no-op for a fresh q)."""
        if self.restore is not None:
            self.restore()


@dataclass
class ModelSpec:
    """Static parts of the model, shared by every step: W, labels c_i, K, beta, eps."""

    graph: sp.csr_matrix  # float64, symmetric, zero diagonal
    labels: np.ndarray  # int64
    n_states: int
    beta: float
    epsilon: float
    _derived: dict = field(default_factory=dict, repr=False)

    @property
    def n_nodes(self) -> int:
        return int(self.labels.size)

    def degree(self) -> np.ndarray:
        """W's row sums, float64 (summed once)."""
        if "degree" not in self._derived:
            from .graph import row_sums

            degree = row_sums(self.graph)
            degree.flags.writeable = False
            self._derived["degree"] = degree
        return self._derived["degree"]

    def graph_single(self) -> sp.csr_matrix:
        """W with float32 values, sharing W's index arrays (built once): label propagation's float32 stage."""
        if "single" not in self._derived:
            from .graph import single_precision

            single = single_precision(self.graph)
            single.data.flags.writeable = False
            self._derived["single"] = single
        return self._derived["single"]

    def torch_graph(self, device, dtype):
        """W as a torch sparse CSR tensor on ``device`` (built once per device and dtype)."""
        key = (str(device), dtype)
        if key not in self._derived:
            self._derived[key] = torch_csr(self.graph, dtype, device)
        return self._derived[key]


def torch_csr(m: sp.csr_matrix, dtype, device):
    """A scipy CSR matrix as a torch sparse CSR tensor (invariants already hold: W was validated)."""
    import warnings

    import torch

    with warnings.catch_warnings():  # "sparse CSR support is in beta": nothing a user can act on
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(torch.as_tensor(m.indptr, dtype=torch.int64),
                                       torch.as_tensor(m.indices, dtype=torch.int64),
                                       torch.as_tensor(m.data, dtype=dtype), size=m.shape,
                                       check_invariants=False).to(device)


def elbo(spec: ModelSpec, q, potts_field, a, b, a_hist, b_hist, obs: Observations, obs_idx=None) -> float:
    """The ELBO of Section 3.5 (terms independent of q dropped), in float64.

    ``potts_field`` is W q (N x K) for the same q, so the Potts term is (beta/2) sum_ik q_ik (Wq)_ik.
    """
    import torch

    f64 = torch.float64
    on, off = log_prior_weights(spec.epsilon, spec.n_states)
    potts = 0.5 * spec.beta * float((q * potts_field).sum(dtype=f64))
    labels_t = torch.as_tensor(spec.labels, device=q.device)
    q_on = q.gather(1, labels_t[:, None])
    # sum_k q_ik log A_ik = off * sum_k q_ik + (on - off) q_{i c_i}
    prior = off * float(q.sum(dtype=f64)) + (on - off) * float(q_on.sum(dtype=f64))
    entropy = -float(torch.special.xlogy(q, q).sum(dtype=f64))
    lik = 0.0
    if len(obs):
        elog, elog1m = expected_log_theta(a, b)
        if obs_idx is None:
            obs_idx = torch.as_tensor(obs.ids, device=q.device)
        q_obs = q.index_select(0, obs_idx).to(f64)
        lik = float((q_obs.T @ torch.as_tensor(obs.s, dtype=f64, device=q.device)).cpu().numpy() @ elog
                    + (q_obs.T @ torch.as_tensor(obs.failures, dtype=f64, device=q.device)).cpu().numpy()
                    @ elog1m)
    kl = float(beta_kl(a, b, a_hist, b_hist).sum())
    return potts + prior + entropy + lik - kl


def assignment_logits(spec: ModelSpec, potts_field, a, b, obs, obs_idx):
    """h_ik = log A_ik + beta (W q)_ik + I(i in O) l_ik (the argument of Proposition 1's softmax)."""
    import torch

    q_dtype = potts_field.dtype
    dev = potts_field.device
    on, off = log_prior_weights(spec.epsilon, spec.n_states)
    h = potts_field * spec.beta
    h += off
    labels_t = torch.as_tensor(spec.labels, device=dev)
    h.scatter_add_(1, labels_t[:, None], torch.full((spec.n_nodes, 1), on - off, dtype=q_dtype, device=dev))
    if len(obs):
        elog, elog1m = expected_log_theta(a, b)
        ell = (np.outer(obs.s, elog) + np.outer(obs.failures, elog1m))
        h.index_add_(0, obs_idx, torch.as_tensor(ell, dtype=q_dtype, device=dev))
    return h


def _sequential_sweep(spec: ModelSpec, q_np: np.ndarray, a, b, obs: Observations) -> None:
    """One Gauss-Seidel sweep of Proposition 1 over i = 0..N-1, in place (Eq. (A.4))."""
    on, off = log_prior_weights(spec.epsilon, spec.n_states)
    elog, elog1m = expected_log_theta(a, b)
    ell = np.zeros((spec.n_nodes, 0))
    obs_row = {}
    if len(obs):
        ell = np.outer(obs.s, elog) + np.outer(obs.failures, elog1m)
        obs_row = {int(i): r for r, i in enumerate(obs.ids)}
    indptr, indices, data = spec.graph.indptr, spec.graph.indices, spec.graph.data
    beta = spec.beta
    labels = spec.labels
    for i in range(spec.n_nodes):
        lo, hi = indptr[i], indptr[i + 1]
        if hi > lo:
            h = beta * (data[lo:hi] @ q_np[indices[lo:hi]])
            h += off
        else:
            h = np.full(spec.n_states, off)
        h[labels[i]] += on - off
        r = obs_row.get(i)
        if r is not None:
            h += ell[r]
        h -= h.max()
        np.exp(h, out=h)
        h /= h.sum()
        q_np[i] = h


def run_step(spec: ModelSpec, q0, a_hist: np.ndarray, b_hist: np.ndarray, obs: Observations, *,
             schedule: str = "synchronous", max_iters: int = 50, tol: float = 1e-6) -> StepResult:
    """Inference for one training step, warm-started from q0 with (a_hist, b_hist) frozen.

    ``q0`` is a torch tensor (N x K) on the device to run on; it is not modified. The ELBO is evaluated
    for the starting state and after every round (Proposition 1, then Proposition 2); the loop stops
    when a round raises it by less than ``tol * N`` or after ``max_iters`` rounds.
    """
    import torch

    if schedule not in ("synchronous", "sequential"):
        raise InvalidArgumentError(f"run_step runs the synchronous or sequential schedule, not {schedule!r}")
    q = q0.clone()
    dev, dtype = q.device, q.dtype
    if schedule == "sequential" and dev.type != "cpu":
        raise InvalidArgumentError("the sequential schedule runs on the CPU only")
    w_t = spec.torch_graph(dev, dtype)
    obs_idx = torch.as_tensor(obs.ids, device=dev)
    a, b = a_hist.astype(np.float64).copy(), b_hist.astype(np.float64).copy()
    threshold = tol * spec.n_nodes
    elbos: list[float] = []
    converged = False
    rounds = 0
    while True:
        field_ = torch.sparse.mm(w_t, q)
        elbos.append(elbo(spec, q, field_, a, b, a_hist, b_hist, obs, obs_idx))
        if rounds > 0 and elbos[-1] - elbos[-2] < threshold:
            converged = True
            break
        if rounds == max_iters:
            break
        if schedule == "synchronous":
            q = torch.softmax(assignment_logits(spec, field_, a, b, obs, obs_idx), dim=1)
        else:
            _sequential_sweep(spec, q.numpy(), a, b, obs)
        del field_
        a, b = beta_update(q.index_select(0, obs_idx), obs, a_hist, b_hist)
        rounds += 1
    evidence = (a - a_hist, b - b_hist)
    return StepResult(q=q, a=a, b=b, elbo=elbos, iterations=rounds, converged=converged, evidence=evidence,
                      rows_updated=rounds * spec.n_nodes)


def _row_logits(spec: ModelSpec, rows: np.ndarray, q, a, b, obs: Observations, obs_pos: np.ndarray):
    """h_ik of Proposition 1 for the given rows only: cost proportional to their edges, not to N."""
    import torch

    dev, dtype = q.device, q.dtype
    g = spec.graph
    sub = g[rows]  # CSR rows of W; column indices still address all N prompts
    w_rows = torch_csr(sub, dtype, dev)
    on, off = log_prior_weights(spec.epsilon, spec.n_states)
    h = torch.sparse.mm(w_rows, q) * spec.beta if sub.nnz else torch.zeros(rows.size, q.shape[1], dtype=dtype,
                                                                             device=dev)
    h += off
    lab = torch.as_tensor(spec.labels[rows], device=dev)
    h.scatter_add_(1, lab[:, None], torch.full((rows.size, 1), on - off, dtype=dtype, device=dev))
    where = obs_pos[rows]  # position of each row in obs, -1 if unobserved
    hit = np.flatnonzero(where >= 0)
    if hit.size:
        elog, elog1m = expected_log_theta(a, b)
        r = where[hit]
        ell = np.outer(obs.s[r], elog) + np.outer(obs.failures[r], elog1m)
        h[torch.as_tensor(hit, device=dev)] += torch.as_tensor(ell, dtype=dtype, device=dev)
    return h


def relax_unobserved(spec: ModelSpec, q, rows: np.ndarray, *, max_rounds: int = 50, tol: float = 1e-4) -> int:
    """Apply Proposition 1 to ``rows`` only, in place, until no row moves by more than ``tol``: the mean-field
    update of prompts with no outcomes (their h_ik has no likelihood term, so a, b do not enter), with every
    other row of q held fixed. ``Estimator.extend`` starts the prompts it adds here rather than at A.
    Returns the rounds run."""
    import torch

    rows = np.asarray(rows, dtype=np.int64)
    if rows.size == 0:
        return 0
    none = np.full(spec.n_nodes, -1, dtype=np.int64)
    empty = make_observations(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), spec.n_nodes)
    rows_t = torch.as_tensor(rows, device=q.device)
    for r in range(1, max_rounds + 1):
        new = torch.softmax(_row_logits(spec, rows, q, None, None, empty, none), dim=1)
        moved = float((new - q.index_select(0, rows_t)).abs().max())
        q.index_copy_(0, rows_t, new)
        if moved <= tol:
            return r
    return max_rounds


# rows per block of a residual round: bounds its temporaries at block x K (4096 x 320 float32 = 5 MB)
RESIDUAL_BLOCK_ROWS = 4096


def run_step_residual(spec: ModelSpec, q0, a_hist: np.ndarray, b_hist: np.ndarray, obs: Observations,
                      dirty: np.ndarray | None, *, max_iters: int = 50, tol: float = 1e-4,
                      in_place: bool = False, block_rows: int = RESIDUAL_BLOCK_ROWS,
                      q0_is_prior: bool = False) -> StepResult:
    """The same fixed point as the synchronous schedule, reached by revisiting only what moved.

    After a warm start from a converged state, the inputs of Proposition 1 change only for the prompts
    observed now (their likelihood term l_ik appears and follows a, b) and those observed last step
    (theirs disappears into a_hist). ``dirty`` lists those rows; None means "q0 is not a fixed point"
    (the first step after init), which starts with every row. Each round applies Proposition 1 to the
    active rows, then Proposition 2; a row whose q moved by more than ``tol`` (max over k) activates its
    graph neighbours for the next round, and a change of a, b that moves some l_ik by more than ``tol``
    reactivates the observed rows, as push-style PageRank does. It stops when nothing is active.

    The ELBO is not tracked (it would cost a full sweep per round); ``elbo`` holds no values.

    A round over more than ``block_rows`` active rows (the first step after init: all N) updates them
    block by block, each block seeing the blocks before it (Gauss-Seidel across blocks, Jacobi
    within): the temporaries are block x K instead of N x K, and the fixed point is the same.

    ``in_place``: update q0 itself instead of a copy, journalling each row's values before its first
    change (O(rows touched x K) memory instead of N x K); the result's ``undo()`` restores q0, and
    does so by itself if this function raises. A start from every row (``dirty`` None) would journal
    all of q, so it works on a copy, unless ``q0_is_prior`` says q0 is A (the first step after init):
    then it works in place and undoing rebuilds A from the labels.
    """
    import torch

    if not in_place or (dirty is None and not q0_is_prior):
        return _run_residual(spec, q0.clone(), a_hist, b_hist, obs, dirty, max_iters, tol, None, block_rows)
    if dirty is None:  # q0 is A: rebuilt from the labels, no journal
        journal = None

        def restore():
            fill_prior(q0, spec.labels, spec.epsilon)
    else:
        journal = {"rows": [], "old": [], "seen": np.zeros(spec.n_nodes, dtype=bool)}

        def restore():
            if journal["rows"]:
                rows = np.concatenate(journal["rows"])
                q0.index_copy_(0, torch.as_tensor(rows, device=q0.device), torch.cat(journal["old"]))
    try:
        res = _run_residual(spec, q0, a_hist, b_hist, obs, dirty, max_iters, tol, journal, block_rows)
    except BaseException:
        restore()
        raise
    res.restore = restore
    if journal is not None:
        res.rows_touched = journal["seen"]
    return res


def _run_residual(spec: ModelSpec, q, a_hist, b_hist, obs: Observations, dirty, max_iters: int, tol: float,
                  journal: dict | None, block_rows: int) -> StepResult:
    import torch

    dev = q.device
    n = spec.n_nodes
    obs_pos = np.full(n, -1, dtype=np.int64)
    obs_pos[obs.ids] = np.arange(len(obs))
    obs_idx = torch.as_tensor(obs.ids, device=dev)
    a, b = a_hist.astype(np.float64).copy(), b_hist.astype(np.float64).copy()
    active = np.arange(n) if dirty is None else np.union1d(np.asarray(dirty, dtype=np.int64), obs.ids)
    converged, rounds, touched = False, 0, 0
    g = spec.graph
    while rounds < max_iters:
        if active.size == 0:
            converged = True
            break
        moved_parts = []
        for start in range(0, active.size, block_rows):
            blk = active[start:start + block_rows]
            rows_t = torch.as_tensor(blk, device=dev)
            new = torch.softmax(_row_logits(spec, blk, q, a, b, obs, obs_pos), dim=1)
            before = q.index_select(0, rows_t)
            moved_by = (new - before).abs().amax(dim=1).cpu().numpy()
            if journal is not None:  # keep each row's pre-step values, once
                first = ~journal["seen"][blk]
                if first.any():
                    journal["seen"][blk[first]] = True
                    journal["rows"].append(blk[first])
                    journal["old"].append(before[torch.as_tensor(np.flatnonzero(first), device=dev)])
            del before
            q.index_copy_(0, rows_t, new)
            del new
            moved_parts.append(blk[moved_by > tol])
        touched += active.size
        a_new, b_new = beta_update(q.index_select(0, obs_idx), obs, a_hist, b_hist)
        moved = np.concatenate(moved_parts)
        nxt = np.unique(g[moved].indices) if moved.size else np.zeros(0, dtype=np.int64)
        if len(obs):
            e_old = np.stack(expected_log_theta(a, b))
            e_new = np.stack(expected_log_theta(a_new, b_new))
            max_n = float(obs.n.max())
            if max_n * np.abs(e_new - e_old).max() > tol:
                nxt = np.union1d(nxt, obs.ids)
        a, b = a_new, b_new
        active = nxt.astype(np.int64)
        rounds += 1
    else:
        converged = active.size == 0
    return StepResult(q=q, a=a, b=b, elbo=[], iterations=rounds, converged=converged,
                      evidence=(a - a_hist, b - b_hist), rows_updated=touched)


# ----------------------------------------------------------------------------------------------------
# prediction (Section 3.6, Appendix E)


def model_prediction(q_rows: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(p_model_i = sum_k q_ik mu_k, u_i = sum_k q_ik [v_k + (mu_k - p_model_i)^2]) for the given rows,
    mu_k and v_k the mean and variance of state k's Beta(a_k, b_k) (Section 3.6, Appendix E)."""
    mu, v = mean_variance(a, b)  # v_k: the Beta posterior variance (Appendix E)
    q64 = np.asarray(q_rows, dtype=np.float64)
    p_model = q64 @ mu
    u = q64 @ (v + mu * mu) - p_model * p_model
    return np.clip(p_model, 0.0, 1.0), np.maximum(u, 0.0)


def mix_with_history(p_model: np.ndarray, successes: np.ndarray, rollouts: np.ndarray,
                     gamma: float) -> np.ndarray:
    """p_i = p_model_i if prompt i was never rolled out, else gamma p_model_i + (1 - gamma) r_bar_i."""
    seen = rollouts > 0
    r_bar = np.divide(successes, rollouts, out=np.zeros_like(p_model), where=seen)
    return np.where(seen, gamma * p_model + (1.0 - gamma) * r_bar, p_model)
