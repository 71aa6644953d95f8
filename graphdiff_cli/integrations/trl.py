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

* ``GraphdiffTRL(..., live_features=True)`` gives the estimator live features of the prompts (its live read-out,
  ``estimator.sources.live``): when the sampler draws a pool, one batched forward pass of the policy over the
  pool's prompts (left-padded, the chat template applied to conversational ones as TRL does, no gradient, eval
  mode) gives each prompt's next-token entropy and largest probability at its last position
  (``next_token_features``); they go with the selection of that batch, and, for the prompts rolled out, with the
  step's update. A callable instead of True computes other features: ``fn(prompts)`` (the data set's prompt
  values) -> an array of one row per prompt. Their cost is reported per step: ``graphdiff/live_seconds``
  (the forward passes since the last step) and ``graphdiff/live_share`` (of the step's wall time).
* ``GraphdiffTRL(..., dynamic_sampling=True)`` (or ``"uniform"``) gives the trainer DAPO's dynamic sampling:
  ``attach`` also wraps TRL's own ``_generate_and_score_completions`` so that each step's batch holds B
  groups with 0 < s < n, refilled by further generation rounds (at most ``max_generation_rounds``) drawn
  by graphdiff's pre-filter (``dynamic_sampling.CandidateDraw``); every generated group is applied to the
  estimator. docs/how-to/trl.md, "Dynamic sampling", says how it maps onto TRL's generation batching.

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
from . import dynamic_sampling as ds
from .tracking import (METRIC_PREFIX, BatchChooser, OutcomeRecorder, StateTarget, StepMetrics, count_outcomes,
                       open_target, resume_mismatch)


def _dist():
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    return dist if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 else None


class GraphdiffTRL:
    """One graphdiff estimator (in memory or a STATE directory) wired into one GRPO run."""

    def __init__(self, target, *, ids=None, id_column: str = "id", success_threshold: float | None = None,
                 strategy: str | None = None, pool_factor: float = 4.0, target_p: float = 0.5, seed: int = 0,
                 explore: float = dec.TARGET_EXPLORE, group_size: int | None = None, outcomes_dir=None,
                 durable: bool = True, dynamic_sampling=None, max_generation_rounds: int = ds.DEFAULT_MAX_ROUNDS,
                 prefilter_explore: float = ds.DEFAULT_EXPLORE, live_features=None):
        self.dynamic_sampling = ds.check_mode(dynamic_sampling)
        if live_features is not None and live_features is not False and live_features is not True \
                and not callable(live_features):
            raise InvalidArgumentError(f"live_features must be True (the policy's next-token entropy and largest "
                                       f"probability) or a function of the prompts, got {live_features!r}")
        if live_features not in (None, False) and self.dynamic_sampling is not None:
            raise InvalidArgumentError("live_features does not reach dynamic sampling's draws yet: leave one of "
                                       "live_features and dynamic_sampling off")
        self.live_features = None if live_features in (None, False) else live_features
        self._live: dict[str, np.ndarray] = {}  # id -> its live features, from the last pool it was in
        self._live_seconds = 0.0  # the forward passes since the last step
        self._step_t0: float | None = None  # when the last step ended (or training began)
        if self.dynamic_sampling is not None and strategy is not None:
            raise InvalidArgumentError(f"strategy={strategy!r} chooses batches without dynamic sampling; with "
                                       f"dynamic_sampling={dynamic_sampling!r} the pre-filter ('prefilter') or a "
                                       "uniform draw ('uniform') decides what is generated: leave strategy out")
        self.max_generation_rounds = dec.check_int(max_generation_rounds, "max_generation_rounds", 1)
        self.prefilter_explore = ds.check_explore_p(prefilter_explore)
        kwargs = {"outcomes_dir": outcomes_dir, "durable": durable} if isinstance(target, (str, Path)) else {}
        self.target = open_target(target, ids=ids, **kwargs)
        self.id_column = id_column
        self.success_threshold = check_threshold(success_threshold)  # None: 0/1 rewards only
        strategy = "target" if strategy is None else strategy
        self.strategy, self.pool_factor, self.target_p, self.seed = strategy, pool_factor, target_p, seed
        self.group_size = group_size
        self.explore = dec.check_explore(explore)
        self.recorder = OutcomeRecorder()
        self.applied: list[dict] = []  # one entry per trainer step: step, ids, n, s, stats
        self.chooser: BatchChooser | None = None
        self._trainer = None  # set by attach(): where the step metrics go
        self._pending: dict[str, list[float]] = {}
        # dynamic sampling (attach() with dynamic_sampling on): the draws, one record per generation
        self.draw: ds.CandidateDraw | None = None
        self.draws: list[ds.Draw] = []  # every round's choice, the sampler's first rounds included
        self.ds_log: list[ds.DSRecord] = []
        self._queued: list[ds.Draw] = []  # the sampler's draws not yet generated (the loader reads ahead)
        self._last_call: tuple[list, list] | None = None  # the wrapped reward function's last (ids, rewards)

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
            self._last_call = (list(ids), rewards)
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
        live = self._step_live(ids)
        stats = None
        if dist is None or not isinstance(self.target, StateTarget) or dist.get_rank() == 0:
            stats = self.target.apply(step, ids, n, s, live=live)
        if dist is not None and isinstance(self.target, StateTarget):
            dist.barrier()
        entry = {"step": step, "ids": ids, "n": n, "s": s, "rows": len(rows), "stats": stats,
                 "metrics": {**metrics.after(self.target, n, s), **self._live_cost()}, "live": live}
        self.applied.append(entry)
        self._log(entry["metrics"])
        return entry

    # -- live features -----------------------------------------------------------------------------

    def pool_live(self, dataset, rows) -> np.ndarray:
        """The live features of the data set's rows ``rows`` (one row each), kept by id for the step's update."""
        import time

        t0 = time.perf_counter()
        items = [dataset[int(r)] for r in rows]
        prompts = [item["prompt"] for item in items]
        if self.live_features is True:
            trainer = self._trainer
            if trainer is None:
                raise InvalidArgumentError("live_features=True reads the trainer's policy: gd.attach(trainer) first")
            model = trainer.accelerator.unwrap_model(trainer.model) if hasattr(trainer, "accelerator") else trainer.model
            x = next_token_features(model, trainer.processing_class, prompts)
        else:
            x = np.asarray(self.live_features(prompts), dtype=np.float64)
            if x.ndim != 2 or x.shape[0] != len(prompts):
                raise DataError(f"live_features returned shape {x.shape} for {len(prompts)} prompts; expected one "
                                "row of features per prompt")
        for item, row in zip(items, x):
            self._live[str(item[self.id_column])] = row
        self._live_seconds += time.perf_counter() - t0
        return x

    def _step_live(self, ids: list[str]) -> np.ndarray | None:
        """The step's prompts' live features as last computed (a row of NaN for one never in a pool)."""
        if self.live_features is None or not ids:
            return None
        rows = [self._live.get(pid) for pid in ids]
        f = next((r.size for r in rows if r is not None), None)
        if f is None:
            return None
        return np.stack([np.full(f, np.nan) if r is None else r for r in rows])

    def _live_cost(self) -> dict[str, float]:
        """``graphdiff/live_seconds`` and ``graphdiff/live_share`` of the step that just ended."""
        import time

        now = time.perf_counter()
        if self.live_features is None:
            return {}
        seconds, self._live_seconds = self._live_seconds, 0.0
        out = {METRIC_PREFIX + "live_seconds": seconds}
        if self._step_t0 is not None and now > self._step_t0:
            out[METRIC_PREFIX + "live_share"] = min(1.0, seconds / (now - self._step_t0))
        self._step_t0 = now
        return out

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
            raise StateError(resume_mismatch(self.target.step, trainer_step, "the trainer"))

    def callback(self):
        from transformers import TrainerCallback

        owner = self

        class GraphdiffCallback(TrainerCallback):
            """Applies each optimiser step's recorded rewards to the graphdiff estimator, once."""

            def on_train_begin(self, args, state, control, **kwargs):
                import time

                owner.check_resume(int(state.global_step))
                owner._step_t0 = time.perf_counter()

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
        if self.dynamic_sampling is not None:
            return self._ds_sampler(dataset, b, g, repeat)
        chooser = BatchChooser(self.target, self.row_nodes(dataset), b, strategy=self.strategy,
                               pool_factor=self.pool_factor, seed=self.seed, target_p=self.target_p,
                               explore=self.explore, group_size=self.group_size or g)
        self.chooser = chooser
        if self.live_features is not None:
            if self.live_features is True and "prompt" not in getattr(dataset, "column_names", []):
                raise DataError("live_features=True needs the data set's 'prompt' column (the policy reads it)")
            chooser.live = functools.partial(self.pool_live, dataset)
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
        metrics go to the trainer's logger. With ``dynamic_sampling`` on, also wrap the trainer's
        ``_generate_and_score_completions`` (see ``_ds_generate``)."""
        self._trainer = trainer
        trainer.callback_handler.callbacks.insert(0, self.callback())  # before the reporting callbacks
        trainer._get_train_sampler = lambda dataset=None: self.sampler(trainer, dataset)
        if self.dynamic_sampling is not None:
            self._check_ds(trainer)
            generate = trainer._generate_and_score_completions  # TRL's own, bound to the trainer
            trainer._generate_and_score_completions = functools.partial(self._ds_generate, trainer, generate)

    # -- dynamic sampling ------------------------------------------------------------------------

    def _check_ds(self, trainer) -> None:
        """Refuse the set-ups dynamic sampling cannot serve exactly (one line each)."""
        args = trainer.args
        if int(getattr(trainer.accelerator, "num_processes", 1)) > 1 or _dist() is not None:
            raise InvalidArgumentError("dynamic_sampling runs on one process only: a group's rollouts are spread "
                                       "over processes by TRL, and refilling would need every process to agree "
                                       "on each refill (run with one process, or leave dynamic_sampling off)")
        if getattr(trainer, "use_vllm", False):
            raise InvalidArgumentError("dynamic_sampling is not supported with use_vllm (not tested: vLLM's "
                                       "importance-sampling outputs are merged per round); leave use_vllm off")
        if getattr(trainer, "environment_factories", None) is not None or getattr(trainer, "tools", None):
            raise InvalidArgumentError("dynamic_sampling does not support tools or environments (multi-turn "
                                       "rollouts): leave dynamic_sampling off")
        if args.generation_batch_size % int(trainer.num_generations):
            raise InvalidArgumentError(f"generation batch {args.generation_batch_size} is not a multiple of "
                                       f"num_generations {trainer.num_generations}")

    def _ds_sampler(self, dataset, b: int, g: int, repeat: int):
        """RepeatSampler's layout; each generation batch is the first round of a dynamically sampled step,
        drawn by ``CandidateDraw`` (the pre-filter or a uniform draw)."""
        from torch.utils.data import Sampler

        draw = ds.CandidateDraw(self.target, self.row_nodes(dataset), b, g, mode=self.dynamic_sampling,
                                explore=self.prefilter_explore)
        self.draw, self._ds_dataset, self._queued = draw, dataset, []
        n_batches = len(dataset) // b
        owner = self

        class GraphdiffDSSampler(Sampler):
            def __init__(self):
                self.epoch = 0

            def __iter__(self):
                epoch, self.epoch = self.epoch, self.epoch + 1
                for k in range(n_batches):
                    d = draw.draw([owner.seed, epoch, k])
                    d.extra.update(epoch=epoch, batch=k, round=1)
                    owner.draws.append(d)
                    owner._queued.append(d)
                    for _ in range(repeat):
                        for row in d.chosen:
                            for _ in range(g):
                                yield int(row)

            def __len__(self):
                return n_batches * b * g * repeat

        return GraphdiffDSSampler()

    def _ds_round(self, generate, inputs: list[dict], g: int):
        """One generation round through TRL's own ``_generate_and_score_completions``: its output and,
        per group (rows j*g .. j*g + g - 1), the prompt id and the success reward's values."""
        self._last_call = None
        out = generate(inputs)
        if self._last_call is None:
            raise InvalidArgumentError("dynamic_sampling needs the reward function that defines success wrapped "
                                       "by gd.reward(...) in reward_funcs (it was not called)")
        ids, rewards = self._last_call
        if len(ids) % g:
            raise DataError(f"a generation round of {len(ids)} rollouts is not whole groups of {g}")
        for j in range(0, len(ids), g):
            if len({str(x) for x in ids[j:j + g]}) != 1:
                raise DataError(f"rollouts {j}..{j + g - 1} of a generation round are not one prompt's group: "
                                "dynamic_sampling needs TRL's RepeatSampler layout (graphdiff's sampler)")
        return out, [(str(ids[j]), rewards[j:j + g]) for j in range(0, len(ids), g)]

    def _ds_generate(self, trainer, generate, inputs):
        """DAPO's dynamic sampling around TRL's ``_generate_and_score_completions`` (train mode only).

        Round 1 is the loader's generation batch (the sampler's draw). Its groups with a signal
        (0 < s < n) are kept; while fewer than B are kept and fewer than ``max_generation_rounds``
        rounds ran, another B prompts not yet generated in this step are drawn (``CandidateDraw``:
        pre-filter or uniform) and generated by the same TRL call. The returned batch holds the first B
        kept groups, rows merged from the rounds' outputs (prompts re-padded on the left, completions and
        per-token tensors on the right; ``num_items_in_batch`` recounted). When the cap is hit (or the
        candidates run out) the batch is filled with zero-variance groups, whose GRPO advantage is 0, and
        this is reported (a log line, ``graphdiff/round_cap_hit``). Every generated rollout was recorded
        by the reward wrapper and is applied to the estimator at the end of the step.
        """
        if not trainer.model.training:
            return generate(inputs)
        import logging

        g = int(trainer.num_generations)
        b = len(inputs) // g
        step = int(trainer.state.global_step)
        rec = ds.DSRecord(trainer_step=step, batch_size=b, max_rounds=self.max_generation_rounds)
        first = self._match_queued([str(x[self.id_column]) for x in inputs[::g]])
        rec.skipped += [self.target.ids[self.draw.row_nodes[r]] for r in first.skipped]
        rec.prefilter_seconds += first.seconds
        generated_rows = [int(r) for r in first.chosen]
        parts: list[tuple[dict, list[int]]] = []  # (round output, its kept group indices)
        leftovers: list[tuple[int, int, str]] = []  # (part, group index, id) of zero-variance groups
        round_inputs = inputs
        while True:
            out, groups = self._ds_round(generate, round_inputs, g)
            if not parts:
                _check_mergeable(out)
            rec.rounds += 1
            rec.generated.append([pid for pid, _ in groups])
            rec.rollouts += sum(1 for _, rw in groups for r in rw if not _is_nan(r))
            keep = []
            for j, (pid, rw) in enumerate(groups):
                if ds.has_signal(rw, self.success_threshold):
                    if len(rec.kept) < b:
                        keep.append(j)
                        rec.kept.append(pid)
                    else:
                        rec.surplus.append(pid)
                else:
                    rec.filtered.append(pid)
                    leftovers.append((len(parts), j, pid))
            parts.append((out, keep))
            if len(rec.kept) >= b:
                break
            if rec.rounds >= self.max_generation_rounds:
                rec.cap_hit = True
                break
            d = self.draw.draw([self.seed, 7, step, rec.rounds], exclude=generated_rows)
            d.extra.update(trainer_step=step, round=rec.rounds + 1)
            self.draws.append(d)
            rec.skipped += [self.target.ids[self.draw.row_nodes[r]] for r in d.skipped]
            rec.prefilter_seconds += d.seconds
            if d.chosen.size == 0:
                rec.exhausted = True
                break
            generated_rows += [int(r) for r in d.chosen]
            round_inputs = [self._ds_row(r) for r in d.chosen for _ in range(g)]
        missing = b - len(rec.kept)
        for part, j, pid in leftovers[:missing]:  # zero-variance groups fill a short batch (advantage 0)
            parts[part][1].append(j)
            rec.padded.append(pid)
            rec.filtered.remove(pid)
        self.ds_log.append(rec)
        self._log(rec.metrics(METRIC_PREFIX))
        if rec.cap_hit or rec.exhausted:
            logging.getLogger("graphdiff").warning(rec.summary())
        if len(parts) == 1 and len(parts[0][1]) == b:
            return parts[0][0]  # round 1 was all signal: TRL's own output, untouched
        return _merge_rounds([(out, rows) for out, rows in parts], g, trainer._tokenizer.pad_token_id)

    def _match_queued(self, group_ids: list[str]) -> ds.Draw:
        """The sampler's draw that this generation batch came from (the loader reads ahead: a queue)."""
        ids = self.target.ids
        for k, d in enumerate(self._queued):
            if [ids[self.draw.row_nodes[r]] for r in d.chosen] == group_ids:
                del self._queued[: k + 1]
                return d
        raise InvalidArgumentError("a generation batch that graphdiff's sampler did not draw reached dynamic "
                                   "sampling: attach(trainer) must install the sampler (do not replace "
                                   "_get_train_sampler after it)")

    def _ds_row(self, row: int) -> dict:
        item = self._ds_dataset[int(row)]
        return dict(item)


# -- live features ------------------------------------------------------------------------------------


def next_token_features(model, tokenizer, prompts) -> np.ndarray:
    """(entropy, largest probability) of the policy's next-token distribution at each prompt's last position,
    float64, one row per prompt, from one batched forward pass without gradient, in eval mode (the model's mode
    is restored). Prompts are tokenized as TRL's GRPOTrainer tokenizes them: conversational ones (a list of
    messages) through the chat template with the generation prompt, no special tokens added, padded on the left;
    position ids follow the attention mask, so a padded row sees what it would alone."""
    import torch

    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
             if isinstance(p, (list, tuple)) else str(p) for p in prompts]
    side, pad = tokenizer.padding_side, tokenizer.pad_token
    tokenizer.padding_side = "left"
    if pad is None:
        tokenizer.pad_token = tokenizer.eos_token
    try:
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = side
        if pad is None:
            tokenizer.pad_token = pad
    device = next(model.parameters()).device
    ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            try:
                logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1).logits
            except TypeError:  # a model without logits_to_keep: every position's logits, the last kept
                logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    finally:
        model.train(training)
    logp = torch.log_softmax(logits[:, -1].double(), dim=-1)
    p = logp.exp()
    entropy = -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1)  # 0 log 0 = 0
    return torch.stack([entropy, p.max(-1).values], dim=1).cpu().numpy()


