"""graphdiff in SkyRL's synchronous trainer under ``trainer.algorithm.dynamic_sampling.type=filter|replace``.

SkyRL (checked at NovaSky-AI/SkyRL@a956457, package ``skyrl``, skyrl/train/trainer.py) has no sampler or
outcome plugin setting; ``RayPPOTrainer.train`` draws ``trainer.train_batch_size`` prompts from its
``StatefulDataLoader`` (built by ``_build_train_dataloader_and_compute_training_steps``, a hook meant for
subclasses), generates ``generator.n_samples_per_prompt`` rollouts each, and - when
``trainer.algorithm.dynamic_sampling.type`` is set - passes every generation batch to
``handle_dynamic_sampling(generator_output, uids)``, which returns ``(output, uids, keep_sampling)``: DAPO's
``filter`` keeps generating batches until ``train_batch_size`` groups with signal are in, POLARIS' ``replace``
overwrites zero-variance groups with copies of good ones. ``uids`` are the prompts' ``PromptDataset`` row
numbers (``str(item)``, one per rollout); ``generator_output["rewards"]`` one reward per rollout (or per token,
summed as SkyRL sums them). This module's ``GraphdiffSkyRL`` is a mixin for a ``RayPPOTrainer`` subclass::

    class Trainer(GraphdiffSkyRL, RayPPOTrainer):
        graphdiff_options = {"state": "runs/STATE", "id_field": "extra_info.index"}

* ``handle_dynamic_sampling``: records every generation batch's groups - the ones SkyRL then drops or
  replaces included - maps each uid to its row's prompt id (``id_field`` of the row, read once at start-up;
  missing, repeated and unknown ids refused), calls SkyRL's own rule unchanged, and when it stops sampling
  (``keep_sampling`` false) applies the step's groups as STATE step ``global_step`` (``groups.GroupSteps``; a
  STATE at another step is refused, e.g. on a resume without ``graphdiff rollback --to``);
* ``_build_train_dataloader_and_compute_training_steps``: SkyRL's loader with graphdiff's sampler
  (``groups.ChosenRows``: each step's ``train_batch_size`` prompts chosen from a pool of ``pool_factor`` x that
  by ``strategy``, from the estimates after the previous step) and no worker processes; ``graphdiff_options``
  ``choose: false`` keeps SkyRL's shuffled loader. Refill batches under ``filter`` come from the same sampler.

Unsupported: ``dynamic_sampling.type`` unset (SkyRL then calls no hook that sees the outcomes - set ``filter`` or
``replace``); ``generator.step_wise_trajectories`` (uids are then trajectory instance ids); the fully asynchronous
trainer (``fully_async_trainer.py``). SkyRL is never imported here: the mixin relies on the methods named above.
"""

from __future__ import annotations

from ..errors import DataError, InvalidArgumentError
from .groups import ChosenRows, GroupSteps, as_array, group_options, open_state, row_ids, row_sampler
from .options import Option, as_flag, read_options

WHERE = "graphdiff_options."


def _dataset_rows(dataset):
    """The rows of a SkyRL ``PromptDataset`` (its ``dataframe``, a Hugging Face Dataset) or of a list."""
    return getattr(dataset, "dataframe", dataset)


def rollout_rewards(generator_output) -> list[float]:
    """One reward per rollout: SkyRL's ``rewards`` (a float each, or a list per token, summed as SkyRL does)."""
    rewards = generator_output["rewards"]
    return [float(sum(r)) if isinstance(r, (list, tuple)) else float(as_array(r).sum()) for r in rewards]


class GraphdiffSkyRL:
    """Mixin for ``RayPPOTrainer`` (see the module docstring); ``graphdiff_options``: the ``groups.OPTIONS``
    plus ``choose`` (True: graphdiff's sampler builds the training loader)."""

    graphdiff_options: dict | None = None
    graphdiff_target = None  # an Estimator/Target instead of graphdiff_options["state"] (tests)

    def graphdiff(self):
        """The adapter state, built on first use: the STATE, each row's prompt id, the step's groups."""
        if getattr(self, "_graphdiff", None) is None:
            options = dict(self.graphdiff_options or {})
            choose = read_options({"choose": Option(True, as_flag)}, options, lambda n: WHERE + n)["choose"]
            options.pop("choose", None)
            opts = group_options(options, lambda n: WHERE + n, need_state=self.graphdiff_target is None)
            target = open_state(opts, self.graphdiff_target)
            ids = row_ids(_dataset_rows(self.train_dataset), opts["id_field"], where="SkyRL training data set")
            target.nodes(ids, "SkyRL training data set ids")
            opts["group_size"] = int(self.cfg.generator.n_samples_per_prompt)
            self._graphdiff = {"options": opts, "choose": choose, "target": target, "ids": ids,
                               "steps": GroupSteps(target, success_threshold=opts["success_threshold"])}
        return self._graphdiff

    def _build_train_dataloader_and_compute_training_steps(self):
        gd = self.graphdiff()
        if not gd["choose"]:
            return super()._build_train_dataloader_and_compute_training_steps()
        from torchdata.stateful_dataloader import StatefulDataLoader

        b = int(self.cfg.trainer.train_batch_size)
        rows = ChosenRows(gd["target"], gd["ids"], b, gd["options"], "SkyRL training data set ids")
        self.train_dataloader = StatefulDataLoader(self.train_dataset, batch_size=b,
                                                   sampler=row_sampler(rows, len(gd["ids"])),
                                                   collate_fn=self.train_dataset.collate_fn, num_workers=0,
                                                   drop_last=True)
        self.total_training_steps = len(self.train_dataloader) * self.cfg.trainer.epochs
        if self.cfg.trainer.max_training_steps is not None:
            self.total_training_steps = min(self.total_training_steps, self.cfg.trainer.max_training_steps)

    def handle_dynamic_sampling(self, generator_output, uids):
        gd = self.graphdiff()
        rewards = rollout_rewards(generator_output)
        if len(rewards) != len(uids):
            raise DataError(f"SkyRL passed {len(uids)} uids for {len(rewards)} rollouts")
        groups: dict[str, list[float]] = {}
        for uid, r in zip(uids, rewards):
            groups.setdefault(uid, []).append(r)
        for uid, rs in groups.items():
            gd["steps"].add(self._graphdiff_id(uid), rs)
        out = super().handle_dynamic_sampling(generator_output, uids)
        if not out[2]:  # SkyRL stops generating for this step: every group of the step is in
            gd["steps"].apply(int(self.global_step))
            self.all_metrics.update(gd["steps"].metrics)
        return out

    def _graphdiff_id(self, uid) -> str:
        ids = self.graphdiff()["ids"]
        try:
            row = int(uid)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"SkyRL uid {uid!r} is not a row number: generator.step_wise_trajectories "
                                       "is not supported by graphdiff") from None
        if not 0 <= row < len(ids):
            raise DataError(f"SkyRL uid {uid!r} is not a row of the {len(ids)}-row training data set")
        return ids[row]
