"""graphdiff in verl's v1 trainer (verl 0.9, the default ``trainer.use_v1: true``): a registered trainer mode.

verl 0.9 builds its training sampler with ``create_rl_sampler`` (random or sequential, no class_path hook)
and calls no curriculum ``update``. Its v1 trainer does look trainer classes up by name
(``trainer.v1.trainer_mode``, ``@register_trainer``) and imports the modules named in
``VERL_USE_EXTERNAL_MODULES`` in every process at ``import verl``. This module registers
``trainer.v1.trainer_mode=graphdiff``: verl's own synchronous trainer (``PPOTrainerSync``, so every
``trainer_mode == "sync"`` path is unchanged) with two differences:

* its training data loader draws from ``integrations.verl.GraphdiffCurriculumSampler``: blocks of
  ``data.train_batch_size`` rows (one training step's prompts) chosen from a pool of ``pool_factor`` x
  that by the configured rule from the current estimates. With ``data.dataloader_num_workers=0`` the
  loader asks for step t + 1's prompts only inside step t + 1, after step t's outcomes were applied;
* after each step (``step``, before verl saves the checkpoint, clears the batch and logs), it reads the
  step's ``index`` and ``rm_scores`` from the TransferQueue, applies them as exactly one estimator step
  and adds the ``graphdiff/...`` scalars (``tracking.StepMetrics``) to the step's metrics, so they reach
  the trainer's W&B / TensorBoard / console logger.

Dynamic sampling (``algorithm.filter_groups.enable``, ``sync_refill_failed_groups``): verl fetches prompts
one by one and refills from the loader; every dispatch (``_next_train_batch``) is then chosen by
``integrations.verl.DispatchChooser`` (GRESO-style pre-filter on p_zero_variance, then ``strategy``; an
optional ``__rollout_n__`` allocation), and ``GraphdiffReplayBuffer`` - verl's own sync ``ReplayBuffer``,
built with the arguments verl resolved - keeps the outcomes of every group it evicts or discards, applied
with the trained batch as the step's one STATE update.

Settings: a top-level ``graphdiff:`` section (``+graphdiff.state=runs/STATE`` on the command line), with
the keys of ``integrations.verl.OPTIONS``. Refused in one line at start-up: ``dataloader_num_workers``
other than 0 (the loader would choose ahead of the outcomes), ``trainer.v1.sampler.custom_sampler`` (this
mode provides the buffer), and a STATE that is not at the trainer's step (resume from checkpoint C needs
the STATE at C: ``graphdiff rollback --to C``). The async modes are not this mode (docs/how-to/verl.md says
why their outcomes cannot be applied as an older policy's).

Importing this module imports verl; where verl (or one of its dependencies: ray, transfer_queue, ...)
cannot be imported, it raises ``ImportError`` naming the cause.
"""

from __future__ import annotations

import inspect
from collections import deque

