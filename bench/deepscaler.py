#!/usr/bin/env python3
"""The large-pool regime on DeepScaleR's 29,095 real pass rates (Qwen2.5-Math-7B, s out of
128), as two benchmarks over a workflow-style run folder (RUN/embeddings.zarr, RUN/graph/*.zarr,
RUN/clusters/*.zarr, made by graphdiff embed / build-graph / cluster; docs/lab/results.md has the commands).

cold-start  The static protocol of evaluation/coldstart.py: for each revealed fraction (2%, 10%, 30%) and draw
            (seeds 0, 1, 2), a random subset gets 8 rollouts ~ Binomial(8, s/128) each, fed to every
            estimator in steps of 256 prompts; every unrevealed problem is then predicted and scored by
            Pearson r and MAE against s/128. Mean and 95% Student-t interval over draws, and every draw.
trajectory  A log from `graphdiff simulate --rates` (evaluation/rate_drift.py: real starting rates, a logit drift
            whose speed is a skill group's random effect; 3 epochs of 256, so at most 3 visits per problem),
            written under --out unless --log is given, replayed through the estimators (evaluation/replay.py:
            each batch predicted before its outcomes). First-visit within-batch r, full-run MAE against the
            observed s/n and against the true p, with 95% circular block-bootstrap intervals over steps.

Estimators: method keys of graphdiff_cli.evaluation.methods (--methods; new keys work as soon as methods knows them),
built by methods.build_methods with the embeddings in the graph's node order. graphdiff runs --preset
(default) with --graphdiff-set KEY=VALUE overrides; --variant 'NAME:KEY=VALUE,...' adds more graphdiff
estimators under their own names (e.g. --variant 'readout:readout=auto', --variant 'paper:preset=paper';
a variant on graphdiff's preset starts from its --graphdiff-set values). Output: a markdown table on stdout
and OUT/<command>.json, OUT/<command>.md.

    .venv/bin/python bench/deepscaler.py cold-start --run artifacts/deepscaler --out artifacts/deepscaler/bench
    .venv/bin/python bench/deepscaler.py trajectory --run artifacts/deepscaler --out artifacts/deepscaler/bench \\
        --skill-groups artifacts/deepscaler/skills/k80_K16_s1.zarr
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import run_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RATES = ROOT / ".." / "shared" / "data" / "deepscaler_difficulty" / "problems.jsonl"
# every non-oracle method that sees the cold start differently: discounted history, MoPPS and GRESO give a
# never-seen prompt the same constant as history (its prior), so the cold start leaves them out by default
COLD_SKIP = ("discounted", "mopps", "greso")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------
# inputs and estimators


def load_run(run: Path):
    from graphdiff_cli.io.readers import read_inputs

    return read_inputs(run_file(run, "graph/*.zarr"), run_file(run, "clusters/*.zarr"), run / "embeddings.zarr")


def load_rates(path: Path, inp) -> np.ndarray:
    """Known rate s / n of every graph node (node order); every node must have a row."""
    from graphdiff_cli.io.tables import read_rows

    rate = {str(r["id"]): int(r["s"]) / int(r["n"]) for _, r in read_rows(path)}
    missing = [i for i in inp.ids if i not in rate]
    if missing:
        raise SystemExit(f"{path}: no rate for {len(missing)} graph prompts, e.g. {missing[0]!r}")
    return np.array([rate[i] for i in inp.ids], dtype=np.float64)


def parse_sets(items, where: str) -> dict:
    """KEY=VALUE strings -> {key: value parsed as the setting's flag text}; preset=NAME picks the preset."""
    from graphdiff_cli.settings import NAMES, parse_flag

    out = {}
    for item in items:
        for part in str(item).split(","):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            key = key.strip().replace("-", "_")
            if key == "preset" and sep:
                out[key] = value.strip()
                continue
            if not sep or key not in NAMES:
                raise SystemExit(f"{where}: expected KEY=VALUE with KEY a graphdiff setting ({', '.join(NAMES)}), "
                                 f"got {part!r}")
            out[key] = parse_flag(key, value.strip())
    return out


class Roster:
    """The estimators of one run: method keys, graphdiff's settings and the extra graphdiff variants; ``build()``
    gives fresh estimators (one per draw)."""

    def __init__(self, args, inp, default_keys):
        from graphdiff_cli.evaluation.methods import DISCOUNTED, load_config, parse_methods
        from graphdiff_cli.settings import resolve

        self.inp = inp
        self.keys = parse_methods(args.methods.split(",")) if args.methods else list(default_keys)
        base = load_config(None)
        overrides = parse_sets(args.graphdiff_set, "--graphdiff-set")
        preset = overrides.pop("preset", args.preset)
        self.cfg = {**base, "estimator": resolve(preset, where="--graphdiff-set", **overrides),
                    "estimator_preset": preset}
        self.variants = []
        for text in args.variant:
            name, sep, rest = text.partition(":")
            if not sep or not name.strip():
                raise SystemExit(f"--variant: expected NAME:KEY=VALUE,..., got {text!r}")
            sets = parse_sets([rest], f"--variant {name}")
            vp = sets.pop("preset", preset)
            sets = {**(overrides if vp == preset else {}), **sets}  # --graphdiff-set applies to its own preset
            self.variants.append((name.strip(), {**base, "estimator": resolve(vp, where=f"--variant {name}", **sets),
                                                 "estimator_preset": vp}))
        self.tuned = DISCOUNTED

    def build(self):
        from graphdiff_cli.evaluation.methods import build_methods

        inp = self.inp
        args = (inp.w, inp.labels, inp.k, inp.embeddings, len(inp.ids))
        methods, described = build_methods(self.keys, self.cfg, *args, tuned=self.tuned)
        for name, cfg in self.variants:
            built, desc = build_methods(["graphdiff"], cfg, *args, tuned=self.tuned)
            built[0].name = name
            methods.append(built[0])
            described[name] = desc["graphdiff"]
        return methods, described


def online_choices(m) -> dict:
    """graphdiff's online choices after its last update (kappa, label-propagation weight, time forgetting,
    nu, and any read-out choice the estimator has), where it reports them."""
    est = getattr(m, "estimator", None)
    if est is None:
        return {}
    out = {}
    names = ["kappa_", "propagation_", "time_forgetting_", "nu_"] + sorted(
        n for n in dir(type(est)) if n.startswith(("readout", "ridge")) and n.endswith("_"))
    for name in names:
        try:
            v = getattr(est, name)
        except Exception:  # noqa: BLE001 - a report nicety, never a reason to fail the bench
            continue
        if v is None or isinstance(v, (int, float, str, np.floating, np.integer)):
            out[name.rstrip("_")] = v if v is None or isinstance(v, str) else float(v)
    return out


# ----------------------------------------------------------------------------------------------------
# markdown


def fmt_ci(d: dict, digits: int = 3) -> str:
    if d.get("lo") is None or not np.isfinite(d["lo"]):
        return f"{d['mean']:.{digits}f}"
    return f"{d['mean']:.{digits}f} [{d['lo']:.{digits}f}, {d['hi']:.{digits}f}]"


def fmt_boot(d: dict, digits: int = 3) -> str:
    return fmt_ci({"mean": d["estimate"], "lo": d["lo"], "hi": d["hi"]}, digits)


def write_out(out: Path, name: str, result: dict, table: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1, default=float) + "\n")
    (out / f"{name}.md").write_text(table + "\n")
    print(table)


