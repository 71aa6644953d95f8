"""The scores asked of the closed loop, from parsed runs (pure functions, no file I/O).

* ``curve`` - a run's held-out learning curve against cumulative rollouts, by default its isotonic fit
  (non-decreasing): every score below reads the fitted curve, so one noisy evaluation moves none alone;
* ``rollouts_to`` - cumulative rollouts at which the curve first reaches a level (None: never);
* ``saving_vs_ds`` - per seed, DS's rollouts to its own final accuracy / the scheduler's rollouts to it;
* ``saving_along_ds`` - the same at DS's accuracy after 1/4, 1/2, 3/4 of its steps (the final one is censored
  for a scheduler trained for DS's steps: it cannot pass DS's last value after its own last step);
* ``equal_steps_vs_ds`` - the DS family at equal steps: DS's rollouts / the scheduler's, final accuracy difference;
* ``oracle_share`` - per rule and estimator, the share of the oracle's gain it recovers,
  (estimator - baseline) / (oracle - baseline), in accuracy at equal rollouts and in rollouts saved to the
  baseline's final accuracy (baseline: the rule without an estimator - uniform, or plain DS for the pre-filter);
* ``bootstrap`` - (with >= 2 seeds) a percentile interval of a statistic of paired per-seed values, resampling seeds, and the
  minimum detectable difference ((z_0.975 + z_0.8) x the bootstrap standard error: 80% power at 5%);
* ``cell_shares`` - each scheduler's share of rollouts per (skill, level) cell, to set beside the oracle's;
* ``zero_variance_share`` - the share of all-correct and all-wrong groups per window of steps;
* ``live_targets`` - the live arms' targets: gd-live-ds's rollouts to DS's final accuracy against DS's and its
  peers', graphdiff's best share of the oracle's gain against the covariates-only peer's, the estimator's cost.

Runs are ``{scheduler: {seed: metrics rows}}`` as ``report.load_runs`` gives them.
"""

from __future__ import annotations

import re

import numpy as np

from graphdiff_cli.errors import InvalidArgumentError

Z_MDD = 1.959964 + 0.841621  # two-sided 5% test, 80% power
MIN_SEEDS = 6  # the power requirement: a regime check is decided on at least this many paired seeds


def _evaluations(rows, key: str) -> list[dict]:
    """The rows that hold an evaluation of ``key`` (not None, not NaN)."""
    return [r for r in rows if r.get(key) is not None and np.isfinite(float(r[key]))]


def curve(rows, key: str = "heldout_acc", smooth: bool = True):
    """(cumulative rollouts, ``key``) at each held-out evaluation (rows without the key, or with None or NaN
    in it, are not evaluations). ``smooth``: the values are the isotonic (non-decreasing) least-squares fit
    to the evaluations (``scipy.optimize.isotonic_regression``), the estimate of a learning curve in which an
    evaluation that lands high by noise early on is pooled with the later, lower ones, so it no longer counts
    as "reached". The fit does not pull a high *last* evaluation down (pooling only merges points that fall
    below an earlier one), so a final value is the last evaluation, or the mean of the trailing evaluations
    that fall below it. The same fit for every scheduler; ``smooth=False`` gives the raw evaluations."""
    ev = _evaluations(rows, key)
    x = np.array([r["cum_rollouts"] for r in ev], float)
    y = np.array([r[key] for r in ev], float)
    if smooth and y.size > 1:
        from scipy.optimize import isotonic_regression

        y = np.asarray(isotonic_regression(y, increasing=True).x, dtype=float)
    return x, y


def start(rows, key: str = "heldout_acc") -> float | None:
    """The raw evaluation at step 0 (the warm start), which no fit moves (None: not evaluated)."""
    ev = [r for r in _evaluations(rows, key) if r.get("step") == 0]
    return float(ev[0][key]) if ev else None


def rollouts_to(rows, level: float, key: str = "heldout_acc", smooth: bool = True) -> float | None:
    """Cumulative rollouts at which ``key`` first reaches ``level`` after step 0 (None: never). Smoothed:
    linear interpolation between the fitted curve's last point below ``level`` and its first at or above it;
    raw: the first evaluation at or above it."""
    ro, acc = curve(rows, key, smooth)
    hit = np.flatnonzero((acc >= level - 1e-12) & (ro > 0))
    if not hit.size:
        return None
    j = int(hit[0])
    if not smooth or j == 0 or acc[j - 1] >= level - 1e-12:
        return float(ro[j])
    f = min(1.0, max(0.0, (level - acc[j - 1]) / (acc[j] - acc[j - 1])))
    return float(ro[j - 1] + f * (ro[j] - ro[j - 1]))