try:
    import transfer_queue as tq
    from omegaconf import OmegaConf, open_dict
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.v1 import PPOTrainerSync, register_trainer
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from verl.utils.dataset.rl_dataset import collate_fn
except Exception as exc:  # noqa: BLE001 - one specific message whatever failed
    raise ImportError(f"graphdiff's verl v1 trainer needs verl >= 0.9 with its dependencies, and importing them "
                      f"failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from exc

from ..errors import InvalidArgumentError, StateError
from .tracking import resume_mismatch
from .verl import (DispatchChooser, GeneratedGroupsMixin, GraphdiffCurriculumSampler, apply_generated,
                   check_v1_config, dynamic_sampling, outcomes_from_fields)

TRAINER_MODE = "graphdiff"


class GraphdiffReplayBuffer(GeneratedGroupsMixin, ReplayBuffer):
    """verl's synchronous ReplayBuffer, unchanged in what it evicts, refills and trains on, that keeps the
    outcomes of every training group it clears (DAPO-evicted, failed, surplus) for the step's STATE update."""

    @staticmethod
    def graphdiff_kv_get(**kwargs):
        return tq.kv_batch_get(**kwargs)

    @classmethod
    def like(cls, buffer: ReplayBuffer) -> GraphdiffReplayBuffer:
        """The same buffer as verl built it: every constructor argument read back from ``buffer``."""
        if type(buffer) is not ReplayBuffer:
            raise InvalidArgumentError(f"trainer.v1.trainer_mode=graphdiff runs on verl's synchronous ReplayBuffer, "
                                       f"got {type(buffer).__name__}")
        names = [k for k in inspect.signature(ReplayBuffer.__init__).parameters if k != "self"]
        return cls(**{k: getattr(buffer, k) for k in names})


@register_trainer(TRAINER_MODE)
class GraphdiffPPOTrainer(PPOTrainerSync):
    """verl's synchronous v1 trainer whose prompts are chosen by graphdiff, fed every step's outcomes."""

    def __init__(self, config, *args, **kwargs):
        check_v1_config(config)
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"  # verl branches on "sync": behave exactly as it
        super().__init__(config, *args, **kwargs)

    def _build_replay_buffer(self):
        # verl resolves the buffer's arguments (filter_groups metric, max_inflight_gen_batches, gen_batch_size=1
        # under dynamic sampling, sync_refill_failed_groups); graphdiff's subclass is built with the same ones
        return GraphdiffReplayBuffer.like(super()._build_replay_buffer())

    def _init_dataloader(self):
        super()._init_dataloader()  # datasets, the validation loader, verl's checks and sizes
        options = dict(self.config.get("graphdiff", None) or {})
        rollout_n = OmegaConf.select(self.config, "actor_rollout_ref.rollout.n", default=None)
        if rollout_n and not options.get("group_size"):
            options["group_size"] = int(rollout_n)  # p_zero_variance for the group size actually rolled out
        self.graphdiff_sampler = GraphdiffCurriculumSampler(self.train_dataset, self.config.data, options=options,
                                                            batch_size=int(self.config.data.train_batch_size))
        # per dispatch: under dynamic sampling (verl then fetches prompts one by one, gen_batch_size=1, and
        # refills from the loader) and with a __rollout_n__ allocation, each dispatch is chosen when verl asks
        self.graphdiff_dispatch = None
        if dynamic_sampling(self.config) or options.get("allocate") is not None:
            self.graphdiff_sampler.planned = deque()
            self.graphdiff_dispatch = DispatchChooser(self.graphdiff_sampler, int(rollout_n or 1))
        gen_batch_size = self.config.data.get("gen_batch_size", None) or self.config.data.train_batch_size
        self.train_dataloader = StatefulDataLoader(dataset=self.train_dataset, batch_size=gen_batch_size,
                                                   num_workers=0, drop_last=True, collate_fn=self._graphdiff_collate,
                                                   sampler=self.graphdiff_sampler)
        self.train_dataloader_it = None

    def _graphdiff_collate(self, rows):
        batch = collate_fn(rows)
        chooser = getattr(self, "graphdiff_dispatch", None)
        if chooser is not None and chooser.allocate is not None:
            batch["__rollout_n__"] = chooser.rollout_counts(batch["index"])  # read per sample by the agent loop
        return batch

    def _next_train_batch(self, num_prompts: int | None = None):
        """verl's fetch of ``num_prompts`` (a step's first batch or a refill); graphdiff chooses them first."""
        if self.graphdiff_dispatch is not None:
            k = int(num_prompts or self.config.data.train_batch_size)
            self.graphdiff_sampler.planned.extend(self.graphdiff_dispatch.choose(k, int(self.global_steps)).tolist())
        return super()._next_train_batch(num_prompts)

    def on_train_begin(self):
        super().on_train_begin()
        # fit() counts steps from 1 and has advanced global_steps to the step about to run
        done = int(self.global_steps) - 1
        if self.graphdiff_sampler.target.step != done:
            raise StateError(resume_mismatch(self.graphdiff_sampler.target.step, done, "verl"))

    def step(self, metrics: dict, timing_raw: dict):
        batch = super().step(metrics, timing_raw)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["index", "rm_scores"])
        trained = outcomes_from_fields(data["index"], data["rm_scores"], batch.tags,
                                       self.graphdiff_sampler.success_threshold)
        counts = (self.graphdiff_dispatch.step_counts(int(self.global_steps)) if self.graphdiff_dispatch is not None
                  else None)
        metrics.update(apply_generated(self.graphdiff_sampler, trained, self.replay_buffer.graphdiff_take(), counts))
        return batch
