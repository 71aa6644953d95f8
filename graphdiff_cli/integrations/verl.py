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

import numpy as np

from ..core import decisions as dec
from ..errors import BackendError, DataError, InvalidArgumentError
from ..io.outcomes import check_threshold
from .tracking import BatchChooser, StepMetrics, count_outcomes, open_target

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

DEFAULTS = {"state": None, "strategy": "target", "pool_factor": 4.0, "seed": 0, "target": 0.5,
            "explore": dec.TARGET_EXPLORE,
            "success_threshold": None, "group_size": 8, "outcomes_dir": None}


def _get(cfg, key, default=None):
    if cfg is None:
        return default
    try:
        value = cfg.get(key, default)
    except AttributeError:
        value = getattr(cfg, key, default)
    return default if value is None else value


def check_v1_config(config) -> None:
    """verl v1 (``integrations.verl_v1``): refuse the settings under which the chosen batches would not be
    the ones trained on next."""
    data = _get(config, "data")
    if int(_get(data, "dataloader_num_workers", 8)) != 0:
        raise InvalidArgumentError("trainer.v1.trainer_mode=graphdiff needs data.dataloader_num_workers=0: worker "
                                   "processes read batches ahead, before the previous step's outcomes are applied")
    groups = _get(_get(config, "algorithm"), "filter_groups")
    if _get(groups, "enable", False):
        raise InvalidArgumentError("trainer.v1.trainer_mode=graphdiff does not support algorithm.filter_groups "
                                   "(DAPO refill): a step then consumes a varying number of prompts")
    if _get(_get(_get(_get(config, "trainer"), "v1"), "sampler"), "sync_refill_failed_groups", False):
        raise InvalidArgumentError("trainer.v1.trainer_mode=graphdiff does not support "
                                   "trainer.v1.sampler.sync_refill_failed_groups")


def row_prompt_ids(data_source) -> list[str]:
    """Each dataset row's ``extra_info.index`` as a string; missing or repeated indexes refused."""
    frame = getattr(data_source, "dataframe", data_source)
    try:
        extra = frame["extra_info"]
    except (KeyError, TypeError, IndexError):
        raise DataError("the verl data set has no extra_info column: graphdiff needs extra_info.index on every "
                        "row as a stable prompt id (verl would silently use 0)") from None
    ids: list[str] = []
    first: dict[str, int] = {}
    for r, info in enumerate(extra):
        index = info.get("index") if isinstance(info, dict) else None
        if index is None:
            raise DataError(f"data set row {r} has no extra_info.index; verl would silently use 0 and every such "
                            "row would share one id - add a unique index to every row")
        pid = str(index)
        if pid in first:
            raise DataError(f"data set rows {first[pid]} and {r} share extra_info.index {pid!r}; ids must be unique")
        first[pid] = r
        ids.append(pid)
    return ids


def outcomes_from_fields(index, scores, tags=None, success_threshold: float | None = None) -> tuple[list[str], np.ndarray,
                                                                                           np.ndarray]:
    """(prompt ids, n, s) from the v1 trainer's per-trajectory fields: ``index`` (each row's
    extra_info.index), ``scores`` (``rm_scores``: per-token, the score on the last token; summed per row,
    as verl does) and ``tags`` (rows tagged ``is_padding`` are verl's padding, not rollouts)."""
    index = list(index)
    if hasattr(scores, "sum") and hasattr(scores, "detach"):
        rewards = scores.sum(dim=1).detach().float().cpu().numpy().tolist()
    else:
        rewards = [float(np.sum(r)) for r in scores]
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
        sampler_cfg = _get(data_config, "sampler") if options is None else options
        opts = {k: _get(sampler_cfg, k, v) for k, v in DEFAULTS.items()}
        if target is None:
            state = opts["state"] or os.environ.get("GRAPHDIFF_STATE")
            if not state:
                key = "data.sampler.state" if options is None else "+graphdiff.state"
                raise InvalidArgumentError(f"set {key} (or GRAPHDIFF_STATE) to a STATE directory made with "
                                           "graphdiff init")
            target = state
        kwargs = {"outcomes_dir": opts["outcomes_dir"]} if isinstance(target, (str, os.PathLike)) else {}
        self.target = open_target(target, **kwargs)
        self.success_threshold = check_threshold(opts["success_threshold"])  # None: 0/1 rewards only
        self.batch_size = int(batch_size or _get(data_config, "gen_batch_size") or _get(data_config, "train_batch_size"))
        self.data_source = data_source
        self.row_ids = row_prompt_ids(data_source)
        self.chooser = BatchChooser(self.target, self.target.nodes(self.row_ids, "extra_info.index"),
                                    self.batch_size, strategy=opts["strategy"],
                                    pool_factor=float(opts["pool_factor"]), seed=int(opts["seed"]),
                                    target_p=float(opts["target"]), group_size=int(opts["group_size"]),
                                    explore=float(opts["explore"]))
        self.epoch = 0
        self._pos: dict | None = None
        self._resume: dict | None = None
        self.applied: list[dict] = []
        self.metrics: dict[str, float] = {}  # the last step's graphdiff/... scalars (tracking.StepMetrics)

    def __iter__(self):
        resume, self._resume = self._resume, None
        epoch = int(resume["epoch"]) if resume else self.epoch
        first, row, block = (int(resume["batch"]), int(resume["row"]), resume["block"]) if resume else (0, 0, None)
        self.epoch = epoch + 1
        for k in range(first, len(self.row_ids) // self.batch_size):
            resumed = k == first and block is not None
            chosen = list(block) if resumed else self.chooser.choose(epoch, k).tolist()
            for j in range(row if resumed else 0, len(chosen)):
                self._pos = {"epoch": epoch, "batch": k, "row": j + 1, "block": chosen}
                yield int(chosen[j])
        self._pos = {"epoch": epoch + 1, "batch": 0, "row": 0, "block": None}

    def state_dict(self) -> dict:
        """Where the next index comes from (epoch, batch, row within the chosen block, the block itself):
        a checkpointing data loader (verl's StatefulDataLoader) saves it, and a resumed run continues there
        with the same choice instead of re-choosing every batch it skips."""
        if not self._pos:
            return {"epoch": self.epoch, "batch": 0, "row": 0, "block": None}
        return {**self._pos, "block": None if self._pos["block"] is None else list(self._pos["block"])}

    def load_state_dict(self, state: dict) -> None:
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
        self.metrics = metrics.after(self.target, n, s)
        self.applied.append({"step": step, "ids": ids, "n": n, "s": s, "stats": stats, "metrics": self.metrics})
        return self.metrics