def acc_at(rows, budget: float, key: str = "heldout_acc", smooth: bool = True) -> float:
    ro, acc = curve(rows, key, smooth)
    return float(np.interp(budget, ro, acc))


def final(rows, key: str = "heldout_acc", smooth: bool = True) -> float:
    return float(curve(rows, key, smooth)[1][-1])


def saving_vs_ds(runs, name: str, key: str = "heldout_acc", ds: str = "ds", smooth: bool = True) -> dict[int, float | None]:
    """Per seed: DS's rollouts to its final ``key`` / ``name``'s rollouts to it (> 1: fewer rollouts than DS;
    0.0 where ``name`` never reached it, so that a seed that never gets there counts as no saving)."""
    return {seed: _saving(runs[ds][seed], runs[name][seed], final(runs[ds][seed], key, smooth), key, smooth)
            for seed in sorted(set(runs.get(ds, {})) & set(runs.get(name, {})))}


def _saving(ds_rows, rows, level, key: str, smooth: bool = True) -> float | None:
    """DS's rollouts to ``level`` / the run's (0.0: the run never reaches it; None: the level is not above DS's
    raw start, so reaching it means nothing, or DS never reached it)."""
    s0 = start(ds_rows, key)
    if level is None or s0 is None or level <= s0 + 1e-12:
        return None
    own, r = rollouts_to(ds_rows, level, key, smooth), rollouts_to(rows, level, key, smooth)
    return None if not own else (0.0 if r is None else own / r)


def ds_checkpoint_levels(rows, fractions, key: str = "heldout_acc") -> list[tuple[float, float | None]]:
    """(fraction, DS's fitted ``key`` at the evaluation nearest that fraction of its steps) for each fraction."""
    steps = np.array([r["step"] for r in _evaluations(rows, key)], float)
    _, acc = curve(rows, key)
    out = []
    if not steps.size:
        return [(float(f), None) for f in fractions]
    for f in fractions:
        j = int(np.argmin(np.abs(steps - f * steps[-1])))
        out.append((float(f), float(acc[j]) if steps[j] > 0 else None))
    return out


def saving_along_ds(runs, name: str, fractions=(0.25, 0.5, 0.75, 1.0), key: str = "heldout_acc",
                    ds: str = "ds") -> dict[float, dict[int, float | None]]:
    """Per fraction f and seed: DS's rollouts to its own (fitted) accuracy after f of its steps / ``name``'s
    rollouts to it (0.0: never reached). f = 1 is ``saving_vs_ds``. A scheduler trained for as many steps as
    DS cannot pass DS's final accuracy after its own last step, so at f = 1 a pre-filter that merely ties
    DS counts 0 in about half the seeds (a censored reading); the earlier fractions are not censored that
    way as long as the scheduler keeps pace with DS."""
    out: dict[float, dict[int, float | None]] = {float(f): {} for f in fractions}
    for seed in sorted(set(runs.get(ds, {})) & set(runs.get(name, {}))):
        d, x = runs[ds][seed], runs[name][seed]
        for f, level in ds_checkpoint_levels(d, fractions, key):
            out[f][seed] = _saving(d, x, level, key)
    return out


def equal_steps_vs_ds(runs, name: str, key: str = "heldout_acc", ds: str = "ds") -> list[dict]:
    """Per seed, the DS family's comparison at equal training steps (how GRESO and MoPPS report it: both
    trained for the same steps): DS's total rollouts / ``name``'s, ``name``'s fitted final ``key`` minus DS's,
    and whether ``name``'s curve reached DS's fitted final value. A run of the uncensored regime, longer than
    DS's, is read at DS's last step (its rows up to it are those of a run of DS's length), which it must have
    evaluated; a run shorter than DS's cannot be compared at equal steps."""
    rows = []
    for seed in sorted(set(runs.get(ds, {})) & set(runs.get(name, {}))):
        d, x = runs[ds][seed], runs[name][seed]
        last = d[-1]["step"]
        if x[-1]["step"] > last:
            x = [r for r in x if r["step"] <= last]
            if not any(r["step"] == last and key in r for r in x):
                raise InvalidArgumentError(f"{name} seed {seed} was not evaluated at step {last}, {ds}'s last: "
                                           "it cannot be read at equal steps (eval_every must divide DS's steps)")
        if last != x[-1]["step"]:
            raise InvalidArgumentError(f"{name} seed {seed} ran {x[-1]['step']} steps and {ds} {last}: "
                                       "an equal-steps comparison needs runs of the same length")
        level = final(d, key)
        rows.append({"seed": seed, "rollout_ratio": d[-1]["cum_rollouts"] / max(1, x[-1]["cum_rollouts"]),
                     "final_difference": final(x, key) - level, "reached": rollouts_to(x, level, key) is not None})
    return rows