# ----------------------------------------------------------------------------------------------------
# cold start


def cold_start(args) -> None:
    from graphdiff_cli.evaluation.coldstart import reveal, score_cold_start, t_interval
    from graphdiff_cli.evaluation.methods import METHOD_KEYS, ORACLE_KEYS

    t0 = time.perf_counter()
    inp = load_run(args.run)
    rate = load_rates(args.rates, inp)
    log(f"{len(inp.ids):,} prompts, K = {inp.k}, read in {time.perf_counter() - t0:.1f} s")
    roster = Roster(args, inp, [k for k in METHOD_KEYS if k not in ORACLE_KEYS and k not in COLD_SKIP])
    if any(k in ORACLE_KEYS for k in roster.keys):
        raise SystemExit("oracles need a batch's own outcomes; the cold start has none to give them")
    fractions = [float(f) for f in args.fractions.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    draws, described = [], None
    for frac in fractions:
        for seed in seeds:
            plan = reveal(rate, frac, seed=seed, rollouts=args.rollouts, batch=args.batch)
            methods, described = roster.build()
            t1 = time.perf_counter()
            res = score_cold_start(methods, plan, rate)
            for m in methods:
                r = res[m.name]
                draws.append({"fraction": frac, "seed": seed, "method": m.name, "revealed": int(plan.revealed.size),
                              "steps": plan.steps, "hidden": r["hidden"], "pearson": r["pearson"], "mae": r["mae"],
                              "update_seconds": r["update_seconds"], "predict_seconds": r["predict_seconds"],
                              "online_choices": online_choices(m)})
            log(f"fraction {frac:g} seed {seed}: {plan.revealed.size:,} revealed in {plan.steps} steps, "
                f"{time.perf_counter() - t1:.1f} s; " + ", ".join(f"{m.name} r {res[m.name]['pearson']:.3f}"
                                                                  for m in methods))
    names = list(dict.fromkeys(d["method"] for d in draws))
    summary = {}
    for frac in fractions:
        summary[f"{frac:g}"] = {}
        for name in names:
            rows = [d for d in draws if d["fraction"] == frac and d["method"] == name]
            summary[f"{frac:g}"][name] = {
                "pearson": t_interval([d["pearson"] for d in rows]), "mae": t_interval([d["mae"] for d in rows]),
                "seconds": float(np.mean([d["update_seconds"] + d["predict_seconds"] for d in rows]))}
    total = time.perf_counter() - t0
    result = {"command": "cold-start", "run": str(args.run), "rates": str(args.rates), "prompts": len(inp.ids),
              "states": inp.k, "fractions": fractions, "seeds": seeds, "rollouts": args.rollouts, "batch": args.batch,
              "methods": described, "summary": summary, "draws": draws, "seconds": total,
              "interval": "mean over draws with a 95% Student-t interval (t_{0.975, draws-1} sd / sqrt(draws))"}
    lines = [f"Cold start on {len(inp.ids):,} prompts (K = {inp.k}): {len(seeds)} draws per fraction, "
             f"{args.rollouts} rollouts per revealed prompt, fed in steps of {args.batch}; every hidden prompt "
             f"scored against s/128. Mean [95% t-interval over draws]; total {total / 60:.1f} min.", "",
             "| method | " + " | ".join(f"r, {f:.0%} revealed ↑" for f in fractions) + " | "
             + " | ".join(f"MAE, {f:.0%} ↓" for f in fractions) + " | s per draw |",
             "|:---|" + "---:|" * (2 * len(fractions) + 1)]
    for name in names:
        cells = [fmt_ci(summary[f"{f:g}"][name]["pearson"]) for f in fractions] + \
                [fmt_ci(summary[f"{f:g}"][name]["mae"]) for f in fractions]
        sec = np.mean([summary[f"{f:g}"][name]["seconds"] for f in fractions])
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {sec:.1f} |")
    lines += ["", "Per draw (Pearson r / MAE):", "",
              "| method | " + " | ".join(f"{f:.0%} seed {s}" for f in fractions for s in seeds) + " |",
              "|:---|" + "---:|" * (len(fractions) * len(seeds))]
    for name in names:
        cells = []
        for f in fractions:
            for s in seeds:
                d = next(d for d in draws if d["fraction"] == f and d["seed"] == s and d["method"] == name)
                cells.append(f"{d['pearson']:.3f} / {d['mae']:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    write_out(args.out, "cold_start", result, "\n".join(lines))


# ----------------------------------------------------------------------------------------------------
# trajectory


def boot_mae(step, p, truth) -> dict:
    from graphdiff_cli.evaluation.metrics import ratio_bootstrap

    starts = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])
    rows = np.diff(np.r_[starts, step.size]).astype(np.float64)
    return ratio_bootstrap(np.add.reduceat(np.abs(p - truth), starts), rows)


