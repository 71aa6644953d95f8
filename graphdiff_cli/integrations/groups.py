"""What the trainers that hand graphdiff one finished group at a time share (prime-rl, AReaL, slime, SkyRL, NeMo-RL).

These trainers do not call back once per training step with the step's whole batch (verl <= 0.7's ``update``,
Trinity's ``feedback``); they hand over groups - one prompt's rollouts with their rewards - as generation
finishes them, dropped or trained. Each adapter maps its trainer's objects to (prompt id, rewards) and leaves
the rest here:

* ``OPTIONS`` / ``group_options`` - the options every such adapter reads (``options.read_options``), each with
  a ``GRAPHDIFF_<NAME>`` environment fallback for trainers that pass no settings to a plugin (slime);
* ``GroupSteps`` - the groups of one trainer step, each checked as it arrives (an unknown prompt id, a reward
  the rule of success refuses), applied to the STATE as exactly one step (``tracking.count_outcomes``, the rule
  of ``graphdiff update``; ``tracking.StepMetrics`` for the ``graphdiff/...`` scalars), with the pending groups
  and the STATE step in its ``state_dict`` so that a resumed run neither loses nor repeats a step;
* ``ChosenRows`` - dataset rows handed out one at a time, chosen a block at a time from the current estimates
  (``tracking.BatchChooser``: a pool of ``pool_factor`` x block random rows, ``strategy`` keeps the block);
  ``row_sampler`` gives the same as a torch ``Sampler`` for trainers that build a ``DataLoader``;
* ``row_ids`` - each dataset row's prompt id from its ``id_field`` (a dotted path reads nested fields), by the
  ``str()`` rule of ``ids.trinity_id``; a row without one and two rows with the same one refused.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ..core import decisions as dec
from ..core.beta import DEFAULT_GROUP_SIZE
from ..errors import DataError, InvalidArgumentError, StateError
from ..io.outcomes import check_threshold
from ..io.tables import field_value
from .dynamic_sampling import has_signal
from .ids import row_prompt_ids, trinity_id
from .options import Option, as_flag, as_float, as_int, read_options
from .tracking import BatchChooser, StepMetrics, count_outcomes, open_target, resume_mismatch


def _opt(default=None, kind=None, name: str = "") -> Option:
    return Option(default, kind, "GRAPHDIFF_" + name.upper())


OPTIONS = {name: _opt(default, kind, name) for name, default, kind in (
    ("state", None, None), ("id_field", "id", None), ("strategy", "target", None), ("pool_factor", 4.0, as_float),
    ("seed", 0, as_int), ("target", 0.5, as_float), ("explore", dec.TARGET_EXPLORE, as_float),
    ("success_threshold", None, check_threshold), ("group_size", DEFAULT_GROUP_SIZE, as_int),
    ("groups_per_step", None, as_int), ("filter", True, as_flag), ("outcomes_dir", None, None))}


def group_options(config=None, where=lambda name: name, *, environ=None, need_state: bool = True) -> dict:
    """The adapter options from ``config`` (a mapping or a config object; missing keys from ``GRAPHDIFF_<NAME>``),
    checked: unknown keys of a mapping refused, ``strategy``, ``target``, ``explore``, ``pool_factor``, the
    counts, and ``state`` when ``need_state``."""
    if isinstance(config, dict):
        unknown = sorted(set(config) - set(OPTIONS))
        if unknown:
            raise InvalidArgumentError(f"unknown {where(unknown[0])} (known: {', '.join(OPTIONS)})")
    opts = read_options(OPTIONS, config, where, environ=environ)
    if need_state and not opts["state"]:
        raise InvalidArgumentError(f"set {where('state')} (or GRAPHDIFF_STATE) to a STATE directory made with "
                                   "graphdiff init")
    dec.check_strategy(opts["strategy"], dec.SELECT_STRATEGIES, "selection")
    opts["target"], opts["explore"] = dec.check_target(opts["target"]), dec.check_explore(opts["explore"])
    if not opts["pool_factor"] >= 1:
        raise InvalidArgumentError(f"{where('pool_factor')} must be >= 1, got {opts['pool_factor']!r}")
    opts["group_size"] = dec.check_int(opts["group_size"], where("group_size"), 1)
    if opts["groups_per_step"] is not None:
        opts["groups_per_step"] = dec.check_int(opts["groups_per_step"], where("groups_per_step"), 1)
    return opts


def open_state(opts: dict, target=None):
    """The ``tracking.Target`` the adapter feeds: ``target`` (an Estimator/Target, tests) or ``opts["state"]``."""
    if target is not None:
        return open_target(target)
    return open_target(opts["state"], outcomes_dir=opts["outcomes_dir"])


def row_ids(rows, id_field: str = "id", *, where: str = "data set") -> list[str]:
    """Each row's prompt id (``str()`` of its ``id_field``; a dotted path reads nested fields)."""
    values = [field_value(row, id_field)[1] if isinstance(row, dict) else getattr(row, id_field, None)
              for row in rows]
    ids = row_prompt_ids(values, trinity_id, rows=where, field=repr(id_field), shared=f"the id {{id}} ({id_field})",
                         missing="every prompt needs a stable id (the id_field option names the field)")
    if not ids:
        raise DataError(f"the {where} has no rows")
    return ids