def oracle_share(runs, baseline: str, estimator: str, oracle: str, key: str = "heldout_acc") -> dict:
    """Per seed present in all three: accuracy at the common rollouts (the smallest final cumulative rollouts
    of the three) and rollouts to the baseline's final accuracy, for baseline, estimator and oracle."""
    rows = []
    for seed in sorted(set(runs.get(baseline, {})) & set(runs.get(estimator, {})) & set(runs.get(oracle, {}))):
        b, e, o = runs[baseline][seed], runs[estimator][seed], runs[oracle][seed]
        budget = min(curve(x, key)[0][-1] for x in (b, e, o))
        level = final(b, key)
        reach = {t: rollouts_to(x, level, key) for t, x in (("baseline", b), ("estimator", e), ("oracle", o))}
        rows.append({"seed": seed, "budget": budget, "level": level,
                     **{f"acc_{t}": acc_at(x, budget, key) for t, x in (("baseline", b), ("estimator", e),
                                                                        ("oracle", o))},
                     **{f"rollouts_{t}": v for t, v in reach.items()}})
    return {"baseline": baseline, "estimator": estimator, "oracle": oracle, "seeds": rows}


def share_stats(rows: list[dict], field: str, rng_seed: int = 0, n_boot: int = 2000) -> dict | None:
    """The share of the oracle's gain, ratio of the seed means, with a bootstrap interval over seeds.
    ``field`` "acc": (est - base) / (oracle - base) of accuracy at equal rollouts; "rollouts": (base -
    est) / (base - oracle) of rollouts to the baseline's final accuracy (a run that never reaches it is
    counted at its last rollouts, a lower bound of its saving's shortfall)."""
    if not rows:
        return None
    if field == "acc":
        est = np.array([r["acc_estimator"] - r["acc_baseline"] for r in rows])
        orc = np.array([r["acc_oracle"] - r["acc_baseline"] for r in rows])
    else:
        def ro(r, t):
            v = r[f"rollouts_{t}"]
            return r["budget"] if v is None else v
        est = np.array([ro(r, "baseline") - ro(r, "estimator") for r in rows])
        orc = np.array([ro(r, "baseline") - ro(r, "oracle") for r in rows])
    res = bootstrap(np.stack([est, orc], 1), lambda m: m[:, 0].mean() / m[:, 1].mean()
                    if abs(m[:, 1].mean()) > 1e-12 else np.nan, rng_seed=rng_seed, n_boot=n_boot)
    res["oracle_gain"] = float(orc.mean())
    res["estimator_gain"] = float(est.mean())
    return res


def bootstrap(values, stat=None, rng_seed: int = 0, n_boot: int = 2000) -> dict:
    """Statistic (default: mean) of per-seed ``values`` (rows = seeds) with a 95% percentile interval from
    resampling seeds, its bootstrap standard error and the minimum detectable difference (Z_MDD x se)."""
    v = np.asarray([x for x in values if x is not None] if np.ndim(values) == 1 else values, dtype=float)
    stat = stat or (lambda m: float(np.mean(m)))
    if v.shape[0] == 0:
        return {"value": None, "lo": None, "hi": None, "se": None, "mdd": None, "seeds": 0}
    rng = np.random.default_rng(rng_seed)
    idx = rng.integers(0, v.shape[0], size=(n_boot, v.shape[0]))
    boots = np.array([stat(v[i]) for i in idx], dtype=float)
    boots = boots[np.isfinite(boots)]
    value = stat(v)
    if not np.isfinite(value) or v.shape[0] < 2:  # one seed: a value, no interval
        if np.isfinite(value):
            return {"value": float(value), "lo": None, "hi": None, "se": None, "mdd": None, "seeds": int(v.shape[0])}
        return {"value": None, "lo": None, "hi": None, "se": None, "mdd": None, "seeds": int(v.shape[0])}
    if boots.size < n_boot // 2:
        return {"value": float(value), "lo": None, "hi": None, "se": None, "mdd": None, "seeds": int(v.shape[0])}
    se = float(boots.std(ddof=1))
    return {"value": float(value), "lo": float(np.percentile(boots, 2.5)), "hi": float(np.percentile(boots, 97.5)),
            "se": se, "mdd": Z_MDD * se, "seeds": int(v.shape[0])}