# -- merging generation rounds -------------------------------------------------------------------------

_LEFT = {"prompt_ids": None, "prompt_mask": 0}  # None: the tokenizer's pad id
_RIGHT = {"completion_ids": None, "completion_mask": 0, "old_per_token_logps": 0.0, "ref_per_token_logps": 0.0,
          "sampling_per_token_logps": 0.0, "tool_mask": 1}
_ROWS = ("advantages",)
_RECOUNTED = ("num_items_in_batch",)


def _is_nan(r) -> bool:
    return r is None or (isinstance(r, float) and r != r)


def _check_mergeable(out: dict) -> None:
    for key in out:
        if key not in _LEFT and key not in _RIGHT and key not in _ROWS and key not in _RECOUNTED:
            raise InvalidArgumentError(f"dynamic_sampling cannot merge TRL's {key!r} output across generation "
                                       "rounds (multimodal inputs are not supported): leave dynamic_sampling off")


def _merge_rounds(parts, g: int, pad_id: int) -> dict:
    """One batch from the chosen groups of several rounds' outputs (``parts``: (output, group indices))."""
    import torch

    def rows(groups):
        return [j * g + i for j in groups for i in range(g)]

    picked = [(out, torch.tensor(rows(groups), dtype=torch.long)) for out, groups in parts if groups]
    merged = {}
    for key in picked[0][0]:
        if key in _RECOUNTED or picked[0][0][key] is None:
            continue
        tensors = [out[key].index_select(0, idx.to(out[key].device)) for out, idx in picked]
        if key in _ROWS:
            merged[key] = torch.cat(tensors)
            continue
        left = key in _LEFT
        value = (_LEFT if left else _RIGHT)[key]
        value = pad_id if value is None else value
        width = max(t.shape[1] for t in tensors)
        padded = []
        for t in tensors:
            fill = t.new_full((t.shape[0], width - t.shape[1]), value)
            padded.append(torch.cat([fill, t] if left else [t, fill], dim=1))
        merged[key] = torch.cat(padded)
    mask = merged["completion_mask"]
    if "tool_mask" in merged:
        mask = mask * merged["tool_mask"]
    merged["num_items_in_batch"] = mask.sum()
    return merged
