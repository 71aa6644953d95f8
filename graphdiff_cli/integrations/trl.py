"""graphdiff inside TRL's ``GRPOTrainer``: log every rollout's reward, update once per step, choose batches.

    from graphdiff_cli.integrations.trl import GraphdiffTRL

    gd = GraphdiffTRL("runs/STATE", strategy="target")     # or GraphdiffTRL(estimator, ids=[...])
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), train_dataset=ds,   # ds has a stable "id" column
                          reward_funcs=[gd.reward(my_correctness_reward)])
    gd.attach(trainer)                                       # the step callback and the batch sampler
    trainer.train()

* ``gd.reward(fn)`` wraps a reward function. TRL calls it with every dataset column, so the wrapper sees
  each completion's prompt ``id`` (``id_column``) and the trainer state; it returns ``fn``'s rewards
  unchanged and records (trainer step, id, reward) for each completion. A rollout counts as a success
  when its reward >= ``success_threshold`` (None: rewards must be 0/1, others are refused). With several reward functions,
  wrap the one that defines success.
* ``gd.callback()`` is a ``transformers.TrainerCallback``. At the end of optimiser step T
  (``state.global_step`` = T) it applies exactly one update: the rewards recorded during step T, as
  per-prompt (n, s), to estimator step T (a step without new rollouts, e.g. reused generations with
  ``num_iterations > 1``, is applied as an empty step so the two step counters stay equal). At the
  start of training it checks that the estimator is at the trainer's step (resuming from checkpoint
  step C needs the STATE at step C: ``graphdiff rollback --to C``).
* Per step, ``graphdiff/...`` scalars (``tracking.StepMetrics``: the batch's mean p-hat and predicted
  effective-group share before its outcomes, the observed ones, the update's seconds, kappa / nu /
  propagation weight / time forgetting in use) join the trainer's own metrics, so they reach W&B,
  TensorBoard or whatever ``report_to`` names, averaged over each ``logging_steps`` window like TRL's.
* ``gd.sampler(trainer)`` replaces GRPO's ``RepeatSampler``: for each generation batch it draws a pool
  of ``pool_factor`` x B prompts and keeps B by ``strategy`` (``core.decisions.select``), then repeats
  each prompt ``num_generations`` times and the batch ``num_iterations x steps_per_generation`` times,
  exactly as ``RepeatSampler`` lays it out. ``gd.attach(trainer)`` installs both.

Timing caveat, measured with accelerate 1.15: accelerate's ``DataLoaderShard`` reads one batch ahead, so
the batch for step T + 1 is chosen while step T is being yielded, i.e. from the estimates after step
T - 1. Each ``Decision`` records the estimator step it used.

Multi-process (not exercised by the tests): the callback gathers every process's recorded rewards with
``torch.distributed.all_gather_object`` before counting; an in-memory estimator is then updated
identically on every process (the sampler's choices agree because the seeds do), a STATE directory is
written by process 0 only, behind a barrier.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from ..core import decisions as dec
from ..errors import DataError, InvalidArgumentError
from ..io.outcomes import check_threshold
from .tracking import BatchChooser, OutcomeRecorder, StateTarget, StepMetrics, count_outcomes, open_target


def _dist():
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    return dist if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 else None


class GraphdiffTRL:
    """One graphdiff estimator (in memory or a STATE directory) wired into one GRPO run."""

    def __init__(self, target, *, ids=None, id_column: str = "id", success_threshold: float | None = None,
                 strategy: str = "target", pool_factor: float = 4.0, target_p: float = 0.5, seed: int = 0,
                 explore: float = dec.TARGET_EXPLORE, group_size: int | None = None, outcomes_dir=None,
                 durable: bool = True):
        kwargs = {"outcomes_dir": outcomes_dir, "durable": durable} if isinstance(target, (str, Path)) else {}
        self.target = open_target(target, ids=ids, **kwargs)
        self.id_column = id_column
        self.success_threshold = check_threshold(success_threshold)  # None: 0/1 rewards only
        self.strategy, self.pool_factor, self.target_p, self.seed = strategy, pool_factor, target_p, seed
        self.group_size = group_size
        self.explore = dec.check_explore(explore)
        self.recorder = OutcomeRecorder()
        self.applied: list[dict] = []  # one entry per trainer step: step, ids, n, s, stats
        self.chooser: BatchChooser | None = None
        self._trainer = None  # set by attach(): where the step metrics go
        self._pending: dict[str, list[float]] = {}

    # -- rewards -----------------------------------------------------------------------------------

    def reward(self, fn):
        """Wrap a TRL reward function so that every (prompt id, reward) it returns is recorded."""
        id_column = self.id_column

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            rewards = fn(*args, **kwargs)
            ids = kwargs.get(id_column)
            if ids is None:
                raise DataError(f"the training data set has no {id_column!r} column: graphdiff needs a stable "
                                "prompt id per row (set id_column= to name it)")
            state = kwargs.get("trainer_state")
            step = int(state.global_step) if state is not None else self.target.step
            rewards = list(rewards)
            if len(rewards) != len(ids):
                raise DataError(f"reward function returned {len(rewards)} rewards for {len(ids)} completions")
            self.recorder.add(step, ids, rewards)
            return rewards

        return wrapped

    # -- the step callback -------------------------------------------------------------------------

    def apply_step(self, step: int) -> dict:
        """Count the rewards recorded before the end of trainer step ``step`` and apply them as that step."""
        rows = self.recorder.take(before_step=step)
        dist = _dist()
        if dist is not None:
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, rows)
            rows = [r for part in gathered for r in part]
        ids, n, s = count_outcomes(rows, self.success_threshold)
        metrics = StepMetrics()
        metrics.before(self.target, ids, n)
        stats = None
        if dist is None or not isinstance(self.target, StateTarget) or dist.get_rank() == 0:
            stats = self.target.apply(step, ids, n, s)
        if dist is not None and isinstance(self.target, StateTarget):
            dist.barrier()
        entry = {"step": step, "ids": ids, "n": n, "s": s, "rows": len(rows), "stats": stats,
                 "metrics": metrics.after(self.target, n, s)}
        self.applied.append(entry)
        self._log(entry["metrics"])
        return entry

    def _log(self, metrics: dict[str, float]) -> None:
        """Hand a step's ``graphdiff/...`` scalars to the trainer's logger: GRPOTrainer averages its own
        per-step metrics (``_metrics``) over each logging window and logs them to every ``report_to``
        (W&B, TensorBoard, ...) at the next log; graphdiff's join them there. Another Trainer gets them
        from the callback's ``on_log`` (added first so that every reporting callback sees them)."""
        trainer = self._trainer
        window = getattr(trainer, "_metrics", None) if trainer is not None else None
        if isinstance(window, dict) and "train" in window:
            for key, value in metrics.items():
                window["train"][key].append(value)
        else:
            for key, value in metrics.items():
                self._pending.setdefault(key, []).append(value)

    def _take_pending(self) -> dict[str, float]:
        pending, self._pending = self._pending, {}
        return {key: sum(values) / len(values) for key, values in pending.items()}

    def extend(self, prompts=None, **kwargs) -> dict | None:
        """Add prompts to the STATE between steps (``graphdiff extend``; ``embedded=`` for an embeddings
        artifact of them), by process 0 only behind a barrier as every write. A data set that gains rows
        needs a new sampler: attach again on resume. Returns extend's result (None on other ranks)."""
        target = self._state_target("extend")
        return self._on_rank_zero(lambda: target.extend(prompts, **kwargs))

    def retire(self, ids_file, *, restore: bool = False, **kwargs) -> dict | None:
        """Take prompts out of the candidate set (``graphdiff retire``); the sampler skips them from then on."""
        target = self._state_target("retire")
        return self._on_rank_zero(lambda: target.retire(ids_file, restore=restore, **kwargs))

    @staticmethod
    def _on_rank_zero(write):
        dist = _dist()
        res = write() if dist is None or dist.get_rank() == 0 else None
        if dist is not None:
            dist.barrier()
        return res

    def _state_target(self, what: str):
        from ..errors import InvalidArgumentError

        if not isinstance(self.target, StateTarget):
            raise InvalidArgumentError(f"{what} needs a STATE directory (graphdiff init): an in-memory estimator "
                                       "keeps neither the embeddings nor the kNN lists that adding prompts needs")
        return self.target

    def check_resume(self, trainer_step: int) -> None:
        from ..errors import StateError

        if self.target.step != trainer_step:
            raise StateError(f"the graphdiff estimator is at step {self.target.step} but the trainer starts at "
                             f"step {trainer_step}; roll the STATE back to the trainer's checkpoint step "
                             f"(graphdiff rollback --to {trainer_step}) or start a fresh STATE")

    def callback(self):
        from transformers import TrainerCallback

        owner = self

        class GraphdiffCallback(TrainerCallback):
            """Applies each optimiser step's recorded rewards to the graphdiff estimator, once."""

            def on_train_begin(self, args, state, control, **kwargs):
                owner.check_resume(int(state.global_step))

            def on_step_end(self, args, state, control, **kwargs):
                owner.apply_step(int(state.global_step))

            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs is not None:
                    logs.update(owner._take_pending())

        return GraphdiffCallback()

    # -- the batch sampler -------------------------------------------------------------------------

    def row_nodes(self, dataset) -> np.ndarray:
        """Node index of every dataset row, from its ``id_column``; missing, repeated or unknown ids refused."""
        if self.id_column not in getattr(dataset, "column_names", []):
            raise DataError(f"the training data set has no {self.id_column!r} column: graphdiff needs a stable "
                            "prompt id per row")
        ids = [str(x) for x in dataset[self.id_column]]
        seen: dict[str, int] = {}
        for r, pid in enumerate(ids):
            if pid in seen:
                raise DataError(f"data set rows {seen[pid]} and {r} share the id {pid!r}; ids must be unique")
            seen[pid] = r
        return self.target.nodes(ids, where=f"data set column {self.id_column!r}")

    def sampler(self, trainer, dataset=None):
        """A sampler with ``RepeatSampler``'s layout whose batches are chosen by graphdiff."""
        from torch.utils.data import Sampler

        dataset = trainer.train_dataset if dataset is None else dataset
        args = trainer.args
        g = int(trainer.num_generations)
        if args.generation_batch_size % g:
            raise InvalidArgumentError(f"generation batch {args.generation_batch_size} is not a multiple of "
                                       f"num_generations {g}")
        b = args.generation_batch_size // g
        repeat = int(args.num_iterations) * int(args.steps_per_generation)
        chooser = BatchChooser(self.target, self.row_nodes(dataset), b, strategy=self.strategy,
                               pool_factor=self.pool_factor, seed=self.seed, target_p=self.target_p,
                               explore=self.explore, group_size=self.group_size or g)
        self.chooser = chooser
        n_batches = len(dataset) // b

        class GraphdiffRepeatSampler(Sampler):
            def __init__(self):
                self.epoch = 0

            def __iter__(self):
                epoch, self.epoch = self.epoch, self.epoch + 1
                for k in range(n_batches):
                    chosen = chooser.choose(epoch, k)
                    for _ in range(repeat):
                        for row in chosen:
                            for _ in range(g):
                                yield int(row)

            def __len__(self):
                return n_batches * b * g * repeat

        return GraphdiffRepeatSampler()

    def attach(self, trainer) -> None:
        """Install the step callback and the sampler on a ``GRPOTrainer`` (before ``train()``); the step
        metrics go to the trainer's logger."""
        self._trainer = trainer
        trainer.callback_handler.callbacks.insert(0, self.callback())  # before the reporting callbacks
        trainer._get_train_sampler = lambda dataset=None: self.sampler(trainer, dataset)
