"""Stage: offline counterfactual replay of selection and allocation (``evaluation.counterfactual``) on a log.

Inputs are the ones ``graphdiff evaluate`` reads (a log of rows step, id, n, s; the graph and clusters
artifacts; embeddings for VIP, DOTS and the ridge read-out), read with the same readers. Every method except the oracles of the
estimation replay takes part: graphdiff, per-prompt history, discounted history (lambda = 0.9, m = 1,
the peers' suggested start; not tuned on the log, which would be hindsight), MoPPS (lambda 1 and 0.5),
GRESO, VIP, DOTS and the ridge read-out (when embeddings are given) and label propagation. The result dict (also written as JSON
to ``out`` when given, atomically) carries the note that the policy's response to the choice is out of
reach offline.
"""

from __future__ import annotations

import json
import time

from ..errors import DataError
from .progress import Progress, no_progress, phase




def run_counterfactual(lg: dict, cfg: dict, w, labels, k: int, emb, n_nodes: int, *, methods=None,
                       batch_size: int = 128, pool_factor: float = 2.0, seed: int = 0,
                       strategies=("target", "thompson", "skip-zero-variance"), allocation=("uniform", "variance", "vip"),
                       budget_per_prompt: int = 8, min_count: int = 2, max_count: int = 32,
                       explore: float | None = None, skip_unavailable: bool = False, predictions=None,
                       covariates=None, reference=None, progress: Progress = no_progress) -> dict:
    """Both replays on a log already read (``read_log``) with the graph's arrays; the result dict.

    A log that cannot give one of the replays (selection: no round holds a pool) raises its ``DataError``;
    with ``skip_unavailable`` the other replay is still run and the reason is kept instead, under
    ``selection_skipped`` / ``allocation_skipped`` (both unavailable: the first error is raised).
    ``predictions``: {name: per-row predictions} of estimators already replayed on this log as built here
    (``evaluation.counterfactual.allocation_replay`` then reuses them instead of a second pass).
    ``covariates``, ``reference``: the prompts' encoded covariates and reference pass rate (None: not given; the
    covariate methods are then left out).
    """
    from ..core import decisions as dec
    from ..evaluation.counterfactual import OUT_OF_REACH, allocation_replay, selection_replay
    from ..evaluation.methods import COUNTERFACTUAL_METHODS, method_factories

    # the target rule at the chosen exploration, and without any (the bare estimates) for comparison
    explore = dec.TARGET_EXPLORE if explore is None else dec.check_explore(explore)
    target_explore = (explore, 0.0) if explore > 0 else (0.0,)
    keys = list(methods) if methods else list(COUNTERFACTUAL_METHODS)
    factories = method_factories(keys, cfg, w, labels, k, emb, n_nodes, covariates, reference)
    res: dict = {"note": OUT_OF_REACH, "methods": list(factories)}
    errors: list[DataError] = []

    def attempt(key, run):
        try:
            res[key] = run()
        except DataError as exc:
            if not skip_unavailable:
                raise
            errors.append(exc)
            res[f"{key}_skipped"] = str(exc)

    if strategies:
        phase(progress, "counterfactual selection (estimator x rule runs)")
        progress(0, None)
        attempt("selection", lambda: selection_replay(
            lg["step"], lg["id"], lg["n"], lg["s"], factories, strategies=strategies, batch_size=batch_size,
            pool_factor=pool_factor, seed=seed, target_explore=target_explore, n_nodes=n_nodes, progress=progress))
    if allocation:
        phase(progress, "counterfactual allocation (estimators)")
        progress(0, None)
        attempt("allocation", lambda: allocation_replay(
            lg["step"], lg["id"], lg["n"], lg["s"], factories, strategies=allocation,
            budget_per_prompt=budget_per_prompt, min_count=min_count, max_count=max_count, n_nodes=n_nodes,
            predictions=predictions, progress=progress))
    if errors and "selection" not in res and "allocation" not in res:
        raise errors[0]
    return res


def counterfactual(log, graph, clusters, *, embeddings=None, config=None, methods=None, batch_size: int = 128,
                   pool_factor: float = 2.0, seed: int = 0, strategies=("target", "thompson", "skip-zero-variance"),
                   allocation=("uniform", "variance", "vip"), budget_per_prompt: int = 8, min_count: int = 2,
                   max_count: int = 32, explore: float | None = None, device: str | None = None, out=None,
                   progress: Progress = no_progress) -> dict:
    """Run both replays; returns {"selection": ..., "allocation": ..., "methods": [...], "note": ...}."""
    from ..io.readers import read_inputs, read_log
    from ..evaluation.methods import load_config, with_device

    t0 = time.perf_counter()
    cfg = with_device(load_config(config), device)
    inp = read_inputs(graph, clusters, embeddings)
    lg = read_log(log, inp.graph.index)
    res = run_counterfactual(lg, cfg, inp.w, inp.labels, inp.k, inp.embeddings, len(inp.ids), methods=methods,
                             batch_size=batch_size,
                             pool_factor=pool_factor, seed=seed, strategies=strategies, allocation=allocation,
                             budget_per_prompt=budget_per_prompt, min_count=min_count, max_count=max_count,
                             explore=explore, progress=progress)
    res["seconds"] = time.perf_counter() - t0
    if out is not None:
        from ..io.atomic import atomic_write_text

        atomic_write_text(out, json.dumps(res, indent=2, sort_keys=True) + "\n")
    return res