_CELL = re.compile(r"^[a-z]+-([a-z]+\d)-\d+$")


def cell_of(pid: str) -> str:
    m = _CELL.match(str(pid))
    return m.group(1) if m else "?"


def cell_shares(outcomes: list[dict]) -> dict[str, float]:
    """Share of a run's rollouts per (skill, level) cell from its ``outcomes.jsonl`` rows (ids, n)."""
    tot: dict[str, float] = {}
    for o in outcomes:
        for pid, n in zip(o["ids"], o["n"]):
            c = cell_of(pid)
            tot[c] = tot.get(c, 0.0) + n
    s = sum(tot.values()) or 1.0
    return {k: v / s for k, v in sorted(tot.items())}


def zero_variance_share(rows, window: int = 10) -> list[dict]:
    """Per window of ``window`` steps: share of the step's groups that were all-correct / all-wrong."""
    steps = [r for r in rows if r["step"] > 0]
    out = []
    for start in range(0, len(steps), window):
        w = steps[start:start + window]
        groups = sum(r["prompts"] for r in w) or 1
        out.append({"steps": f"{w[0]['step']}-{w[-1]['step']}",
                    "all_correct": sum(r["all_correct"] for r in w) / groups,
                    "all_wrong": sum(r["all_wrong"] for r in w) / groups})
    return out


def _never_inf(x: float | None) -> float:
    return np.inf if x is None else float(x)


