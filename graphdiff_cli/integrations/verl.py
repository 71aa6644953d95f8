"""graphdiff as a verl curriculum sampler (``data.sampler.class_path`` / ``class_name``).

verl (through 0.7.x) builds ``data.sampler.class_name`` from ``data.sampler.class_path`` as
``cls(data_source=train_dataset, data_config=config.data)``, asserts it is an ``AbstractSampler`` and
that ``data.dataloader_num_workers == 0``, and - because it is an ``AbstractCurriculumSampler`` - calls
``sampler.update(batch)`` after every training step with that step's ``DataProto``. This adapter:

* reads every dataset row's ``extra_info.index`` once, at start-up, as the row's prompt id, and refuses
  a row without one (verl silently substitutes 0, so such rows would all collide on id "0") and two
  rows with the same one;
* in ``__iter__`` yields, batch by batch, ``B = data.gen_batch_size or data.train_batch_size`` dataset
  rows chosen from a pool of ``pool_factor * B`` random rows by ``strategy``
  (``core.decisions.select``) from the current estimates. With ``num_workers = 0`` verl's
  ``StatefulDataLoader`` asks for batch t + 1 only after ``update`` of step t, so each choice sees
  every outcome so far;
* in ``update(batch)`` counts, per prompt, the step's rollouts and successes - the prompt id is
  ``batch.non_tensor_batch["index"]`` (one entry per rollout; never ``"uid"``, a fresh uuid per step),
  the reward ``batch.batch["token_level_scores"].sum(-1)`` (the reward function's score, before any KL
  penalty), success = reward >= ``success_threshold`` (unset: rewards must be 0/1, others are refused) - and applies them as exactly one step to the
  estimator.

Settings go under ``data.sampler`` next to class_path/class_name (``+data.sampler.state=...`` on the
Hydra command line; see examples/verl/): ``state`` (a STATE directory from ``graphdiff init``;
environment fallback ``GRAPHDIFF_STATE``), ``strategy`` (target), ``pool_factor`` (4), ``seed`` (0),
``target`` (0.5), ``success_threshold`` (unset: 0/1 rewards only; e.g. 1.0 for DAPO's -1/1), ``group_size`` (= actor_rollout_ref.rollout.n, for
p_zero_variance; 8), ``outcomes_dir`` (next to the STATE).

verl 0.8 removed the ``data.sampler.class_path`` hook and the ``update`` call. For verl's v1 trainer (the
default from 0.9, ``trainer.use_v1: true``) ``integrations.verl_v1`` registers a trainer that builds this
sampler itself and feeds it each step's outcomes (``apply``, ``outcomes_from_fields``); its settings
then live under a top-level ``graphdiff:`` section.
"""

from __future__ import annotations

import os
from collections import deque

import numpy as np

from ..core import decisions as dec
from ..core.beta import DEFAULT_GROUP_SIZE
from ..errors import BackendError, DataError, InvalidArgumentError, StateError
from ..io.outcomes import check_threshold
from .ids import row_prompt_ids, verl_id
from .options import Option, as_flag, as_float, as_int, get, read_options
from .tracking import METRIC_PREFIX, BatchChooser, StepMetrics, count_outcomes, open_target, resume_mismatch

try:  # the class verl checks with isinstance; without verl (or with verl >= 0.8) a plain torch Sampler
    from verl.experimental.dataset.sampler import AbstractCurriculumSampler as _Base

    VERL_HOOK, VERL_IMPORT_ERROR = True, None
except Exception as _exc:  # noqa: BLE001 - reported by the sampler below when it matters
    from torch.utils.data import Sampler as _Base

    VERL_HOOK = False
    # verl absent, or a verl without the 0.7 hook (0.8+): a plain sampler is right. verl present but failing
    # to import (a missing ray, a broken torch): kept, and raised in one line when the sampler is built,
    # instead of a silent fallback that verl's own isinstance check would then reject with no cause.
    _absent = isinstance(_exc, ModuleNotFoundError) and (_exc.name or "").split(".")[0] == "verl" and (
        _exc.name == "verl" or _exc.name.startswith("verl.experimental"))
    VERL_IMPORT_ERROR = None if _absent else f"{type(_exc).__name__}: {' '.join(str(_exc).split())[:200]}"