class GroupSteps:
    """Finished groups in, one STATE step per trainer step out (see the module docstring).

    ``groups_per_step``: apply a step by itself once that many groups are in (for trainers with no step-end hook
    the adapter can see); None: the adapter calls ``apply`` at the trainer's step end."""

    def __init__(self, target, *, success_threshold: float | None = None, groups_per_step: int | None = None):
        self.target = target
        self.success_threshold = check_threshold(success_threshold)
        self.groups_per_step = groups_per_step
        self.rows: list[tuple[int, str, float]] = []
        self.groups = 0
        self.dropped = 0  # groups the adapter's filter refused (their outcomes are applied all the same)
        self.applied: list[dict] = []
        self.metrics: dict[str, float] = {}  # the last step's graphdiff/... scalars

    def add(self, pid: str, rewards) -> bool:
        """Record one finished group of prompt ``pid``; returns whether it has a GRPO signal (0 < s < n).
        An unknown id and a reward the rule of success refuses stop here, in one line, before anything is kept."""
        self.target.nodes([pid], "the group's prompt id")
        rows = [(0, pid, float(r)) for r in rewards if r is not None]
        if self.success_threshold is None:
            count_outcomes(rows, None)  # refuses a reward other than 0/1, naming the prompt
        self.rows.extend(rows)
        self.groups += 1
        signal = has_signal([r for _, _, r in rows], self.success_threshold)
        self.dropped += not signal
        if self.groups_per_step is not None and self.groups >= self.groups_per_step:
            self.apply()
        return signal

    def apply(self, step: int | None = None) -> dict[str, float]:
        """Every group recorded since the last step, as exactly one STATE step (``step``; None: the next one)."""
        ids, n, s = count_outcomes(self.rows, self.success_threshold)
        step = self.target.step + 1 if step is None else int(step)
        metrics = StepMetrics()
        metrics.before(self.target, ids, n)
        stats = self.target.apply(step, ids, n, s)
        self.metrics = metrics.after(self.target, n, s)
        self.metrics["graphdiff/groups"] = float(self.groups)
        self.metrics["graphdiff/groups_without_signal"] = float(self.dropped)
        self.applied.append({"step": step, "ids": ids, "n": n, "s": s, "stats": stats, "metrics": self.metrics})
        self.rows, self.groups, self.dropped = [], 0, 0
        return self.metrics

    def state_dict(self) -> dict:
        return {"graphdiff_step": int(self.target.step), "pending": [[pid, r] for _, pid, r in self.rows],
                "groups": self.groups, "dropped": self.dropped}

    def load_state_dict(self, state: dict, who: str) -> None:
        """Resume: the STATE must be at the saved step (``who``: the trainer's checkpoint, for the message)."""
        want = int(state["graphdiff_step"])
        if want != self.target.step:
            raise StateError(resume_mismatch(self.target.step, want, who))
        self.rows = [(0, str(pid), float(r)) for pid, r in state.get("pending", [])]
        self.groups, self.dropped = int(state.get("groups", 0)), int(state.get("dropped", 0))


class ChosenRows:
    """Dataset rows handed out one at a time; each block of ``block`` rows is chosen when the last is used up,
    from the estimates as they are then (``tracking.BatchChooser`` with the options' rule)."""

    def __init__(self, target, ids: list[str], block: int, opts: dict, where: str = "data set ids"):
        self.chooser = BatchChooser(target, target.nodes(ids, where), block, strategy=opts["strategy"],
                                    pool_factor=opts["pool_factor"], seed=opts["seed"], target_p=opts["target"],
                                    group_size=opts["group_size"], explore=opts["explore"])
        self.blocks = 0
        self.queue: deque[int] = deque()

    def next(self) -> int:
        if not self.queue:
            self.queue.extend(int(r) for r in self.chooser.choose(0, self.blocks))
            self.blocks += 1
        return self.queue.popleft()

    def state_dict(self) -> dict:
        return {"blocks": self.blocks, "queue": list(self.queue)}

    def load_state_dict(self, state: dict) -> None:
        self.blocks, self.queue = int(state.get("blocks", 0)), deque(int(r) for r in state.get("queue", []))


def _sampler_base():
    from torch.utils.data import Sampler

    return Sampler


def row_sampler(rows: ChosenRows, length: int):
    """A torch ``Sampler`` that yields ``length`` rows per epoch from ``rows`` (chosen as they are asked for), with
    ``state_dict``/``load_state_dict`` for a ``StatefulDataLoader``. Only for a data loader with no worker
    processes: workers read ahead, before the outcomes the next choice should see."""

    class GraphdiffRowSampler(_sampler_base()):
        def __iter__(self):
            for _ in range(length):
                yield rows.next()

        def __len__(self):
            return length

        def state_dict(self):
            return rows.state_dict()

        def load_state_dict(self, state):
            rows.load_state_dict(state)

    return GraphdiffRowSampler()


def as_array(values) -> np.ndarray:
    """A reward tensor, array or list as a flat float array (torch tensors moved to the CPU)."""
    if hasattr(values, "detach"):
        values = values.detach().float().cpu().numpy()
    return np.asarray(values, dtype=np.float64).reshape(-1)