def live_targets(runs, share_rows: list[dict], key: str = "heldout_acc") -> list[dict]:
    """The live arms' three targets, each {"id", "target", "measured", "met" (None: undecided), "per_seed" or
    "per_arm" (where one)}.

    1. gd-live-ds reaches DS's final ``key`` (its fitted curve's last value, per seed) with <= 0.5x DS's rollouts
       (the arm's rollouts to it / DS's rollouts in all; a seed that never reaches it: not met) and with fewer
       rollouts to it than both greso-ds and hive-ds (never reaching it: infinitely many), in >= 5 of 6 seeds:
       "ds" (both in the same seed), with its two halves apart as "ds-rollouts" and "ds-peers".
    2. In target selection and in skipping, graphdiff's best arm (gd-* or gd-live-*, by its accuracy share of the
       oracle's gain, ``share_rows`` as the report computes them) recovers >= 0.4 of the oracle's gain and more
       than the covariates-only peer (cells-live-*).
    3. Every graphdiff arm's estimator (live features included) costs <= 10% of its step (the trainer step plus a
       plan made outside it, as the live features' share; mean over steps, each seed).
    A target is decided only on >= ``MIN_SEEDS`` paired seeds (each arm it compares)."""
    out = []
    arm, peers = "gd-live-ds", ("greso-ds", "hive-ds")
    seeds = sorted(set(runs.get("ds", {})) & set(runs.get(arm, {})))
    if seeds:
        per_seed = []
        for s in seeds:
            ds = runs["ds"][s]
            level, total = final(ds, key), float(curve(ds, key)[0][-1])
            reach = {name: (rollouts_to(runs[name][s], level, key) if s in runs.get(name, {}) else None)
                     for name in (arm, *peers)}
            frac = None if reach[arm] is None else reach[arm] / total
            fewer = (all(s in runs.get(p, {}) for p in peers)
                     and all(_never_inf(reach[arm]) < _never_inf(reach[p]) for p in peers))
            per_seed.append({"seed": s, "level": level, "ds_rollouts": total, "fraction_of_ds": frac,
                             **{f"rollouts_{n}": v for n, v in reach.items()},
                             "half_of_ds": frac is not None and frac <= 0.5, "fewer_than_peers": fewer,
                             "met": frac is not None and frac <= 0.5 and fewer})
        n = len(per_seed)
        decided = n >= MIN_SEEDS
        complete = all(r["seed"] in runs.get(p, {}) for r in per_seed for p in peers)
        count = {k: sum(r[k] for r in per_seed) for k in ("met", "half_of_ds", "fewer_than_peers")}
        fr = ", ".join("never" if r["fraction_of_ds"] is None else f"{r['fraction_of_ds']:.2f}" for r in per_seed)
        out.append({"id": "ds", "target": f"{arm} reaches DS's final accuracy with <= 0.5x DS's rollouts and with fewer "
                                          "rollouts than both greso-ds and hive-ds, in >= 5 of 6 seeds",
                    "measured": f"both in {count['met']} of {n} seeds",
                    "met": (count["met"] >= 5 / 6 * n) if decided and complete else None, "per_seed": per_seed})
        out.append({"id": "ds-rollouts", "target": f"... of which: {arm} reaches DS's final accuracy with <= 0.5x DS's "
                                                   "rollouts, in >= 5 of 6 seeds",
                    "measured": f"{count['half_of_ds']} of {n} seeds (per seed {fr})",
                    "met": (count["half_of_ds"] >= 5 / 6 * n) if decided else None})
        out.append({"id": "ds-peers", "target": f"... of which: {arm} needs fewer rollouts to DS's final accuracy than "
                                                "both greso-ds and hive-ds, in >= 5 of 6 seeds",
                    "measured": f"{count['fewer_than_peers']} of {n} seeds",
                    "met": (count["fewer_than_peers"] >= 5 / 6 * n) if decided and complete else None})
    for tid, rule, gd_arms, peer in (("selection-share", "target-difficulty selection", ("gd-thompson", "gd-live-thompson"),
                                      "cells-live-thompson"),
                                     ("skipping-share", "zero-variance skipping", ("gd-skip", "gd-live-skip"),
                                      "cells-live-skip")):
        got = {r["estimator"]: r for r in share_rows if r["rule"] == rule and r["metric"] == key and r.get("share_acc")}
        shares = {n: got[n]["share_acc"] for n in (*gd_arms, peer) if n in got and got[n]["share_acc"]["value"] is not None}
        gd = {n: v for n, v in shares.items() if n in gd_arms}
        if not gd:
            continue
        best = max(gd, key=lambda n: gd[n]["value"])
        b, p = gd[best], shares.get(peer)
        decided = b["seeds"] >= MIN_SEEDS and p is not None and p["seeds"] >= MIN_SEEDS
        out.append({"id": tid, "target": f"{rule}: graphdiff's best arm recovers >= 0.4 of the oracle's gain, more than {peer}",
                    "measured": f"{best} {b['value']:.2f} [{_fmt2(b['lo'])}, {_fmt2(b['hi'])}]; "
                                + (f"{peer} {p['value']:.2f} [{_fmt2(p['lo'])}, {_fmt2(p['hi'])}]" if p else
                                   f"{peer}: not run"),
                    "met": bool(b["value"] >= 0.4 and b["value"] > p["value"]) if decided else None})
    cost = {}
    for name, by_seed in runs.items():
        if not name.startswith("gd-"):
            continue
        shares = []
        for rows in by_seed.values():
            # the arm's step: the trainer step plus a plan made outside it (0 for DS: its pre-filter is inside)
            pairs = [(r["estimator_seconds"], r["step_seconds"] + float(r.get("estimator_plan_seconds") or 0.0))
                     for r in rows if r.get("step", 0) > 0 and r.get("step_seconds")]
            if pairs:
                shares.append(float(np.mean([e / t for e, t in pairs])))
        if shares:
            cost[name] = shares
    if cost:
        out.append({"id": "overhead", "target": "every graphdiff arm's estimator, live features included, <= 10% of its step",
                    "measured": "; ".join(f"{n} {np.mean(v):.1%} (max {max(v):.1%})" for n, v in sorted(cost.items())),
                    "met": (max(max(v) for v in cost.values()) <= 0.10)
                    if min(len(v) for v in cost.values()) >= MIN_SEEDS else None,
                    "per_arm": cost})
    return out


def _fmt2(x) -> str:
    return "-" if x is None else f"{x:.2f}"
