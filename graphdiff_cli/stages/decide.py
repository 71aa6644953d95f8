"""Stages behind ``graphdiff select`` and ``graphdiff allocate``: a STATE's estimates -> a decision file.

``select``: read a candidate pool (one id per line, or a table with an ``id`` column), map the string
ids through the STATE's ids, take the current step's estimates for them, and write the B chosen
prompts (``core.decisions.select``). ``allocate``: the same for a list of prompts and a total rollout
budget, writing one count per prompt (``core.decisions.allocate``).

Both say what the decision is worth by the estimator's own belief: the expected number of groups with a signal
(0 < s < n) of its choice and of uniform's (``expected_signal_groups``), and a one-line warning in the result's
``warnings`` when the strategy's falls short of uniform's (``core.decisions.short_of_uniform``): a rule that the
estimate itself says does worse than uniform does not go ahead silently.

Everything is read and checked before anything is written: an unknown or repeated id is refused with
its file and line, an impossible batch size or budget before the estimator is even loaded, and the
output is written atomically (``.txt``: one id per line; otherwise JSONL, CSV or Parquet by the
extension). No typer or rich here.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..core import decisions as dec
from ..core.beta import DEFAULT_GROUP_SIZE
from ..errors import InvalidArgumentError, option
from .progress import Progress, no_progress


DEFAULT_SELECT_STRATEGY = dec.DEFAULT_SELECT_STRATEGY

SELECT_COLUMNS = ["rank", "id", "p", "mean", "variance", "p_zero_variance", "n_seen", "key"]
ALLOCATE_COLUMNS = ["id", "n", "p", "p_nondegenerate"]


def _check_out(out, fmt):
    from ..io.tables import detect_format

    if out is None:
        return None
    out = Path(out)
    if fmt is None and out.suffix.lower() == ".txt":
        return "txt"
    return detect_format(out, fmt)


def _write(out, fmt: str, records: list[dict], columns: list[str]) -> None:
    from ..io.atomic import atomic_write_text
    from ..io.tables import write_rows

    if fmt == "txt":
        atomic_write_text(out, "".join(f"{r['id']}\n" for r in records))
    else:
        write_rows(out, records, fmt, columns)


def _json_float(x) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


def _candidates(index, retired: np.ndarray, pool, id_field: str = "id") -> tuple[list[str], np.ndarray, int, str]:
    """(ids, node indices, how many were retired, where) of the candidates of ``pool`` (an ids file, a table's
    ids read from its ``id_field``, or a list of ids) that are not retired (graphdiff retire), by ``index`` (the
    ``IdIndex`` of the estimator's version) and ``retired`` (its retired node indices)."""
    from ..io.readers import id_nodes
    from .handoff import active_rows

    ids, rows, where = id_nodes(pool, index, id_field=id_field)
    keep = active_rows(rows, retired)
    if keep.all():
        return ids, rows, 0, where
    return [pid for pid, k in zip(ids, keep) if k], rows[keep], int((~keep).sum()), where


# ------------------------------------------------------------------------------------------- select

def check_select(batch_size: int, strategy: str, out=None, *, seed: int = 0, target: float = 0.5,
                 explore: float = dec.TARGET_EXPLORE, group_size: int = DEFAULT_GROUP_SIZE, fmt: str | None = None,
                 id_field: str = "id") -> dict:
    """The options of a select, checked before the estimator is read: ``select``'s keywords."""
    from ..core.beta import check_group_size
    from ..io.tables import check_id_field

    dec.check_strategy(strategy, dec.SELECT_STRATEGIES, "selection")
    dec.check_target(target)
    explore = dec.check_explore(explore)
    group_size = check_group_size(group_size, option("--group-size"))
    seed = dec.check_int(seed, option("--seed"), 0)  # numpy seeds are >= 0
    id_field = check_id_field(id_field)
    fmt = _check_out(out, fmt)
    dec.check_int(batch_size, option("--batch-size"), 1)
    return {"batch_size": batch_size, "strategy": strategy, "out": out, "seed": seed, "target": target,
            "explore": explore, "group_size": group_size, "fmt": fmt, "id_field": id_field}


def select(est, index, retired: np.ndarray, candidates, *, root, batch_size: int, strategy: str, out, seed: int,
           target: float, explore: float, group_size: int, fmt: str | None, id_field: str,
           progress: Progress = no_progress, t0: float, live: dict | None = None) -> dict:
    """Choose ``batch_size`` prompts of ``candidates`` (an ids file or a list of ids) by ``strategy`` with the
    estimator ``est`` (``index``: the ``IdIndex`` of its version, ``retired`` its retired node indices; the
    options checked by ``check_select``); written to ``out`` when given (the result's ``ids`` are the choice,
    best first). ``id_field``: where a table of candidates holds the id (a column or a dotted path); ``live``:
    {id: live features} of candidates (``io.live``; a candidate without them gets no live estimate)."""
    from ..io.live import live_matrix

    ids, rows, skipped, where = _candidates(index, retired, candidates, id_field)
    if batch_size > rows.size:
        raise InvalidArgumentError(f"{option('--batch-size')} {batch_size} is larger than the pool of {rows.size} "
                                   f"candidates in {where}" + (f" ({skipped} more are retired)" if skipped else ""))
    progress(1, 3)
    m = est.estimates(rows, group_size=group_size, live=live_matrix(live, ids))
    sel = dec.select(strategy, batch_size, p=m["mean"], variance=m["variance"],
                     p_zero_variance=m["p_zero_variance"], target=target, explore=explore, seed=seed)
    progress(2, 3)
    expected, uniform = dec.selection_signal_groups(m["p_zero_variance"], sel.chosen)
    warnings = []
    if strategy != "uniform" and dec.short_of_uniform(expected, uniform):
        warnings.append(f"the {strategy} strategy does worse than uniform here by the estimator's own belief: its "
                        f"{batch_size} prompts are expected to give {expected:.2f} groups with a signal (0 < s < "
                        f"{group_size}), a uniform draw from the pool of {rows.size} {uniform:.2f}")
    records = [{"rank": r + 1, "id": ids[j], "p": float(m["p"][j]), "mean": float(m["mean"][j]), "variance": float(m["variance"][j]),
                "p_zero_variance": float(m["p_zero_variance"][j]), "n_seen": int(m["n_seen"][j]),
                "key": _json_float(sel.key[j])} for r, j in enumerate(sel.chosen)]
    if out is not None:
        _write(out, fmt, records, SELECT_COLUMNS)
    progress(3, 3)
    chosen = sel.chosen
    signal = 1.0 - m["p_zero_variance"]
    return {"command": "select", "state": str(root), "step": est.step_, "strategy": strategy, "seed": seed,
            "target": target, **({"explore": explore} if strategy == "target" else {}),
            "group_size": group_size, "batch_size": batch_size, "pool": int(rows.size), "retired_skipped": skipped,
            "out": None if out is None else str(out), "format": fmt, "ids": [ids[j] for j in chosen],
            "p_mean": {"chosen": float(m["p"][chosen].mean()), "pool": float(m["p"].mean())},
            # predicted share of groups with 0 < s < g: what the choice is meant to raise
            "predicted_effective_share": {"chosen": float(signal[chosen].mean()), "pool": float(signal.mean())},
            # the same as expected groups with a signal, and uniform's: a uniform draw of as many from the pool
            "expected_signal_groups": {"chosen": expected, "uniform": uniform}, "warnings": warnings,
            **({"dropped": int(sel.dropped.sum()), "filled": sel.info["filled"]} if sel.dropped is not None else {}),
            "timings": {"total_s": time.perf_counter() - t0}}


# ----------------------------------------------------------------------------------------- allocate

def check_allocate(budget: int, strategy: str, out=None, *, min_count: int = 2, max_count: int = 32,
                   vip_gamma: float = 0.0, fmt: str | None = None, id_field: str = "id") -> dict:
    """The options of an allocate, checked before the estimator is read: ``allocate``'s keywords."""
    from ..io.tables import check_id_field

    dec.check_strategy(strategy, dec.ALLOCATE_STRATEGIES, "allocation")
    id_field = check_id_field(id_field)
    fmt = _check_out(out, fmt)
    if fmt == "txt":
        raise InvalidArgumentError(f"{out}: an allocation needs a table (.jsonl, .csv or .parquet) for its "
                                   "id and n columns")
    if strategy == "vip" and min_count < 2:
        raise InvalidArgumentError(f"the vip strategy needs {option('--min', 'min_count')} >= 2, got {min_count}")
    return {"budget": budget, "strategy": strategy, "out": out, "min_count": min_count, "max_count": max_count,
            "vip_gamma": vip_gamma, "fmt": fmt, "id_field": id_field}


def allocate(est, index, retired: np.ndarray, ids, *, root, budget: int, strategy: str, out, min_count: int,
             max_count: int, vip_gamma: float, fmt: str | None, id_field: str, progress: Progress = no_progress,
             t0: float, live: dict | None = None) -> dict:
    """Split ``budget`` rollouts over the prompts ``ids`` (an ids file or a list of ids) by ``strategy`` with the
    estimator ``est`` (``index``: the ``IdIndex`` of its version, ``retired`` its retired node indices; the
    options checked by ``check_allocate``); id, n per prompt written to ``out`` when given (the result's
    ``counts_by_id``). ``id_field``: where a table of ids holds the id (a column or a dotted path); ``live``: as
    ``select``'s."""
    from ..io.live import live_matrix

    ids, rows, skipped, _where = _candidates(index, retired, ids, id_field)
    dec.check_budget(rows.size, budget, min_count, max_count)
    progress(1, 3)
    m = est.estimates(rows, live=live_matrix(live, ids))
    p = np.asarray(m["p"], dtype=np.float64)
    n = dec.allocate(strategy, p, budget, min_count, max_count, vip_gamma=vip_gamma)
    progress(2, 3)
    signal = dec.nondegenerate_probability(p, n)
    records = [{"id": ids[j], "n": int(n[j]), "p": float(p[j]), "p_nondegenerate": float(signal[j])}
               for j in range(len(ids))]
    if out is not None:
        _write(out, fmt, records, ALLOCATE_COLUMNS)
    progress(3, 3)
    uniform = dec.allocate("uniform", p, budget, min_count, max_count)
    # under the belief (each prompt's Beta of mean and variance, as select and p_zero_variance read it)
    expected = {"allocation": dec.expected_signal_groups(m["mean"], m["variance"], n),
                "uniform": dec.expected_signal_groups(m["mean"], m["variance"], uniform)}
    warnings = []
    if strategy != "uniform" and dec.short_of_uniform(expected["allocation"], expected["uniform"]):
        warnings.append(f"the {strategy} allocation does worse than uniform here by the estimator's own belief: its "
                        f"counts are expected to give {expected['allocation']:.2f} groups with a signal (0 < s < n), "
                        f"uniform counts {expected['uniform']:.2f}")
    return {"command": "allocate", "state": str(root), "step": est.step_, "strategy": strategy,
            "budget": int(budget), "prompts": len(ids), "retired_skipped": skipped, "min": int(min_count), "max": int(max_count),
            "vip_gamma": float(vip_gamma), "out": None if out is None else str(out), "format": fmt,
            "counts_by_id": {r["id"]: r["n"] for r in records},
            "counts": {"min": int(n.min()), "max": int(n.max()), "at_min": int((n == min_count).sum()),
                       "at_max": int((n == max_count).sum())},
            # plug-in expectation under the estimates (the policy's true rates are unknown here)
            "predicted_nondegenerate_groups": {"allocation": float(signal.sum()),
                                               "uniform": float(dec.nondegenerate_probability(p, uniform).sum())},
            "expected_signal_groups": expected, "warnings": warnings,
            "timings": {"total_s": time.perf_counter() - t0}}