def boot_within(step, p, r) -> dict:
    from graphdiff_cli.evaluation.metrics import ratio_bootstrap, within_batch_scores

    pr, _, ok = within_batch_scores(step, p, r)
    return ratio_bootstrap(np.where(ok, pr, 0.0), ok.astype(np.float64))


def trajectory(args) -> None:
    from graphdiff_cli.evaluation.metrics import mae_difference, within_r_difference
    from graphdiff_cli.evaluation.replay import replay
    from graphdiff_cli.io.readers import read_log
    from graphdiff_cli.evaluation.methods import METHOD_KEYS, ORACLE_KEYS
    from graphdiff_cli.stages.simulate import simulate_rates

    t0 = time.perf_counter()
    inp = load_run(args.run)
    log(f"{len(inp.ids):,} prompts, K = {inp.k}, read in {time.perf_counter() - t0:.1f} s")
    args.out.mkdir(parents=True, exist_ok=True)
    gen = None
    if args.log is None:
        t1 = time.perf_counter()
        skills = None if str(args.skill_groups).lower() == "none" else args.skill_groups
        gen = simulate_rates(args.out / "trajectory_prompts.jsonl", args.out / "trajectory_log.jsonl", args.rates,
                             prompts=args.prompts, batch_size=args.batch, rollouts=args.rollouts, seed=args.seed,
                             epochs=args.epochs, skill_groups=skills)
        gen["seconds"] = time.perf_counter() - t1
        args.log = args.out / "trajectory_log.jsonl"
        log(f"generated {gen['rows']:,} rows, {gen['steps']} steps in {gen['seconds']:.1f} s: mean p "
            f"{gen['mean_p_true']['first_third']:.3f} -> {gen['mean_p_true']['last_third']:.3f}")
    lg = read_log(args.log, inp.graph.index)
    if lg["p_true"] is None:
        raise SystemExit(f"{args.log}: no p_true column; the trajectory bench scores against the true p")
    roster = Roster(args, inp, [k for k in METHOD_KEYS if k not in ORACLE_KEYS])
    methods, described = roster.build()
    n_steps = int(np.unique(lg["step"]).size)
    t1 = time.perf_counter()

    def progress(done, total):
        if done % 25 == 0 or done == total:
            log(f"replayed {done}/{total} steps, {time.perf_counter() - t1:.0f} s")

    res = replay(lg["step"], lg["id"], lg["n"], lg["s"], methods, n_nodes=len(inp.ids), progress=progress)
    replay_s = time.perf_counter() - t1
    first, rate, truth = ~res.seen, res.rate, lg["p_true"]
    visits = np.bincount(res.ids, minlength=len(inp.ids))
    per = {}
    for name in res.methods:
        p = res.predictions[name]
        per[name] = {"first_visit_within_r": boot_within(res.step[first], p[first], rate[first]),
                     "within_r": boot_within(res.step, p, rate),
                     "mae": boot_mae(res.step, p, rate), "mae_true": boot_mae(res.step, p, truth),
                     "first_visit_mae_true": boot_mae(res.step[first], p[first], truth[first]),
                     "ms_per_step": float(1000 * res.seconds[name].mean()),
                     "oracle": res.oracle[name]}
    diffs = {}
    if "graphdiff" in res.methods:
        for name in res.methods:
            if name == "graphdiff" or res.oracle[name]:
                continue
            pg, po = res.predictions["graphdiff"], res.predictions[name]
            diffs[name] = {"first_visit_within_r": within_r_difference(res.step[first], pg[first], po[first],
                                                                      rate[first]),
                           "mae": mae_difference(res.step, pg, po, rate),
                           "mae_true": mae_difference(res.step, pg, po, truth)}
    noise_floor = float(np.mean(np.abs(rate - truth)))
    result = {"command": "trajectory", "run": str(args.run), "log": str(args.log), "generated": gen,
              "prompts": len(inp.ids), "states": inp.k, "rows": int(res.step.size), "steps": n_steps,
              "first_visit_rows": int(first.sum()), "max_visits": int(visits.max()),
              "observed_vs_true_mae": noise_floor, "methods": described, "per_method": per,
              "graphdiff_minus": diffs, "replay_seconds": replay_s, "seconds": time.perf_counter() - t0,
              "interval": "95% circular block bootstrap over steps (2,000 resamples, blocks of ceil(steps^(1/3)))"}
    lines = [f"Trajectory on {len(inp.ids):,} prompts (K = {inp.k}): {args.log}, {res.step.size:,} rows, {n_steps} "
             f"steps, {int(first.sum()):,} first visits, at most {int(visits.max())} visits per prompt; the observed "
             f"s/n is {noise_floor:.4f} from the true p on average. Replay {replay_s / 60:.1f} min. Estimate "
             "[95% block-bootstrap interval over steps].", "",
             "| method | within r, first visits ↑ | within r, all ↑ | MAE vs s/n ↓ | MAE vs true p ↓ | "
             "MAE vs true p, first visits ↓ | ms/step |", "|:---|---:|---:|---:|---:|---:|---:|"]
    for name in res.methods:
        d = per[name]
        mark = " †" if d["oracle"] else ""
        lines.append(f"| {name}{mark} | {fmt_boot(d['first_visit_within_r'])} | {fmt_boot(d['within_r'])} | "
                     f"{fmt_boot(d['mae'], 4)} | {fmt_boot(d['mae_true'], 4)} | {fmt_boot(d['first_visit_mae_true'], 4)}"
                     f" | {d['ms_per_step']:.1f} |")
    if diffs:
        lines += ["", "graphdiff minus each method (paired, same rows):", "",
                  "| method | Δ within r, first visits | Δ MAE vs s/n | Δ MAE vs true p |", "|:---|---:|---:|---:|"]
        for name, d in diffs.items():
            lines.append(f"| {name} | {fmt_boot(d['first_visit_within_r'])} | {fmt_boot(d['mae'], 4)} | "
                         f"{fmt_boot(d['mae_true'], 4)} |")
    write_out(args.out, "trajectory", result, "\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for name, fn in (("cold-start", cold_start), ("trajectory", trajectory)):
        p = sub.add_parser(name)
        p.set_defaults(fn=fn)
        p.add_argument("--run", type=Path, default=ROOT / "artifacts" / "deepscaler",
                       help="run folder: embeddings.zarr, graph/*.zarr, clusters/*.zarr")
        p.add_argument("--out", type=Path, required=True, help="folder for <command>.json and <command>.md")
        p.add_argument("--rates", type=Path, default=RATES, help="rows id, n, s (default: DeepScaleR's problems)")
        p.add_argument("--methods", default=None, help="comma-separated method keys (default: every fitting one)")
        p.add_argument("--preset", default="default", help="graphdiff's preset")
        p.add_argument("--graphdiff-set", action="append", default=[], metavar="KEY=VALUE",
                       help="a graphdiff setting overriding the preset (repeatable, or comma-separated)")
        p.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                       help="an extra graphdiff estimator named NAME with these settings (repeatable)")
        p.add_argument("--rollouts", type=int, default=8)
        p.add_argument("--batch", type=int, default=256)
        if name == "cold-start":
            p.add_argument("--fractions", default="0.02,0.1,0.3")
            p.add_argument("--seeds", default="0,1,2")
        else:
            p.add_argument("--log", type=Path, default=None, help="a log with p_true (default: generate one "
                           "under --out with graphdiff simulate --rates)")
            p.add_argument("--skill-groups", default=None, help="clusters artifact of the skill groups, or 'none' "
                           "(default: RUN/skills/*.zarr)")
            p.add_argument("--epochs", type=int, default=3)
            p.add_argument("--prompts", type=int, default=None, help="train on a seeded subset of this many "
                           "problems (the graph keeps the whole pool; default: all)")
            p.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.command == "trajectory" and args.log is None and args.skill_groups is None:
        args.skill_groups = run_file(args.run, "skills/*.zarr")
    args.fn(args)


if __name__ == "__main__":
    main()
