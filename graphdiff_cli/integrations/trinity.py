"""graphdiff as a Trinity-RFT task selector (``buffer.explorer_input.tasksets[i].data_selector``).

Trinity-RFT (checked against the 0.6.0 wheel) builds each taskset's selector in its file reader as
``SELECTORS.get(data_selector.selector_type)(data_source, data_selector)``, where ``data_source`` is the
reader's ``_HFBatchReader`` (the Hugging Face data set in ``.dataset``) and ``data_selector`` a
``DataSelectorConfig`` (``selector_type``, ``seed``, ``feature_keys``, ``kwargs``). Its ``TasksetScheduler``
then, per explorer step, asks ``get_indices(batch_size)`` for the rows to roll out, and when the step's
experiences have gone through the experience pipeline calls ``feedback(**metric)`` with what an operator
put under ``selector_metric`` for this taskset; it checkpoints ``state_dict()`` (JSON, in the explorer's
state) and calls ``load_state_dict`` when it starts - with ``{"current_index": 0}`` on a fresh run.
``SELECTORS.get`` imports a dotted ``module.Class`` key itself, in whichever process reads the config, so

    data_selector:
      selector_type: graphdiff_cli.integrations.trinity.GraphdiffSelector
      kwargs: {state: runs/STATE, group_size: 8, strategy: target}

needs no plugin; ``register()`` adds the short names (``graphdiff``, and ``graphdiff_outcomes`` for the
operator) in a process that calls it. This adapter:

* maps a task index (the row number Trinity passes around, ``task.index["index"]``) to a prompt id: the
  row's ``id_field`` (default ``id``; a dotted path such as ``extra_info.index`` reads a nested field) as
  ``str()`` (``ids.trinity_id``; ``graphdiff ids --trainer trinity`` prints it per row). Rows without an
  id, repeated ids and ids the STATE lacks are refused at start-up;
* ``get_indices(B)``: a pool of ``pool_factor`` x B rows drawn at random from the rows not retired, with
  ``prefilter`` each skipped before generation with probability min(p_zero_variance, 1 - ``prefilter_min_keep``)
  (``core.decisions.prefilter_zero_variance``; when fewer than B survive, the skipped ones with the lowest
  p_zero_variance come back), then B of them by ``strategy`` (``core.decisions.select``), from the
  estimates after the last step fed back. Each read is seeded by (``data_selector.seed``, read number);
* ``feedback``: one explorer step's outcomes applied as exactly one STATE step. With the
  ``GraphdiffOutcomes`` operator (``graphdiff_outcomes``) it gets each task's per-rollout rewards and the
  explorer step (the experiences' batch id): success = reward >= ``success_threshold`` (unset: 0/1 rewards
  only), STATE step = explorer step, and explorer steps that fed nothing back (no finished task of this
  taskset) are applied as empty steps so the two counters stay equal. With Trinity's own
  ``pass_rate_calculator`` it gets only each task's mean reward: successes = mean x ``group_size``, refused
  unless that is a whole number (0/1 rewards, every rollout back), applied as the STATE's next step;
* ``state_dict`` records the STATE's step; ``load_state_dict`` refuses a STATE that is not at that step
  (``graphdiff rollback --to STEP``) - on a fresh run, step 0.

Options (``data_selector.kwargs``): ``state`` (required; environment fallback ``GRAPHDIFF_STATE``),
``group_size`` (required: ``algorithm.repeat_times``), ``id_field`` (id), ``strategy`` (target),
``pool_factor`` (4), ``target`` (0.5), ``explore`` (1), ``prefilter`` (false), ``prefilter_min_keep`` (0.01),
``success_threshold`` (unset), ``outcomes_dir`` (next to the STATE). Trinity is imported only by
``register()`` and by the ``GraphdiffOutcomes`` attribute (its base class is Trinity's): graphdiff imports
without Trinity.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from ..core import decisions as dec
from ..errors import BackendError, DataError, InvalidArgumentError, StateError
from ..io.outcomes import check_threshold
from .ids import row_prompt_ids, trinity_id
from .options import Option, as_flag, as_float, get, read_options
from .tracking import Decision, StepMetrics, count_outcomes, open_target

SELECTOR_PATH = "graphdiff_cli.integrations.trinity.GraphdiffSelector"
OPERATOR_PATH = "graphdiff_cli.integrations.trinity.GraphdiffOutcomes"
SELECTOR_NAME, OPERATOR_NAME = "graphdiff", "graphdiff_outcomes"
SELECTOR_METRIC = "selector_metric"  # trinity.common.constants.SELECTOR_METRIC (a test holds the two equal)

# the selector's options (data_selector.kwargs.<name>), read by options.read_options
OPTIONS = {"state": Option(env="GRAPHDIFF_STATE"), "group_size": Option(), "id_field": Option("id"),
           "strategy": Option("target"), "pool_factor": Option(4.0, as_float), "target": Option(0.5, as_float),
           "explore": Option(dec.TARGET_EXPLORE), "prefilter": Option(False, as_flag),
           "prefilter_min_keep": Option(dec.GRESO_MIN_KEEP, as_float), "success_threshold": Option(),
           "outcomes_dir": Option()}
KWARGS = "data_selector.kwargs."

log = logging.getLogger("graphdiff")


def selector_options(config) -> dict:
    """The graphdiff options of a ``DataSelectorConfig`` (its ``kwargs``); unknown keys and
    ``feature_keys`` (difficulty_based's) are refused, ``state`` and ``group_size`` are required."""
    if get(config, "feature_keys", []):
        raise InvalidArgumentError("data_selector.feature_keys belongs to Trinity's difficulty_based selector; "
                                   "graphdiff's selector reads its estimates from the STATE - remove it")
    kwargs = dict(get(config, "kwargs", {}) or {})
    unknown = sorted(set(kwargs) - set(OPTIONS))
    if unknown:
        raise InvalidArgumentError(f"unknown data_selector.kwargs for graphdiff: {', '.join(unknown)} (known: "
                                   f"{', '.join(OPTIONS)})")
    opts = read_options(OPTIONS, kwargs, lambda name: KWARGS + name)
    if opts["group_size"] is None:
        raise InvalidArgumentError("set data_selector.kwargs.group_size to algorithm.repeat_times (the rollouts per "
                                   "task): graphdiff's p_zero_variance and the pass-rate feedback depend on it")
    opts["group_size"] = dec.check_int(opts["group_size"], "data_selector.kwargs.group_size", 1)
    dec.check_strategy(opts["strategy"], dec.SELECT_STRATEGIES, "selection")
    if not opts["pool_factor"] >= 1:
        raise InvalidArgumentError(f"data_selector.kwargs.pool_factor must be >= 1, got {opts['pool_factor']!r}")
    if not 0.0 <= opts["prefilter_min_keep"] <= 1.0:
        raise InvalidArgumentError("data_selector.kwargs.prefilter_min_keep must lie in [0, 1], got "
                                   f"{opts['prefilter_min_keep']!r}")
    opts["target"], opts["explore"] = dec.check_target(opts["target"]), dec.check_explore(opts["explore"])
    opts["success_threshold"] = check_threshold(opts["success_threshold"])
    return opts


def _column(dataset, id_field: str) -> list:
    """Every row's ``id_field`` value (a dotted path reads nested fields); rows lacking it give None."""
    from ..io.tables import field_value

    names = getattr(dataset, "column_names", None)
    if names is not None:  # a Hugging Face Dataset: read one column, not every row
        head = id_field if id_field in names else id_field.split(".")[0]
        if head not in names:
            return [None] * len(dataset)
        values = list(dataset[head])
        if head == id_field:
            return values
        return [field_value({head: v}, id_field)[1] for v in values]
    return [field_value(row, id_field)[1] if isinstance(row, dict) else None for row in dataset]


def taskset_ids(dataset, id_field: str = "id") -> list[str]:
    """Each task row's prompt id as Trinity's selector reports it (``ids.trinity_id``); a row without one
    and two rows with the same one are refused."""
    ids = row_prompt_ids(_column(dataset, id_field), trinity_id, rows="taskset", field=repr(id_field),
                         shared=f"the id {{id}} ({id_field})",
                         missing="every task needs a stable prompt id (data_selector.kwargs.id_field names the field)")
    if not ids:
        raise DataError("the taskset has no rows")
    return ids


class GraphdiffSelector:
    """A Trinity-RFT task selector driven by a graphdiff STATE directory (or an in-memory target); see the
    module docstring. ``target``: an ``Estimator``/``Target`` instead of ``kwargs.state`` (tests)."""

    def __init__(self, data_source, config, target=None):
        self.data_source, self.config = data_source, config
        opts = selector_options(config)
        if target is None:
            if not opts["state"]:
                raise InvalidArgumentError("set data_selector.kwargs.state (or GRAPHDIFF_STATE) to a STATE directory "
                                           "made with graphdiff init")
            target = open_target(opts["state"], outcomes_dir=opts["outcomes_dir"])
        self.target = open_target(target)
        self.options = opts
        self.seed = int(get(config, "seed", 0))
        self.group_size = opts["group_size"]
        self.success_threshold = opts["success_threshold"]
        dataset = getattr(data_source, "dataset", data_source)
        self.row_ids = taskset_ids(dataset, opts["id_field"])
        self.row_nodes = self.target.nodes(self.row_ids, f"taskset {opts['id_field']}")
        self.reads = 0                     # get_indices calls so far (seeds each draw)
        self.decisions: list[Decision] = []
        self.applied: list[dict] = []
        self.metrics: dict[str, float] = {}  # the last step's graphdiff/... scalars (tracking.StepMetrics)

    # -- what Trinity calls --------------------------------------------------------------------------

    def get_indices(self, batch_size: int, return_extra_info: bool = False):
        """``batch_size`` task indices (dataset rows) for the next explorer step, chosen from the estimates."""
        k = dec.check_int(batch_size, "batch size", 1)
        rng = np.random.default_rng([self.seed, self.reads])
        retired = self.target.retired()
        rows = (np.flatnonzero(~np.isin(self.row_nodes, retired)) if retired.size
                else np.arange(self.row_nodes.size))
        if rows.size < k:
            raise InvalidArgumentError(f"Trinity asked for {k} tasks but the taskset has only {rows.size} that are "
                                       "not retired")
        m = min(rows.size, max(k, int(round(self.options["pool_factor"] * k))))
        pool = rows[rng.choice(rows.size, size=m, replace=False)]
        est = self.target.estimates(self.row_nodes[pool], self.group_size)
        pzv = np.asarray(est["p_zero_variance"], np.float64)
        keep = (dec.prefilter_zero_variance(pzv, self.options["prefilter_min_keep"], rng)
                if self.options["prefilter"] else np.ones(m, bool))
        if keep.sum() < k:  # too few survive: the least likely all-equal of the skipped come back
            back = np.flatnonzero(~keep)
            keep[back[np.argsort(pzv[back], kind="stable")][: k - int(keep.sum())]] = True
        alive = np.flatnonzero(keep)
        sel = dec.select(self.options["strategy"], k, p=est["mean"][alive], variance=est["variance"][alive],
                         p_zero_variance=pzv[alive], target=self.options["target"],
                         explore=self.options["explore"], seed=rng)
        picked = alive[sel.chosen]
        chosen = pool[picked]
        self.decisions.append(Decision(batch=self.reads, estimator_step=self.target.step, pool=pool,
                                       p=np.asarray(est["p"], np.float64), chosen=chosen,
                                       extra={"skipped": pool[~keep], "p_zero_variance": pzv}))
        self.reads += 1
        indices = [int(r) for r in chosen]
        if return_extra_info:
            return indices, {"indices": indices, "ids": [self.row_ids[r] for r in indices],
                             "p": [float(x) for x in np.asarray(est["p"])[picked]],
                             "p_zero_variance": [float(x) for x in pzv[picked]],
                             "estimator_step": self.target.step}
        return indices

    def feedback(self, indices, values, rewards=None, step=None) -> dict[str, float]:
        """One explorer step's outcomes for this taskset, applied as one STATE step (see the module docstring).
        ``indices``: task indices; ``values``: each task's mean reward; ``rewards``: each task's per-rollout
        rewards and ``step``: the explorer step (both from ``GraphdiffOutcomes``)."""
        ids, n, s = self.outcomes(indices, values, rewards)
        cur = self.target.step
        if step is None:
            step = cur + 1
        else:
            step = _step_number(step)
            if step <= cur:
                raise StateError(f"Trinity fed back explorer step {step} but the STATE is already at step {cur}: a "
                                 f"step applied twice (resuming? roll the STATE back: graphdiff rollback --state "
                                 f"{_state_path(self.target)} --to {step - 1})")
            for empty in range(cur + 1, step):  # explorer steps that fed nothing back for this taskset
                log.warning("graphdiff: Trinity explorer step %d fed back no outcomes for this taskset; applied as "
                            "an empty STATE step", empty)
                self.apply(empty, [], np.zeros(0, np.int64), np.zeros(0, np.int64))
        return self.apply(step, ids, n, s)

    def state_dict(self) -> dict:
        """What Trinity checkpoints: the STATE step this selector's choices have seen, and the read count."""
        return {"current_index": self.reads, "graphdiff_step": int(self.target.step), "graphdiff_reads": self.reads}

    def load_state_dict(self, state_dict) -> None:
        """Resume: the STATE must be at the step recorded in the checkpoint (0 on a fresh run)."""
        state_dict = dict(state_dict or {})
        if "graphdiff_step" not in state_dict and int(state_dict.get("current_index", 0) or 0) != 0:
            raise StateError("the checkpoint's taskset state was not written by graphdiff's selector (current_index "
                             f"{state_dict['current_index']}, no graphdiff_step): graphdiff cannot tell which STATE "
                             "step it resumes after; start a new run (a new checkpoint directory)")
        expected = int(state_dict.get("graphdiff_step", 0))
        cur = int(self.target.step)
        if cur != expected:
            what = "starts" if "graphdiff_step" not in state_dict else "resumes from a checkpoint"
            fix = (f"graphdiff rollback --state {_state_path(self.target)} --to {expected}" if cur > expected
                   else "use the STATE this run was checkpointed with")
            raise StateError(f"the graphdiff STATE is at step {cur} but Trinity {what} at step {expected}: {fix}")
        self.reads = int(state_dict.get("graphdiff_reads", 0))

    # -- the pieces ----------------------------------------------------------------------------------

    def _id(self, index) -> str:
        try:
            r = int(index)
        except (TypeError, ValueError):
            raise DataError(f"Trinity fed back task index {index!r}, not a row number") from None
        if not 0 <= r < len(self.row_ids) or r != index:
            raise DataError(f"Trinity fed back task index {index!r}, not a row of this taskset's "
                            f"{len(self.row_ids)} (is the feedback for another taskset?)")
        return self.row_ids[r]

    def outcomes(self, indices, values, rewards=None) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(prompt ids, n, s) of one step's feedback (per-rollout ``rewards``, or mean ``values`` x group_size)."""
        indices, values = list(indices), list(values)
        if len(indices) != len(values):
            raise DataError(f"Trinity fed back {len(indices)} task indices with {len(values)} values")
        if rewards is not None:
            rewards = list(rewards)
            if len(rewards) != len(indices):
                raise DataError(f"Trinity fed back {len(indices)} task indices with {len(rewards)} reward lists")
            rows = [(0, self._id(i), float(r)) for i, rs in zip(indices, rewards) for r in rs]
            return count_outcomes(rows, self.success_threshold)
        if self.success_threshold is not None:
            raise InvalidArgumentError("success_threshold needs each rollout's reward, which pass_rate_calculator "
                                       f"does not pass on: use the {OPERATOR_NAME} operator ({OPERATOR_PATH})")
        g = self.group_size
        rows = []
        for i, v in zip(indices, values):
            pid, v = self._id(i), float(v)
            succ = v * g
            if not (0.0 <= v <= 1.0) or not math.isclose(succ, round(succ), abs_tol=1e-6):
                raise DataError(f"task {pid!r} has mean reward {v:g} over group_size {g} rollouts: not a count of "
                                f"0/1 successes; use the {OPERATOR_NAME} operator (per-rollout rewards, "
                                "success_threshold) instead of pass_rate_calculator")
            rows.extend([(0, pid, 1.0)] * int(round(succ)) + [(0, pid, 0.0)] * (g - int(round(succ))))
        return count_outcomes(rows, None)

    def apply(self, step: int, ids: list[str], n: np.ndarray, s: np.ndarray) -> dict[str, float]:
        metrics = StepMetrics()
        metrics.before(self.target, ids, n)
        stats = self.target.apply(step, ids, n, s)
        self.metrics = metrics.after(self.target, n, s)
        self.applied.append({"step": step, "ids": list(ids), "n": n, "s": s, "stats": stats,
                             "metrics": self.metrics})
        return self.metrics


def _state_path(target) -> str:
    state = getattr(target, "state", None)
    return str(state.path) if state is not None else "STATE"


def _step_number(batch) -> int:
    text = str(batch).strip()
    if not text.isdigit() or int(text) < 1:
        raise DataError(f"experiences of a training step carry batch id {batch!r}, not an explorer step number")
    return int(text)


# ---------------------------------------------------------------------------------------- the operator


def collect_outcomes(exps) -> dict:
    """``selector_metric`` of one explorer step's experiences: per taskset id, ``indices`` (task indices in
    order of first appearance), ``values`` (mean reward, as pass_rate_calculator gives), ``rewards`` (each
    task's rewards, one per experience) and ``step`` (the experiences' batch id: the explorer step).
    Experiences without a taskset index (evaluation) or without a reward are left out."""
    per: dict[int, dict[int, list[float]]] = {}
    batches: set[str] = set()
    for exp in exps:
        index = (getattr(exp, "info", None) or {}).get("task_index") or {}
        if "taskset_id" not in index or "index" not in index or getattr(exp, "reward", None) is None:
            continue
        batches.add(str(exp.eid.batch))
        per.setdefault(int(index["taskset_id"]), {}).setdefault(int(index["index"]), []).append(float(exp.reward))
    if len(batches) > 1:
        raise DataError(f"one pipeline call held experiences of several explorer steps ({', '.join(sorted(batches))}); "
                        "graphdiff applies one step at a time")
    step = _step_number(batches.pop()) if batches else None
    return {tid: {"indices": list(tasks), "values": [float(np.mean(r)) for r in tasks.values()],
                  "rewards": [list(r) for r in tasks.values()], "step": step}
            for tid, tasks in per.items()}


def _operator_class():
    try:
        from trinity.buffer.operators.experience_operator import ExperienceOperator
    except Exception as exc:  # noqa: BLE001 - one line naming what is missing
        raise BackendError(f"the {OPERATOR_NAME} operator needs Trinity-RFT's trinity.buffer.operators "
                           f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None

    class GraphdiffOutcomes(ExperienceOperator):
        """Trinity experience operator: puts each task's per-rollout rewards and the explorer step under
        ``selector_metric`` for graphdiff's selector (``collect_outcomes``); the experiences pass unchanged.
        Put it before any filter (``dapo_dynamic_sampling``, ``reward_std_filter``): filtered groups are
        outcomes too."""

        def __init__(self, **kwargs):
            if kwargs:
                raise InvalidArgumentError(f"the {OPERATOR_NAME} operator takes no args, got {', '.join(kwargs)}")

        def process(self, exps):
            return exps, {SELECTOR_METRIC: collect_outcomes(exps)}

    GraphdiffOutcomes.__module__ = __name__
    return GraphdiffOutcomes


_LAZY: dict = {}


def __getattr__(name):  # PEP 562: Trinity is imported only when its registry asks for the operator
    if name == "GraphdiffOutcomes":
        if name not in _LAZY:
            _LAZY[name] = _operator_class()
        return _LAZY[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register() -> None:
    """Register ``graphdiff`` (the selector) and ``graphdiff_outcomes`` (the operator) in Trinity's registries,
    in this process; a second call changes nothing."""
    try:
        from trinity.buffer.operators import EXPERIENCE_OPERATORS
        from trinity.buffer.selector import SELECTORS
    except Exception as exc:  # noqa: BLE001
        raise BackendError(f"Trinity-RFT cannot be imported ({type(exc).__name__}: "
                           f"{' '.join(str(exc).split())[:200]}); install trinity-rft to register graphdiff") from None
    if SELECTORS.modules.get(SELECTOR_NAME) is not GraphdiffSelector:
        SELECTORS.register_module(SELECTOR_NAME, GraphdiffSelector, force=True)
    operator = __getattr__("GraphdiffOutcomes")
    if EXPERIENCE_OPERATORS.modules.get(OPERATOR_NAME) is not operator:
        EXPERIENCE_OPERATORS.register_module(OPERATOR_NAME, operator, force=True)
