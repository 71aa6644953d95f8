"""One closed-loop run: TRL's ``GRPOTrainer`` on the warm-started policy, prompts chosen by one scheduler.

Per step the scheduler's plan (``schedulers.Plan``) is laid out the way GRPO's ``RepeatSampler`` lays a
batch out - each planned prompt repeated ``units x num_generations`` times - so a prompt given k units gets
k GRPO groups of the fixed group size (the trainer normalises advantages per group). Rewards are exact
match against the answer. Outcomes per prompt are applied to the estimator once per optimiser step:
for the graphdiff schedulers through graphdiff's TRL integration (``GraphdiffTRL.reward`` records every
completion's reward, ``GraphdiffTRL.apply_step`` applies trainer step T as estimator step T), for the
native estimators from the loop's own record of the same rewards.

Dynamic sampling (``ds`` schedulers) is the product's: ``GraphdiffTRL(target, dynamic_sampling=...)`` is
attached to the trainer (its sampler draws each step's first round, its wrapper around TRL's
``_generate_and_score_completions`` refills, its callback applies every generated group), with the
scheduler's estimator as its target (graphdiff's Estimator, or ``schedulers.BeliefTarget`` over GRESO or the
oracle). Every generated rollout is counted; the trainer trains on the B kept groups.

Live arms (``schedulers.LIVE_ESTIMATORS``) read the current policy's next-token entropy and largest probability
of the candidates at each read (one batched forward pass, ``integrations.trl.next_token_features``): logged per
step as ``live_seconds`` and ``live_share`` (of the trainer step plus a plan made outside it). With
``rollout_budget`` > 0 a run stops at the first step whose cumulative rollouts reach it (the uncensored regime;
``steps`` is then the cap) and is evaluated there.

Oracle schedulers measure each candidate their rule reads by ``oracle_samples`` completions of the current
policy (``measure``, one batched generation per plan, a forked RNG); their count and seconds are logged per
step under ``oracle`` and are neither rollouts nor training data.

As with ``GraphdiffTRL``'s own sampler, accelerate's data loader reads one batch ahead, so the plan for
step T + 1 is made from the estimates after step T - 1 - the same one-step lag for every scheduler.

Measured per step (``metrics.jsonl``): rollouts, cumulative rollouts, prompts, effective prompts (0 < s <
n over the prompt's rollouts of the step), mean reward, the trainer step's wall time (generation, reward,
loss, optimiser), the estimator's wall time (update after the step + the plan before it), and held-out
greedy exact-match accuracy every ``eval_every`` steps (step 0 = the warm-started policy), with the held-out
mean pass rate of ``eval_samples`` sampled completions per prompt (temperature 1: what GRPO optimises;
greedy accuracy moves only when a prompt's most likely answer flips), both also per (skill, level) cell.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from graphdiff_cli.errors import InvalidArgumentError
from graphdiff_cli.integrations.tracking import METRIC_PREFIX, OutcomeRecorder, count_outcomes
from graphdiff_cli.io.atomic import atomic_write_text
from graphdiff_cli.io.readers import IdIndex
from . import schedulers as sch
from .tasks import verify


@dataclass
class RunConfig:
    scheduler: str = "uniform"
    seed: int = 0
    steps: int = 40
    batch_prompts: int = 16          # prompts per step (B)
    group_size: int = 8              # rollouts per prompt (GRPO group)
    pool_factor: float = 4.0         # selection: candidates = pool_factor x B
    max_rounds: int = 8              # dynamic sampling: at most this many generation rounds of B prompts per step
    oracle_samples: int = 32         # oracle arms: completions per measured candidate (not rollouts, not trained)
    alloc_group: int = 4             # allocation: the trainer's group size; each prompt gets 1..alloc_max_units groups
    alloc_max_units: int = 4
    target: float = 0.5
    learning_rate: float = 5e-4
    temperature: float = 1.0
    max_completion_length: int = 8
    eval_every: int = 5
    eval_samples: int = 4            # also the held-out mean pass rate over this many samples at temperature 1
    threads: int = 1
    device: str = "cpu"              # where the policy trains, generates, is evaluated and measured ("cuda": a GPU)
    rollout_budget: int = 0          # > 0: stop at the first step whose cumulative rollouts reach it (the
                                     # uncensored regime: a pre-filter arm runs until it has used DS's rollouts,
                                     # ``steps`` then being the step cap stated beforehand); 0: run ``steps``
    extra: dict = field(default_factory=dict)

    def trainer_group(self) -> int:
        return self.alloc_group if sch.SCHEDULERS[self.scheduler][0] == "allocate" else self.group_size

    def rollouts_per_step(self) -> int:
        """Rollouts the trainer trains on per step (dynamic sampling generates more: every round is counted)."""
        return self.batch_prompts * self.group_size


def with_covariates(estimator, covariates):
    """A fresh graphdiff ``Estimator`` (step 0) as it is - its graph, states, embeddings and settings - with the
    prompts' encoded covariates (N x c) added, which its covariates' read-out (setting ``covariate_readout``)
    then reads."""
    from graphdiff_cli.estimator import Estimator

    if estimator.step_ != 0:
        raise InvalidArgumentError(f"covariates are added to a fresh estimator, not one at step {estimator.step_}")
    state = estimator.state_dict()
    return Estimator(state["graph"], state["labels"], state["n_states"], embeddings=state["embeddings"],
                     covariates=covariates, settings=estimator.settings)


def _by_cell(rows: list[dict], values) -> dict[str, float]:
    """Mean of ``values`` per (skill, level) cell of the rows, keyed "compare2" (where a scheduler's gains are)."""
    acc: dict[str, list[float]] = {}
    for r, v in zip(rows, np.asarray(values, dtype=float)):
        acc.setdefault(f"{r.get('skill', '?')}{r.get('level', '')}", []).append(float(v))
    return {k: round(float(np.mean(v)), 4) for k, v in sorted(acc.items())}


def run(cfg: RunConfig, train_rows: list[dict], test_rows: list[dict], policy_dir, out_dir,
        graphdiff_factory=None, log=print) -> dict:
    """Train one policy with one scheduler; write ``metrics.jsonl``, ``summary.json`` and ``outcomes.jsonl``
    to ``out_dir``; return the summary. ``graphdiff_factory()`` returns a fresh ``Estimator`` over the
    training pool (node i = ``train_rows[i]``)."""
    import torch

    torch.set_num_threads(int(cfg.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from datasets import Dataset
    from torch.utils.data import Sampler
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from .policy import greedy_accuracy, heldout, load_policy, pass_counts

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    applied_steps = [0]  # optimiser steps taken (the oracle's policy version)
    kind, rule, belief_kind = sch.SCHEDULERS[cfg.scheduler]
    ids = [r["id"] for r in train_rows]
    index = IdIndex(ids, "the training pool")
    g = cfg.trainer_group()
    per_step = cfg.rollouts_per_step()

    from graphdiff_cli.integrations.trl import GraphdiffTRL

    model, tok = load_policy(policy_dir)
    if cfg.device != "cpu":
        model.to(cfg.device)  # TRL (accelerate) keeps it there; generation follows the model's device
    live = {"trainer": None, "calls": 0}  # the trainer, once built: its model is the current policy
    oracle_cost = {"candidates": 0, "completions": 0, "seconds": 0.0}

    def measure(nodes, samples):
        """The oracle's measurement: ``samples`` completions per node from the current policy in one batched
        generation (temperature 1, a forked RNG: GRPO's sampling is left as it was); counted apart."""
        t0 = time.perf_counter()
        live["calls"] += 1
        c = pass_counts(live["trainer"].model, tok, [train_rows[int(i)] for i in nodes], n=samples,
                        max_new_tokens=cfg.max_completion_length, seed=cfg.seed * 1_000_003 + live["calls"])
        oracle_cost["candidates"] += len(nodes)
        oracle_cost["completions"] += len(nodes) * samples
        oracle_cost["seconds"] += time.perf_counter() - t0
        return c

    gd = None
    belief = None
    oracle = None
    if belief_kind == "oracle":
        oracle = sch.OracleBelief(measure, lambda: applied_steps[0], samples=cfg.oracle_samples)
    if belief_kind == "graphdiff":
        if graphdiff_factory is None:
            raise InvalidArgumentError(f"scheduler {cfg.scheduler} needs a graphdiff estimator")
        estimator = graphdiff_factory()
        belief = sch.graphdiff_belief(estimator)
        target = estimator
    elif belief_kind in sch.LIVE_ESTIMATORS:
        from graphdiff_cli.integrations.trl import next_token_features

        def features(nodes):
            """The current policy's next-token entropy and largest probability at each candidate prompt's end:
            one batched forward pass (no gradient) over the candidates read."""
            tr = live["trainer"]
            return next_token_features(tr.accelerator.unwrap_model(tr.model), tok,
                                       [train_rows[int(i)]["prompt"] for i in nodes])

        if belief_kind == "graphdiff-live" and graphdiff_factory is None:
            raise InvalidArgumentError(f"scheduler {cfg.scheduler} needs a graphdiff estimator")
        belief = sch.make_belief(belief_kind, len(ids), features=features,
                                 covariates=sch.cell_covariates(train_rows),
                                 graphdiff_factory=lambda x: with_covariates(graphdiff_factory(), x))
        target = sch.BeliefTarget(belief, ids)
    else:
        belief = sch.make_belief(belief_kind, len(ids), oracle=oracle)
        target = sch.BeliefTarget(belief, ids)
    live_cost = belief.cost if isinstance(belief, sch.LiveBelief) else None
    if kind == "ds":  # the product's TRL dynamic sampling, whatever estimator feeds its pre-filter
        gd = GraphdiffTRL(target, ids=ids, group_size=cfg.group_size, dynamic_sampling=rule,
                          max_generation_rounds=cfg.max_rounds, seed=cfg.seed)
    elif belief_kind == "graphdiff":
        gd = GraphdiffTRL(target, ids=ids, group_size=cfg.group_size)
    units = 2 if kind == "allocate" else 1
    scheduler = None
    if kind != "ds":
        scheduler = sch.Scheduler(cfg.scheduler, len(ids), cfg.batch_prompts, g, seed=cfg.seed, belief=belief,
                                  pool_factor=cfg.pool_factor, units_per_prompt=units if kind == "allocate" else 1,
                                  max_units=cfg.alloc_max_units, target=cfg.target)
    if kind == "allocate" and cfg.group_size != units * g:
        raise InvalidArgumentError(f"allocation needs group_size = 2 x alloc_group (got {cfg.group_size}, {g})")

    recorder = OutcomeRecorder()  # what the trainer's reward function saw, per trainer step
    plans: dict[int, dict] = {}

    def correctness(prompts, completions, answer, id, trainer_state=None, **kwargs):
        step = int(trainer_state.global_step) + 1 if trainer_state is not None else -1
        rewards = [verify(c, a) for c, a in zip(completions, answer)]
        recorder.add(step, id, rewards)
        return rewards

    reward_fn = gd.reward(correctness) if gd is not None else correctness

    class PlanSampler(Sampler):
        def __iter__(self):
            for t in range(1, cfg.steps + 1):
                t0 = time.perf_counter()
                live0 = live_cost()["seconds"] if live_cost else 0.0
                plan = scheduler.plan(t)
                el = time.perf_counter() - t0
                if live_cost:
                    plan.info["live_seconds"] = live_cost()["seconds"] - live0
                rows = [int(nd) for nd, u in zip(plan.nodes, plan.units) for _ in range(int(u) * g)]
                if len(rows) != per_step:
                    raise RuntimeError(f"plan of step {t} has {len(rows)} rollouts, expected {per_step}")
                plans[t] = {"plan_seconds": el, "prompts": int(plan.nodes.size), "pool": plan.pool_size,
                            "estimator_step_at_plan": _est_step(), **plan.info}
                yield from rows

        def __len__(self):
            return cfg.steps * per_step


    def _est_step():
        return applied_steps[0]

    ds = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"], "id": r["id"]} for r in train_rows])
    args = GRPOConfig(output_dir=str(out_dir / "trainer"), per_device_train_batch_size=per_step,
                      gradient_accumulation_steps=1, num_generations=g, max_completion_length=cfg.max_completion_length,
                      max_steps=cfg.steps, learning_rate=cfg.learning_rate, lr_scheduler_type="constant",
                      warmup_steps=0, beta=0.0, temperature=cfg.temperature, logging_steps=1, report_to=[],
                      save_strategy="no", use_cpu=cfg.device == "cpu", seed=cfg.seed, data_seed=cfg.seed,
                      dataloader_num_workers=0, disable_tqdm=True, bf16=False, fp16=False)
    trainer = GRPOTrainer(model=model, processing_class=tok, args=args, train_dataset=ds, reward_funcs=[reward_fn])
    live["trainer"] = trainer
    if kind == "ds":
        gd.attach(trainer)  # sampler, DS generation wrapper and the step callback (applies every generated group)
    else:
        trainer._get_train_sampler = lambda dataset=None: PlanSampler()

    metrics_path = out_dir / "metrics.jsonl"
    outcomes_path = out_dir / "outcomes.jsonl"
    metrics_f = metrics_path.open("w", encoding="utf-8")
    outcomes_f = outcomes_path.open("w", encoding="utf-8")
    state = {"cum": 0, "t_begin": None, "oracle_prev": {}, "live_prev": 0.0, "budget_reached": False}
    eval_seconds = []

    def evaluate(step) -> dict:
        """Greedy exact-match accuracy and (``eval_samples`` > 0) the mean pass rate of sampled completions
        (the same seed at every evaluation of every run, so paired runs draw alike)."""
        t0 = time.perf_counter()
        if cfg.eval_samples:  # one read of each prompt for both (policy.heldout)
            ok, c = heldout(trainer.model, tok, test_rows, cfg.eval_samples,
                            max_new_tokens=cfg.max_completion_length, seed=cfg.seed)
            out = {"heldout_sampled": float(c.mean() / cfg.eval_samples),
                   "heldout_sampled_by_cell": _by_cell(test_rows, c / cfg.eval_samples)}
        else:
            ok = greedy_accuracy(trainer.model, tok, test_rows, max_new_tokens=cfg.max_completion_length)[1]
            out = {}
        out = {"heldout_acc": float(ok.mean()), "heldout_acc_by_cell": _by_cell(test_rows, ok), **out}
        eval_seconds.append(time.perf_counter() - t0)
        return out

    ev0 = evaluate(0)
    acc0 = ev0["heldout_acc"]
    metrics_f.write(json.dumps({"step": 0, "rollouts": 0, "cum_rollouts": 0, **ev0}) + "\n")
    metrics_f.flush()
    log(f"[{cfg.scheduler} seed {cfg.seed}] step 0 held-out accuracy {acc0:.4f} "
        f"sampled {ev0.get('heldout_sampled', float('nan')):.4f}")

    class LoopCallback(TrainerCallback):
        def on_step_begin(self, args, st, control, **kw):
            state["t_begin"] = time.perf_counter()

        def on_step_end(self, args, st, control, **kw):
            step = int(st.global_step)
            step_seconds = time.perf_counter() - state["t_begin"]
            pids, n, s = count_outcomes(recorder.take(step + 1))  # success = reward >= 1
            nodes = index.nodes(pids)
            t0 = time.perf_counter()
            if gd is not None:
                # DS: graphdiff's own callback (installed first by attach) already applied the step
                entry = gd.applied[-1] if kind == "ds" else gd.apply_step(step)
                if entry["step"] != step:
                    raise RuntimeError(f"step {step}: the TRL integration applied step {entry['step']}")
                est_stats = {k: v for k, v in (entry.get("stats") or {}).items() if isinstance(v, (int, float))}
                gd_nodes = index.nodes(entry["ids"])
                if not (np.array_equal(gd_nodes, nodes) and np.array_equal(entry["n"], n)
                        and np.array_equal(entry["s"], s)):
                    raise RuntimeError(f"step {step}: graphdiff's recorded outcomes differ from the loop's")
            else:
                est_stats = scheduler.update(nodes, n, s)
            update_seconds = time.perf_counter() - t0 if kind != "ds" else float(
                ((gd.applied[-1].get("metrics") or {}).get(METRIC_PREFIX + "update_seconds", 0.0)))
            applied_steps[0] = step
            eff = sch.effective_groups(n, s)
            state["cum"] += int(n.sum())
            plan = plans.get(step, {})
            row = {"step": step, "rollouts": int(n.sum()), "cum_rollouts": state["cum"], "prompts": int(n.size),
                   "effective": int(eff.sum()), "effective_rate": float(eff.mean()) if n.size else 0.0,
                   "mean_reward": float(s.sum() / max(1, n.sum())), "all_correct": int((s == n).sum()),
                   "all_wrong": int((s == 0).sum()), "step_seconds": step_seconds,
                   "estimator_update_seconds": update_seconds,
                   "estimator_plan_seconds": float(plan.get("plan_seconds", 0.0)),
                   "estimator_seconds": update_seconds + float(plan.get("plan_seconds", 0.0)),
                   "estimator_step_at_plan": plan.get("estimator_step_at_plan"),
                   "plan": {k: v for k, v in plan.items() if k not in ("plan_seconds", "estimator_step_at_plan")},
                   "estimator_stats": est_stats}
            if kind == "ds":
                rec = gd.ds_log[-1]
                row["ds"] = {k: v for k, v in rec.metrics("").items()}
                row["trained_prompts"] = len(rec.kept) + len(rec.padded)
                row["plan"] = {"skipped_before_generation": len(rec.skipped), "rounds": rec.rounds}
                # the pre-filter's reads of the estimates are estimator cost too (the oracle's own measurement
                # is counted apart, under "oracle")
                row["estimator_prefilter_seconds"] = rec.prefilter_seconds
                row["estimator_seconds"] += 0.0 if oracle is not None else rec.prefilter_seconds
            if oracle is not None:
                row["oracle"] = {k: oracle_cost[k] - state["oracle_prev"].get(k, 0) for k in oracle_cost}
                state["oracle_prev"] = dict(oracle_cost)
            if live_cost:
                # the forward passes for the live features: the DS pre-filter's inside the step (since the last
                # step ended), a plan's before it (the plan made for this step); the arm's time of the step is
                # the trainer step plus the plan made outside it
                if kind == "ds":
                    now = live_cost()["seconds"]
                    live_s, state["live_prev"] = now - state["live_prev"], now
                else:
                    live_s = float(plan.get("live_seconds", 0.0))
                arm_s = step_seconds + float(plan.get("plan_seconds", 0.0))
                row["live_seconds"] = live_s
                row["live_share"] = live_s / arm_s if arm_s > 0 else 0.0
            stop = cfg.rollout_budget > 0 and state["cum"] >= cfg.rollout_budget
            if stop:
                state["budget_reached"] = True
                control.should_training_stop = True
            if step % cfg.eval_every == 0 or step == cfg.steps or stop:
                row.update(evaluate(step))
                log(f"[{cfg.scheduler} seed {cfg.seed}] step {step} held-out accuracy {row['heldout_acc']:.4f} "
                    f"sampled {row.get('heldout_sampled', float('nan')):.4f} "
                    f"effective {row['effective_rate']:.2f} step {step_seconds:.1f}s")
            metrics_f.write(json.dumps(row) + "\n")
            metrics_f.flush()
            outcomes_f.write(json.dumps({"step": step, "ids": [ids[i] for i in nodes], "n": n.tolist(),
                                         "s": s.tolist()}) + "\n")
            outcomes_f.flush()

    trainer.add_callback(LoopCallback())
    t0 = time.perf_counter()
    try:
        trainer.train()
    finally:
        metrics_f.close()
        outcomes_f.close()
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in metrics_path.read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    summary = {"config": asdict(cfg), "steps": len(steps), "rollouts": state["cum"],
               "final_heldout_acc": rows[-1].get("heldout_acc"), "initial_heldout_acc": acc0,
               "final_heldout_sampled": rows[-1].get("heldout_sampled"),
               "initial_heldout_sampled": ev0.get("heldout_sampled"),
               "effective_rate": float(np.mean([r["effective_rate"] for r in steps])) if steps else None,
               "mean_step_seconds": float(np.mean([r["step_seconds"] for r in steps])) if steps else None,
               "mean_estimator_seconds": float(np.mean([r["estimator_seconds"] for r in steps])) if steps else None,
               "eval_seconds_total": float(sum(eval_seconds)), "wall_seconds": wall,
               "estimator_step": applied_steps[0]}
    if gd is not None:
        summary["graphdiff_applied_steps"] = [e["step"] for e in gd.applied]
    if kind == "ds":
        summary["ds_round_cap_hits"] = int(sum(r.cap_hit for r in gd.ds_log))
        summary["ds_rounds"] = int(sum(r.rounds for r in gd.ds_log))
    if cfg.rollout_budget > 0:
        summary["rollout_budget"] = {"budget": cfg.rollout_budget, "reached": state["budget_reached"],
                                     "step_cap": cfg.steps}
    if live_cost:
        c = live_cost()
        summary["live"] = {**c, "share_of_wall": c["seconds"] / wall if wall else None,
                           "mean_step_share": float(np.mean([r["live_share"] for r in steps])) if steps else None,
                           "statistics": belief.live_statistics()}
    if oracle is not None:
        summary["oracle"] = {**oracle_cost, "samples_per_candidate": cfg.oracle_samples,
                             "share_of_wall": oracle_cost["seconds"] / wall if wall else None}
    # written last and atomically: its presence is what marks the run finished (report, batch runner, Snakemake)
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=1) + "\n")
    return summary