# the sampler's options (data.sampler.<name>, or +graphdiff.<name> for verl v1), read by options.read_options
OPTIONS = {"state": Option(env="GRAPHDIFF_STATE"), "strategy": Option("target"), "pool_factor": Option(4.0, as_float),
           "seed": Option(0, as_int), "target": Option(0.5, as_float), "explore": Option(dec.TARGET_EXPLORE, as_float),
           "success_threshold": Option(None, check_threshold),
           "group_size": Option(DEFAULT_GROUP_SIZE, as_int),
           "outcomes_dir": Option(),
           # verl 0.9 v1 only: the per-dispatch choice (dynamic sampling refills, __rollout_n__ allocation)
           "prefilter": Option(True, as_flag), "prefilter_min_keep": Option(dec.GRESO_MIN_KEEP, as_float),
           "allocate": Option(), "allocate_min": Option(2, as_int), "allocate_max": Option(32, as_int)}


def check_v1_config(config) -> None:
    """verl v1 (``integrations.verl_v1``): refuse the settings under which graphdiff could not choose what is
    generated or could not apply every generated group in the step that generated it."""
    data = get(config, "data")
    if int(get(data, "dataloader_num_workers", 8)) != 0:
        raise InvalidArgumentError("trainer.v1.trainer_mode=graphdiff needs data.dataloader_num_workers=0: worker "
                                   "processes read batches ahead, before the previous step's outcomes are applied")
    sampler = get(get(get(config, "trainer"), "v1"), "sampler")
    custom = get(sampler, "custom_sampler")
    if get(custom, "path") or get(custom, "name"):
        raise InvalidArgumentError("trainer.v1.trainer_mode=graphdiff provides verl's replay buffer itself; remove "
                                   "trainer.v1.sampler.custom_sampler")
    allocate = get(get(config, "graphdiff"), "allocate")
    if allocate is not None:
        dec.check_strategy(allocate, dec.ALLOCATE_STRATEGIES, "allocation")


def dynamic_sampling(config) -> bool:
    """Whether verl refills prompts one by one (``algorithm.filter_groups.enable`` or
    ``trainer.v1.sampler.sync_refill_failed_groups``): then every dispatch is chosen when verl asks for it."""
    groups = get(get(config, "algorithm"), "filter_groups")
    sampler = get(get(get(config, "trainer"), "v1"), "sampler")
    return bool(get(groups, "enable", False)) or bool(get(sampler, "sync_refill_failed_groups", False))


def data_source_ids(data_source) -> list[str]:
    """Each dataset row's ``extra_info.index`` as a string (``ids.verl_id``); missing or repeated indexes refused."""
    frame = getattr(data_source, "dataframe", data_source)
    try:
        extra = frame["extra_info"]
    except (KeyError, TypeError, IndexError):
        raise DataError("the verl data set has no extra_info column: graphdiff needs extra_info.index on every "
                        "row as a stable prompt id (verl would silently use 0)") from None
    return row_prompt_ids((info.get("index") if isinstance(info, dict) else None for info in extra), verl_id,
                          rows="data set", field="extra_info.index", shared="extra_info.index {id}",
                          missing="verl would silently use 0 and every such row would share one id - add a unique "
                                  "index to every row")


def outcomes_from_fields(index, scores, tags=None, success_threshold: float | None = None) -> tuple[list[str], np.ndarray,
                                                                                           np.ndarray]:
    """(prompt ids, n, s) from the v1 trainer's per-trajectory fields: ``index`` (each row's
    extra_info.index), ``scores`` (``rm_scores``: per-token, the score on the last token; summed per row,
    as verl does) and ``tags`` (rows tagged ``is_padding`` are verl's padding, not rollouts)."""
    index = list(index)
    if hasattr(scores, "sum") and hasattr(scores, "detach"):
        rewards = scores.sum(dim=1).detach().float().cpu().numpy().tolist()
    else:
        rewards = [float(r.sum()) if hasattr(r, "sum") else float(np.sum(r)) for r in scores]  # tensors or arrays
    if len(index) != len(rewards):
        raise DataError(f"{len(index)} prompt indexes for {len(rewards)} rollouts in the batch")
    keep = [not (t or {}).get("is_padding", False) for t in tags] if tags is not None else [True] * len(index)
    if len(keep) != len(index):
        raise DataError(f"{len(keep)} tags for {len(index)} rollouts in the batch")
    rows = [(0, _plain_id(i), float(r)) for i, r, k in zip(index, rewards, keep) if k]
    return count_outcomes(rows, success_threshold)


