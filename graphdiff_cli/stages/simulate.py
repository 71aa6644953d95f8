"""Stage behind ``graphdiff simulate``: a synthetic prompt set and RLVR trajectory (``evaluation.simulate``)."""

from __future__ import annotations

import numpy as np

from ..errors import DataError, InvalidArgumentError


def simulate(out_prompts, out_log, *, prompts: int | None = None, steps: int | None = None,
             batch_size: int | None = None, rollouts: int = 8, seed: int = 0, math=None, epochs: int = 3,
             shifts=(), rates=None, skill_groups=None, drift_mean: float | None = None,
             drift_skill_sd: float | None = None, drift_item_sd: float | None = None) -> dict:
    """Write a simulated trajectory: prompts (id, prompt, topic, level) and a log (step, id, n, s, p_true).

    Templates (default 2,000 prompts, 100 steps of 128); with ``math`` a MATH JSONL/CSV/Parquet file
    (unique_id, problem, subject, level) whose rows become the prompts (all of them, or a seeded subset
    of ``prompts`` rows in file order), ``epochs`` passes of 256-prompt batches unless ``steps`` is given.
    ``shifts``: 'STEP:TOPIC:DELTA' strings (or ``evaluation.simulate.Shift``s), a topic's ability moved mid-run.
    With ``rates`` (``simulate_rates``): real starting rates, a drifting policy.
    """
    from ..evaluation import simulate as S
    from ..core.decisions import check_int
    from ..io.tables import write_rows

    seed = check_int(seed, "--seed", 0)  # numpy seeds are >= 0
    if rates is not None:
        if math is not None or shifts:
            raise InvalidArgumentError("--rates takes no --math or --shift (its drift is --drift-mean, "
                                       "--drift-skill-sd, --drift-item-sd over --skill-groups)")
        return simulate_rates(out_prompts, out_log, rates, prompts=prompts, steps=steps, batch_size=batch_size,
                              rollouts=rollouts, seed=seed, epochs=epochs, skill_groups=skill_groups,
                              drift_mean=drift_mean, drift_skill_sd=drift_skill_sd, drift_item_sd=drift_item_sd)
    if skill_groups is not None or any(v is not None for v in (drift_mean, drift_skill_sd, drift_item_sd)):
        raise InvalidArgumentError("--skill-groups and the --drift-* options need --rates")
    shifts = [sh if isinstance(sh, S.Shift) else S.Shift.parse(sh) for sh in shifts]
    if math is None:
        sim = S.simulate(n_prompts=2000 if prompts is None else prompts, steps=100 if steps is None else steps,
                         batch_size=128 if batch_size is None else batch_size, rollouts=rollouts, seed=seed,
                         shifts=shifts)
    else:
        from ..io.tables import read_rows

        rows = _subset([row for _, row in read_rows(math)], prompts, seed, math)
        sim = S.simulate_math(rows, epochs=epochs, batch_size=256 if batch_size is None else batch_size,
                              rollouts=rollouts, seed=seed, steps=steps, shifts=shifts)
    write_rows(out_prompts, [{k: p[k] for k in ("id", "prompt", "topic", "level")} for p in sim.prompts],
               columns=["id", "prompt", "topic", "level"])
    log_rows = sim.log_rows()
    for row, p in zip(log_rows, sim.p_true):
        row["p_true"] = round(float(p), 6)
    write_rows(out_log, log_rows, columns=["step", "id", "n", "s", "p_true"])
    rate = sim.s / sim.n
    first = sim.step <= sim.step.max() / 3
    return {"command": "simulate", "out_prompts": str(out_prompts), "out_log": str(out_log),
            "prompts": len(sim.prompts), "steps": int(sim.step.max()), "rows": int(sim.step.size),
            "topics": sim.topics, "params": sim.params,
            "mean_rate": {"first_third": float(rate[first].mean()), "last_third": float(rate[~first].mean())
                          if (~first).any() else None}}


def _subset(rows: list, prompts: int | None, seed: int, source) -> list:
    """All ``rows`` of ``source``, or a seeded subset of ``prompts`` of them in file order (--prompts)."""
    if not rows:
        raise DataError(f"{source}: no rows")
    if prompts is None:
        return rows
    if prompts < 1 or prompts > len(rows):
        raise InvalidArgumentError(f"--prompts must lie in [1, {len(rows)}] for {source}, got {prompts}")
    keep = np.sort(np.random.default_rng(seed).choice(len(rows), size=prompts, replace=False))
    return [rows[i] for i in keep]


