"""One closed-loop run: TRL's ``GRPOTrainer`` on the warm-started policy, prompts chosen by one scheduler.

Per step the scheduler's plan (``schedulers.Plan``) is laid out the way GRPO's ``RepeatSampler`` lays a
batch out - each planned prompt repeated ``units x num_generations`` times - so a prompt given k units gets
k GRPO groups of the fixed group size (the trainer normalises advantages per group). Rewards are exact
match against the answer. Outcomes per prompt are applied to the estimator once per optimiser step:
for the graphdiff schedulers through graphdiff's TRL integration (``GraphdiffTRL.reward`` records every
completion's reward, ``GraphdiffTRL.apply_step`` applies trainer step T as estimator step T), for the
native estimators from the loop's own record of the same rewards.

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
from graphdiff_cli.integrations.tracking import OutcomeRecorder, count_outcomes
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
    dapo_oversample: float = 2.0     # DAPO: oversample x B prompts rolled out per step
    alloc_group: int = 4             # allocation: the trainer's group size; each prompt gets 1..alloc_max_units groups
    alloc_max_units: int = 4
    target: float = 0.5
    learning_rate: float = 5e-4
    temperature: float = 1.0
    max_completion_length: int = 8
    eval_every: int = 5
    eval_samples: int = 4            # also the held-out mean pass rate over this many samples at temperature 1
    threads: int = 1
    extra: dict = field(default_factory=dict)

    def trainer_group(self) -> int:
        return self.alloc_group if sch.SCHEDULERS[self.scheduler][0] == "allocate" else self.group_size

    def rollouts_per_step(self) -> int:
        kind = sch.SCHEDULERS[self.scheduler][0]
        if kind == "dapo":
            return int(round(self.dapo_oversample * self.batch_prompts)) * self.group_size
        return self.batch_prompts * self.group_size


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

    from .policy import greedy_accuracy, load_policy, pass_counts

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    kind, _, belief_kind = sch.SCHEDULERS[cfg.scheduler]
    ids = [r["id"] for r in train_rows]
    index = IdIndex(ids, "the training pool")
    g = cfg.trainer_group()
    per_step = cfg.rollouts_per_step()

    gd = None
    belief = None
    if belief_kind == "graphdiff":
        from graphdiff_cli.integrations.trl import GraphdiffTRL

        if graphdiff_factory is None:
            raise InvalidArgumentError(f"scheduler {cfg.scheduler} needs a graphdiff estimator")
        estimator = graphdiff_factory()
        gd = GraphdiffTRL(estimator, ids=ids, group_size=cfg.group_size)
        belief = sch.graphdiff_belief(estimator)
    elif belief_kind is not None:
        belief = sch.make_belief(belief_kind, len(ids))
    units = 2 if kind == "allocate" else 1
    scheduler = sch.Scheduler(cfg.scheduler, len(ids), cfg.batch_prompts, g, seed=cfg.seed, belief=belief,
                              pool_factor=cfg.pool_factor, oversample=cfg.dapo_oversample,
                              units_per_prompt=units if kind == "allocate" else 1,
                              max_units=cfg.alloc_max_units, target=cfg.target)
    if kind == "allocate" and cfg.group_size != units * g:
        raise InvalidArgumentError(f"allocation needs group_size = 2 x alloc_group (got {cfg.group_size}, {g})")

    model, tok = load_policy(policy_dir)
    recorder = OutcomeRecorder()  # what the trainer's reward function saw, per trainer step
    plans: dict[int, dict] = {}
    dapo_kept: dict[int, int] = {}

    def correctness(prompts, completions, answer, id, trainer_state=None, **kwargs):
        step = int(trainer_state.global_step) + 1 if trainer_state is not None else -1
        rewards = [verify(c, a) for c, a in zip(completions, answer)]
        recorder.add(step, id, rewards)
        if kind == "dapo":
            groups = [rewards[i:i + g] for i in range(0, len(rewards), g)]
            flat, kept = sch.dapo_keep(groups, cfg.batch_prompts)
            dapo_kept[step] = kept
            return [r for grp in flat for r in grp]
        return rewards

    reward_fn = gd.reward(correctness) if gd is not None else correctness

    class PlanSampler(Sampler):
        def __iter__(self):
            for t in range(1, cfg.steps + 1):
                t0 = time.perf_counter()
                plan = scheduler.plan(t)
                el = time.perf_counter() - t0
                rows = [int(nd) for nd, u in zip(plan.nodes, plan.units) for _ in range(int(u) * g)]
                if len(rows) != per_step:
                    raise RuntimeError(f"plan of step {t} has {len(rows)} rollouts, expected {per_step}")
                plans[t] = {"plan_seconds": el, "prompts": int(plan.nodes.size), "pool": plan.pool_size,
                            "estimator_step_at_plan": _est_step(), **plan.info}
                yield from rows

        def __len__(self):
            return cfg.steps * per_step

    applied_steps = [0]

    def _est_step():
        return applied_steps[0]

    ds = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"], "id": r["id"]} for r in train_rows])
    args = GRPOConfig(output_dir=str(out_dir / "trainer"), per_device_train_batch_size=per_step,
                      gradient_accumulation_steps=1, num_generations=g, max_completion_length=cfg.max_completion_length,
                      max_steps=cfg.steps, learning_rate=cfg.learning_rate, lr_scheduler_type="constant",
                      warmup_steps=0, beta=0.0, temperature=cfg.temperature, logging_steps=1, report_to=[],
                      save_strategy="no", use_cpu=True, seed=cfg.seed, data_seed=cfg.seed,
                      dataloader_num_workers=0, disable_tqdm=True, bf16=False, fp16=False)
    trainer = GRPOTrainer(model=model, processing_class=tok, args=args, train_dataset=ds, reward_funcs=[reward_fn])
    trainer._get_train_sampler = lambda dataset=None: PlanSampler()

    metrics_path = out_dir / "metrics.jsonl"
    outcomes_path = out_dir / "outcomes.jsonl"
    metrics_f = metrics_path.open("w", encoding="utf-8")
    outcomes_f = outcomes_path.open("w", encoding="utf-8")
    state = {"cum": 0, "t_begin": None}
    eval_seconds = []

    def evaluate(step) -> dict:
        """Greedy exact-match accuracy and (``eval_samples`` > 0) the mean pass rate of sampled completions
        (the same seed at every evaluation of every run, so paired runs draw alike)."""
        t0 = time.perf_counter()
        acc, ok = greedy_accuracy(trainer.model, tok, test_rows, max_new_tokens=cfg.max_completion_length)
        out = {"heldout_acc": acc, "heldout_acc_by_cell": _by_cell(test_rows, ok)}
        if cfg.eval_samples:
            c = pass_counts(trainer.model, tok, test_rows, n=cfg.eval_samples,
                            max_new_tokens=cfg.max_completion_length, seed=cfg.seed)
            out["heldout_sampled"] = float(c.mean() / cfg.eval_samples)
            out["heldout_sampled_by_cell"] = _by_cell(test_rows, c / cfg.eval_samples)
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
                entry = gd.apply_step(step)
                est_stats = {k: v for k, v in (entry.get("stats") or {}).items() if isinstance(v, (int, float))}
                gd_nodes = index.nodes(entry["ids"])
                if not (np.array_equal(gd_nodes, nodes) and np.array_equal(entry["n"], n)
                        and np.array_equal(entry["s"], s)):
                    raise RuntimeError(f"step {step}: graphdiff's recorded outcomes differ from the loop's")
            else:
                est_stats = scheduler.update(nodes, n, s)
            update_seconds = time.perf_counter() - t0
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
            if kind == "dapo":
                row["dapo_kept"] = int(dapo_kept.get(step, 0))
            if step % cfg.eval_every == 0 or step == cfg.steps:
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
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
