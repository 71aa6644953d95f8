"""A trajectory whose starting success rates are real ones (e.g. DeepScaleR's pass rates of Qwen2.5-Math-7B,
s successes out of n = 128), with the policy's improvement a stated model. Pure numpy: no files.

Model. Prompt i starts at the smoothed real rate p0_i = (s_i + 1/2) / (n_i + 1), so that never-solved
(s = 0) and always-solved (s = n) prompts have a finite logit. The policy's improvement is a per-prompt
drift of that logit, linear in the fraction of training done, x_t = (t - 1) / (T - 1) at step t = 1..T:

    logit p_it = logit p0_i + v_i x_t,        v_i = mu + tau z_g(i) + sigma e_i,

where v_i is prompt i's total drift over the run in logits, its speed set by a latent skill: z_g ~ N(0, 1)
is a random effect shared by the prompts of skill group g (groups given by the caller, e.g. a coarse
spectral clustering of the prompts' graph; without groups every prompt is its own group) and
e_i ~ N(0, 1) a per-prompt one. mu > 0 makes the policy improve on average; a group with z_g < -mu / tau
gets worse (a skill forgotten while training on others). Defaults: mu = 1.0, tau = 0.75, sigma = 0.5
(``DRIFT_MEAN``, ``DRIFT_SKILL_SD``, ``DRIFT_ITEM_SD``): the mean prompt moves by 1 logit over the run, the
skill groups' means spread with a standard deviation of 0.75 logits, prompts inside a group by 0.5.

Batches of B prompts are drawn epoch-wise without replacement (a fresh permutation each epoch, the last
partial batch dropped, as verl's ``drop_last`` does: ``simulate.epoch_batches``), so over E epochs each
prompt is visited at most E times (exactly E, except for the few dropped per epoch). The group of n
rollouts of prompt i at step t succeeds s_it ~ Binomial(n, p_it) times. Everything is drawn from one
``numpy.random.default_rng(seed)``: the random effects, then the batches, then the outcomes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import DataError, InvalidArgumentError
from .simulate import epoch_batches

DRIFT_MEAN = 1.0       # mu: the mean prompt's logit gain over the whole run
DRIFT_SKILL_SD = 0.75  # tau: the spread of the skill groups' gains
DRIFT_ITEM_SD = 0.5    # sigma: the spread of prompts' gains inside a group


@dataclass
class RateTrajectory:
    """A trajectory from real starting rates.

    Per prompt (node index = position in ``ids``): ids, p0 (smoothed starting rate), group (skill group,
    -1 without groups), speed v_i (total logit drift over the run). Log arrays, one entry per (step,
    prompt) row, grouped by step: step (1-based), id (node index), n, s, p_true (the success probability
    the outcome was drawn from).
    """

    ids: list[str]
    p0: np.ndarray
    group: np.ndarray
    speed: np.ndarray
    step: np.ndarray
    id: np.ndarray
    n: np.ndarray
    s: np.ndarray
    p_true: np.ndarray
    params: dict = field(default_factory=dict)

    def log_rows(self) -> list[dict]:
        """The log as rows {"step", "id" (the prompt's string id), "n", "s", "p_true"} (p_true to 6 places)."""
        return [{"step": int(t), "id": self.ids[i], "n": int(n), "s": int(s), "p_true": round(float(p), 6)}
                for t, i, n, s, p in zip(self.step, self.id, self.n, self.s, self.p_true)]


def smoothed_rate(n, s) -> np.ndarray:
    """(s + 1/2) / (n + 1): a real rate pulled just inside (0, 1), so its logit is finite."""
    n, s = np.asarray(n, dtype=np.float64), np.asarray(s, dtype=np.float64)
    return (s + 0.5) / (n + 1.0)


def _positive_int(v, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise InvalidArgumentError(f"{name} must be a positive integer, got {v!r}")
    return int(v)


def simulate_from_rates(ids, n, s, *, groups=None, epochs: int = 3, batch_size: int = 256, rollouts: int = 8,
                        seed: int = 0, drift_mean: float = DRIFT_MEAN, drift_skill_sd: float = DRIFT_SKILL_SD,
                        drift_item_sd: float = DRIFT_ITEM_SD) -> RateTrajectory:
    """A trajectory of ``epochs`` passes of ``batch_size``-prompt batches over prompts ``ids`` whose starting
    rates are s / n (the model in the module docstring). ``groups``: one integer skill group per prompt
    (None: no shared skill, every prompt drifts on its own)."""
    ids = [str(x) for x in ids]
    n = np.asarray(n)
    s = np.asarray(s)
    if not ids:
        raise DataError("no prompts to simulate from")
    if len(set(ids)) != len(ids):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise DataError(f"prompt id {dup!r} appears twice")
    if n.shape != (len(ids),) or s.shape != (len(ids),):
        raise DataError(f"n and s must hold one value per prompt ({len(ids)}), got {n.shape} and {s.shape}")
    if n.dtype.kind not in "iu" or s.dtype.kind not in "iu":
        raise DataError("n and s must be integers")
    if (n < 1).any() or (s < 0).any() or (s > n).any():
        j = int(np.flatnonzero((n < 1) | (s < 0) | (s > n))[0])
        raise DataError(f"prompt {ids[j]!r}: s = {s[j]} out of n = {n[j]} is not a success count")
    epochs = _positive_int(epochs, "epochs")
    batch_size = _positive_int(batch_size, "batch size")
    rollouts = _positive_int(rollouts, "rollouts")
    if batch_size > len(ids):
        raise InvalidArgumentError(f"batch size {batch_size} is larger than the {len(ids)} prompts")
    for name, v in (("drift mean", drift_mean), ("drift skill sd", drift_skill_sd), ("drift item sd", drift_item_sd)):
        if not np.isfinite(v):
            raise InvalidArgumentError(f"{name} must be finite, got {v!r}")
    if drift_skill_sd < 0 or drift_item_sd < 0:
        raise InvalidArgumentError("the drift's standard deviations must be >= 0")
    n_prompts = len(ids)
    if groups is None:
        group = np.full(n_prompts, -1, dtype=np.int64)
        codes, n_groups = np.arange(n_prompts), n_prompts
    else:
        group = np.asarray(groups)
        if group.shape != (n_prompts,) or group.dtype.kind not in "iu":
            raise DataError(f"groups must be one integer per prompt ({n_prompts}), got {group.dtype} {group.shape}")
        group = group.astype(np.int64)
        _, codes = np.unique(group, return_inverse=True)
        n_groups = int(codes.max()) + 1
    seed = int(seed)
    rng = np.random.default_rng(seed)
    z = rng.standard_normal(n_groups)
    e = rng.standard_normal(n_prompts)
    # without groups each prompt is its own group: its random effect then has variance tau^2 + sigma^2
    speed = drift_mean + drift_skill_sd * z[codes] + drift_item_sd * e
    steps = epochs * (n_prompts // batch_size)
    batches = epoch_batches(n_prompts, steps, batch_size, rng)
    step = np.repeat(np.arange(1, steps + 1, dtype=np.int64), batch_size)
    node = batches.reshape(-1).astype(np.int64)
    p0 = smoothed_rate(n, s)
    x = (step - 1) / max(steps - 1, 1)
    logit = np.log(p0[node] / (1.0 - p0[node])) + speed[node] * x
    p = 1.0 / (1.0 + np.exp(-logit))
    out_s = rng.binomial(rollouts, p).astype(np.int64)
    return RateTrajectory(ids=ids, p0=p0, group=group, speed=speed, step=step, id=node,
                          n=np.full(node.size, rollouts, dtype=np.int64), s=out_s, p_true=p,
                          params={"kind": "rates", "prompts": n_prompts, "steps": int(steps), "epochs": epochs,
                                  "batch_size": batch_size, "rollouts": rollouts, "seed": seed,
                                  "drift_mean": float(drift_mean), "drift_skill_sd": float(drift_skill_sd),
                                  "drift_item_sd": float(drift_item_sd),
                                  "skill_groups": None if groups is None else n_groups})