def simulate_rates(out_prompts, out_log, rates, *, prompts: int | None = None, steps: int | None = None,
                   batch_size: int | None = None, rollouts: int = 8, seed: int = 0, epochs: int = 3,
                   skill_groups=None, drift_mean: float | None = None, drift_skill_sd: float | None = None,
                   drift_item_sd: float | None = None, id_field: str = "id") -> dict:
    """A trajectory from real starting rates (``evaluation.rate_drift``): ``rates`` is a JSONL/CSV/Parquet file of
    rows {id, n, s[, problem]} (e.g. ../shared/data/deepscaler_difficulty/problems.jsonl); all of them, or a
    seeded subset of ``prompts`` rows in file order. ``skill_groups``: a clusters artifact (``graphdiff
    cluster``) whose labels are the skill groups, matched by id (every prompt must be in it); None: no shared
    skill. Writes prompts (id, prompt, p0, skill, speed) and a log (step, id, n, s, p_true). ``steps`` is
    refused: the run is ``epochs`` passes of ``batch_size`` (default 256) prompts, so a prompt is visited at
    most ``epochs`` times."""
    from ..evaluation import rate_drift as R
    from ..io.readers import read_clusters
    from ..io.tables import read_rows, write_rows

    if steps is not None:
        raise InvalidArgumentError("--rates runs --epochs passes; --steps is not taken (each prompt is visited at "
                                   "most --epochs times)")
    rows = []
    for line, row in read_rows(rates):
        for name in (id_field, "n", "s"):
            if name not in row:
                raise DataError(f"{rates}:{line}: no {name!r} field (a rates row needs {id_field}, n, s)")
        rows.append(row)
    rows = _subset(rows, prompts, seed, rates)
    ids = [str(r[id_field]) for r in rows]
    try:
        n = np.array([int(r["n"]) for r in rows], dtype=np.int64)
        s = np.array([int(r["s"]) for r in rows], dtype=np.int64)
    except (TypeError, ValueError):
        raise DataError(f"{rates}: n and s must be integers") from None
    groups = None
    if skill_groups is not None:
        c = read_clusters(skill_groups, None)
        where = {pid: j for j, pid in enumerate(c.ids)}
        missing = [pid for pid in ids if pid not in where]
        if missing:
            raise DataError(f"{skill_groups}: has no skill group for {len(missing)} prompt(s) of {rates}, e.g. "
                            f"{missing[0]!r}")
        groups = c.labels[[where[pid] for pid in ids]]
    drift = {k: v for k, v in (("drift_mean", drift_mean), ("drift_skill_sd", drift_skill_sd),
                               ("drift_item_sd", drift_item_sd)) if v is not None}
    traj = R.simulate_from_rates(ids, n, s, groups=groups, epochs=epochs,
                                 batch_size=256 if batch_size is None else batch_size, rollouts=rollouts, seed=seed,
                                 **drift)
    write_rows(out_prompts, [{"id": pid, "prompt": str(r.get("problem", r.get("prompt", ""))), "p0": round(float(p), 6),
                              "skill": int(g), "speed": round(float(v), 6)}
                             for pid, r, p, g, v in zip(ids, rows, traj.p0, traj.group, traj.speed)],
               columns=["id", "prompt", "p0", "skill", "speed"])
    write_rows(out_log, traj.log_rows(), columns=["step", "id", "n", "s", "p_true"])
    params = {**traj.params, "rates": str(rates), "skill_groups_from": None if skill_groups is None else str(skill_groups)}
    third = traj.step <= traj.step.max() / 3
    last = traj.step > 2 * traj.step.max() / 3
    visits = np.bincount(traj.id, minlength=len(ids))
    return {"command": "simulate", "out_prompts": str(out_prompts), "out_log": str(out_log),
            "prompts": len(ids), "steps": int(traj.step.max()), "rows": int(traj.step.size), "topics": None,
            "params": params, "max_visits": int(visits.max()),
            "mean_p_true": {"first_third": float(traj.p_true[third].mean()),
                            "last_third": float(traj.p_true[last].mean())},
            "mean_rate": {"first_third": float((traj.s / traj.n)[third].mean()),
                          "last_third": float((traj.s / traj.n)[last].mean())}}
