"""Stage behind ``graphdiff simulate``: a synthetic prompt set and RLVR trajectory (``core.simulate``)."""

from __future__ import annotations

import numpy as np

from ..errors import DataError, InvalidArgumentError


def simulate(out_prompts, out_log, *, prompts: int | None = None, steps: int | None = None,
             batch_size: int | None = None, rollouts: int = 8, seed: int = 0, math=None, epochs: int = 3,
             shifts=()) -> dict:
    """Write a simulated trajectory: prompts (id, prompt, topic, level) and a log (step, id, n, s, p_true).

    Templates (default 2,000 prompts, 100 steps of 128); with ``math`` a MATH JSONL/CSV/Parquet file
    (unique_id, problem, subject, level) whose rows become the prompts (all of them, or a seeded subset
    of ``prompts`` rows in file order), ``epochs`` passes of 256-prompt batches unless ``steps`` is given.
    ``shifts``: 'STEP:TOPIC:DELTA' strings (or ``core.simulate.Shift``s), a topic's ability moved mid-run.
    """
    from ..core import simulate as S
    from ..core.decisions import check_int
    from ..io.tables import write_rows

    seed = check_int(seed, "--seed", 0)  # numpy seeds are >= 0
    shifts = [sh if isinstance(sh, S.Shift) else S.Shift.parse(sh) for sh in shifts]
    if math is None:
        sim = S.simulate(n_prompts=2000 if prompts is None else prompts, steps=100 if steps is None else steps,
                         batch_size=128 if batch_size is None else batch_size, rollouts=rollouts, seed=seed,
                         shifts=shifts)
    else:
        from ..io.tables import read_rows

        rows = [row for _, row in read_rows(math)]
        if not rows:
            raise DataError(f"{math}: no rows")
        if prompts is not None:
            if prompts < 1 or prompts > len(rows):
                raise InvalidArgumentError(f"--prompts must lie in [1, {len(rows)}] for {math}, got {prompts}")
            keep = np.sort(np.random.default_rng(seed).choice(len(rows), size=prompts, replace=False))
            rows = [rows[i] for i in keep]
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