def _plain_id(value) -> str:
    """str() of an index as the data set holds it (a numpy scalar or 0-d array prints as its value)."""
    return str(value.item() if hasattr(value, "item") and getattr(value, "ndim", 0) == 0 else value)


def outcomes_from_batch(batch, success_threshold: float | None = None) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(prompt ids, n, s) of one step's ``DataProto``: ids from non_tensor_batch["index"] (not "uid"), rewards
    from ``token_level_scores`` (as ``outcomes_from_fields`` reads the v1 trainer's fields)."""
    ntb = batch.non_tensor_batch
    if "index" not in ntb:
        raise DataError("the batch has no non_tensor_batch['index'] (from extra_info.index); graphdiff does not "
                        "use 'uid', which verl draws afresh every step")
    return outcomes_from_fields(ntb["index"], batch.batch["token_level_scores"], None, success_threshold)


class GraphdiffCurriculumSampler(_Base):
    """verl curriculum sampler driven by a graphdiff STATE directory (or an in-memory target)."""

    def __init__(self, data_source, data_config, target=None, *, options=None, batch_size: int | None = None):
        if VERL_IMPORT_ERROR:
            raise BackendError(f"verl is installed but cannot be imported ({VERL_IMPORT_ERROR}); fix the training "
                               "environment (pip check) before graphdiff can hook into it")
        sampler_cfg = get(data_config, "sampler") if options is None else options
        prefix = "data.sampler." if options is None else "+graphdiff."
        opts = read_options(OPTIONS, sampler_cfg, lambda name: prefix + name)
        if target is None:
            state = opts["state"]
            if not state:
                key = "data.sampler.state" if options is None else "+graphdiff.state"
                raise InvalidArgumentError(f"set {key} (or GRAPHDIFF_STATE) to a STATE directory made with "
                                           "graphdiff init")
            target = state
        kwargs = {"outcomes_dir": opts["outcomes_dir"]} if isinstance(target, (str, os.PathLike)) else {}
        self.target = open_target(target, **kwargs)
        self.success_threshold = opts["success_threshold"]  # None: 0/1 rewards only
        self.batch_size = int(batch_size or get(data_config, "gen_batch_size") or get(data_config, "train_batch_size"))
        self.data_source = data_source
        self.row_ids = data_source_ids(data_source)
        self.chooser = BatchChooser(self.target, self.target.nodes(self.row_ids, "extra_info.index"),
                                    self.batch_size, strategy=opts["strategy"],
                                    pool_factor=opts["pool_factor"], seed=opts["seed"],
                                    target_p=opts["target"], group_size=opts["group_size"], explore=opts["explore"])
        self.options = opts
        self.planned: deque | None = None  # per-dispatch mode (verl v1): rows queued by DispatchChooser
        self.epoch = 0
        self._pos: dict | None = None
        self._resume: dict | None = None
        self._awaiting = False  # a batch was handed out whose outcomes are not applied yet
        self.applied: list[dict] = []
        self.metrics: dict[str, float] = {}  # the last step's graphdiff/... scalars (tracking.StepMetrics)

    def __iter__(self):
        if self.planned is not None:
            return self._iter_planned()
        return self._iter_blocks()

    def _iter_planned(self):
        while True:
            if not self.planned:
                raise StateError("verl read a prompt that graphdiff had not chosen (a dispatch that did not go "
                                 "through the graphdiff trainer's _next_train_batch)")
            yield int(self.planned.popleft())

    def _iter_blocks(self):
        resume, self._resume = self._resume, None
        epoch = int(resume["epoch"]) if resume else self.epoch
        first, row, block = (int(resume["batch"]), int(resume["row"]), resume["block"]) if resume else (0, 0, None)
        self.epoch = epoch + 1
        for k in range(first, len(self.row_ids) // self.batch_size):
            resumed = k == first and block is not None
            chosen = list(block) if resumed else self.chooser.choose(epoch, k).tolist()
            for j in range(row if resumed else 0, len(chosen)):
                self._pos = {"epoch": epoch, "batch": k, "row": j + 1, "block": chosen}
                self._awaiting = True
                yield int(chosen[j])
        self._pos = {"epoch": epoch + 1, "batch": 0, "row": 0, "block": None}

    def state_dict(self) -> dict:
        """Where the next index comes from (epoch, batch, row within the chosen block, the block itself):
        a checkpointing data loader (verl's StatefulDataLoader) saves it, and a resumed run continues there
        with the same choice instead of re-choosing every batch it skips. ``estimator_step`` is the STATE
        step the resumed run must find: the step at the save, + 1 when a batch had been handed out whose
        outcomes were not applied yet (verl <= 0.7 saves its checkpoint before ``update`` of that step)."""
        if self.planned is not None:  # each dispatch is chosen from (seed, step, dispatch): nothing to resume
            return {"planned": True}
        expected = int(self.target.step) + int(self._awaiting)
        if not self._pos:
            return {"epoch": self.epoch, "batch": 0, "row": 0, "block": None, "estimator_step": expected}
        return {**self._pos, "block": None if self._pos["block"] is None else list(self._pos["block"]),
                "estimator_step": expected}

    def load_state_dict(self, state: dict) -> None:
        if self.planned is not None or state.get("planned"):
            return
        want = state.get("estimator_step")  # absent in a checkpoint written before graphdiff recorded it
        if want is not None and int(want) != self.target.step:
            raise StateError(resume_mismatch(self.target.step, int(want), "verl's checkpoint"))
        self._resume = dict(state)
        self.epoch = int(state["epoch"])

    def __len__(self) -> int:
        return (len(self.row_ids) // self.batch_size) * self.batch_size

    def update(self, batch) -> None:
        """Apply one training step's outcomes (called by verl <= 0.7 after every step)."""
        self.apply(*outcomes_from_batch(batch, self.success_threshold))

    def apply(self, ids: list[str], n: np.ndarray, s: np.ndarray) -> dict[str, float]:
        """Apply one training step's per-prompt outcomes as the estimator's next step; returns (and keeps
        in ``metrics``) the step's ``graphdiff/...`` scalars for the trainer's logger."""
        step = self.target.step + 1
        metrics = StepMetrics()
        metrics.before(self.target, ids, n)
        stats = self.target.apply(step, ids, n, s)
        self._awaiting = False
        self.metrics = metrics.after(self.target, n, s)
        self.applied.append({"step": step, "ids": ids, "n": n, "s": s, "stats": stats, "metrics": self.metrics})
        return self.metrics


# ---------------------------------------------------------------------------------- verl 0.9: per dispatch


class DispatchChooser:
    """What each verl v1 dispatch rolls out, chosen when verl asks for it (the first batch of a step and every
    refill of dynamic sampling), and how many rollouts each prompt gets.

    ``choose(k, step)``: a pool of ``pool_factor`` x k rows drawn at random from the rows neither retired nor
    already dispatched in this step (each prompt at most once per step, so a step's groups are distinct);
    with ``prefilter`` each pool member is skipped before generation with probability
    min(p_zero_variance, 1 - ``prefilter_min_keep``) (``core.decisions.prefilter_zero_variance``: GRESO's
    rule on the calibrated probability); the k are chosen from the survivors by ``strategy`` (when fewer
    than k survive, the skipped ones with the lowest p_zero_variance are generated after all). With
    ``allocate`` the dispatch's budget k x ``rollout_n`` is split by ``core.decisions.allocate`` within
    [``allocate_min``, ``allocate_max``] and kept in ``rollout_n`` (prompt id -> count) for verl's
    per-sample ``__rollout_n__``. Every draw is seeded by (seed, step, dispatch number in the step).
    """

    def __init__(self, sampler: GraphdiffCurriculumSampler, rollout_n: int):
        opts = sampler.options
        self.sampler, self.target, self.chooser = sampler, sampler.target, sampler.chooser
        self.rollout_n_default = dec.check_int(rollout_n, "actor_rollout_ref.rollout.n", 1)
        self.prefilter = opts["prefilter"]
        self.min_keep = opts["prefilter_min_keep"]
        self.allocate = opts["allocate"]
        if self.allocate is not None:
            dec.check_strategy(self.allocate, dec.ALLOCATE_STRATEGIES, "allocation")
            dec.check_budget(1, self.rollout_n_default, opts["allocate_min"], opts["allocate_max"])
        self.allocate_min, self.allocate_max = opts["allocate_min"], opts["allocate_max"]
        self.rollout_n: dict[str, int] = {}
        self.dispatches: list[dict] = []  # every dispatch: step, rows, skipped rows, counts
        self._step: int | None = None
        self._taken: set[int] = set()

    def _reset(self, step: int) -> None:
        if step != self._step:
            self._step, self._taken = step, set()

    def choose(self, k: int, step: int) -> np.ndarray:
        k = dec.check_int(k, "prompts to dispatch", 1)
        self._reset(step)
        c = self.chooser
        rng = np.random.default_rng([c.seed, step, len([d for d in self.dispatches if d["step"] == step])])
        retired = self.target.retired()
        free = np.ones(c.row_nodes.size, bool)
        if retired.size:
            free &= ~np.isin(c.row_nodes, retired)
        free[list(self._taken)] = False
        rows = np.flatnonzero(free)
        if rows.size < k:
            raise InvalidArgumentError(f"verl asked for {k} more prompts in step {step} but only {rows.size} of the "
                                       "data set are neither retired nor already generated in this step")
        m = min(rows.size, max(k, int(round(c.pool_factor * k))))
        pool = rows[rng.choice(rows.size, size=m, replace=False)]
        est = self.target.estimates(c.row_nodes[pool], c.group_size)
        keep = (dec.prefilter_zero_variance(est["p_zero_variance"], self.min_keep, rng) if self.prefilter
                else np.ones(m, bool))
        if keep.sum() < k:  # too few survive: generate the least likely all-equal of the skipped after all
            back = np.flatnonzero(~keep)
            keep[back[np.argsort(est["p_zero_variance"][back], kind="stable")][: k - int(keep.sum())]] = True
        alive = np.flatnonzero(keep)
        sel = dec.select(c.strategy, k, p=est["mean"][alive], variance=est["variance"][alive],
                         p_zero_variance=est["p_zero_variance"][alive], target=c.target_p, explore=c.explore,
                         seed=rng)
        picked = alive[sel.chosen]
        chosen = pool[picked]
        counts = None
        if self.allocate is not None:
            counts = dec.allocate(self.allocate, est["mean"][picked], k * self.rollout_n_default,
                                  self.allocate_min, self.allocate_max)
            ids = self.sampler.row_ids
            self.rollout_n.update({ids[r]: int(n) for r, n in zip(chosen, counts)})
        self._taken.update(int(r) for r in chosen)
        self.dispatches.append({"step": step, "estimator_step": self.target.step, "pool": pool, "chosen": chosen,
                                "skipped": pool[~keep], "rollout_n": counts})
        return chosen

    def rollout_counts(self, prompt_ids) -> np.ndarray:
        """Each row's ``__rollout_n__`` (the allocation, or rollout.n without one)."""
        return np.array([self.rollout_n.get(_plain_id(i), self.rollout_n_default) for i in prompt_ids], dtype=object)

    def step_counts(self, step: int) -> dict[str, float]:
        """The step's dispatches: prompts dispatched, skipped before generation, rollouts asked for."""
        mine = [d for d in self.dispatches if d["step"] == step]
        return {"dispatches": float(len(mine)),
                "prompts_dispatched": float(sum(d["chosen"].size for d in mine)),
                "skipped": float(sum(d["skipped"].size for d in mine)),
                "rollouts_planned": float(sum(int(np.sum(d["rollout_n"])) if d["rollout_n"] is not None
                                              else d["chosen"].size * self.rollout_n_default for d in mine))}


class GeneratedGroupsMixin:
    """Mixed into verl's ReplayBuffer (``verl_v1.GraphdiffReplayBuffer``): before the buffer clears training
    groups that will not be trained on - evicted (DAPO zero-variance, stale, failed) or discarded as surplus
    once the batch is full - their outcomes are read and kept in ``graphdiff_cleared`` until the step applies
    them. Needs ``graphdiff_kv_get(keys=, partition_id=, select_fields=)`` (TransferQueue's kv_batch_get)."""

    _graphdiff_reason = "discarded"

    def graphdiff_take(self) -> list[dict]:
        out, self.graphdiff_cleared = list(getattr(self, "graphdiff_cleared", [])), []
        return out

    def _evict_terminal_groups(self, global_steps, partition_id, eviction_reasons):
        self._graphdiff_reason = "evicted"
        try:
            return super()._evict_terminal_groups(global_steps, partition_id, eviction_reasons)
        finally:
            self._graphdiff_reason = "discarded"

    def _clear_groups(self, partition_id, uids):
        if partition_id == "train" and uids:
            keys = [key for key in self.partitions[partition_id] if key.split("_")[0] in uids]
            entry = {"reason": self._graphdiff_reason, "groups": len({key.split("_")[0] for key in keys}),
                     "cleared": len(uids), "index": [], "scores": [], "tags": []}
            if keys:
                data = self.graphdiff_kv_get(keys=keys, partition_id=partition_id, select_fields=["index", "rm_scores"])
                entry.update(index=list(data["index"]), scores=list(data["rm_scores"]),
                             tags=[self.partitions[partition_id][key] for key in keys])
            self.graphdiff_cleared = [*getattr(self, "graphdiff_cleared", []), entry]
        return super()._clear_groups(partition_id, uids)


def merge_outcomes(parts) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(ids, n, s) parts -> one (ids, n, s), a prompt in several parts summed (first appearance order)."""
    order: dict[str, int] = {}
    n: list[int] = []
    s: list[int] = []
    for ids, pn, ps in parts:
        for pid, a, b in zip(ids, pn, ps):
            j = order.setdefault(pid, len(order))
            if j == len(n):
                n.append(0)
                s.append(0)
            n[j] += int(a)
            s[j] += int(b)
    return list(order), np.asarray(n, np.int64), np.asarray(s, np.int64)


def apply_generated(sampler: GraphdiffCurriculumSampler, trained: tuple, cleared: list[dict],
                    counts: dict[str, float] | None = None) -> dict[str, float]:
    """Apply one verl step's every generated group - the trained batch ``trained`` (ids, n, s) and the
    groups the replay buffer cleared (``GeneratedGroupsMixin``) - as exactly one STATE step; returns its
    ``graphdiff/...`` scalars with the step's group counts (generated, trained, evicted, discarded) and
    the dispatch counts ``counts`` (``DispatchChooser.step_counts``: skipped before generation, ...)."""
    parts = [trained]
    for e in cleared:
        parts.append(outcomes_from_fields(e["index"], e["scores"], e["tags"], sampler.success_threshold))
    ids, n, s = merge_outcomes(parts)
    metrics = dict(sampler.apply(ids, n, s))
    groups = {"groups_trained": float(len(trained[0])),
              "groups_evicted": float(sum(e["groups"] for e in cleared if e["reason"] == "evicted")),
              "groups_discarded": float(sum(e["groups"] for e in cleared if e["reason"] == "discarded")),
              "rollouts": float(n.sum())}
    groups["groups_generated"] = groups["groups_trained"] + groups["groups_evicted"] + groups["groups_discarded"]
    groups.update(counts or {})
    metrics.update({METRIC_PREFIX + k: v for k, v in groups.items()})
    sampler.metrics = metrics
    sampler.applied[-1]["metrics"] = metrics
    return metrics
