"""``python -m closedloop {data,graph,sft,run,keep,report,verdicts}``: the closed-loop benchmark's stages.

    python -m closedloop data   --out artifacts/closedloop/data
    python -m closedloop graph  --data artifacts/closedloop/data --out artifacts/closedloop/graph
    python -m closedloop sft    --data artifacts/closedloop/data --seed 0 --out artifacts/closedloop/policy/s0
    python -m closedloop run    --data ... --state artifacts/closedloop/graph/STATE --policy ... \\
                                              --scheduler gd-thompson --seed 0 --out artifacts/closedloop/runs/gd-thompson/s0
    python -m closedloop keep   --art artifacts/closedloop --store results/closedloop --policy-seed 0
    python -m closedloop report --runs artifacts/closedloop/runs --out artifacts/closedloop/report
    python -m closedloop verdicts artifacts/grid-a/report artifacts/grid-b/report --out verdicts.md

Run from the repository root (or with it on PYTHONPATH). The whole grid: ``snakemake --cores all
closedloop --configfile configs/closedloop.yaml`` (targets before ``--configfile``, which takes every
word after it) (workflow/rules/closedloop.smk), whose `closedloop:`
section (workflow/schemas/config.schema.yaml) gives every stage its flags. Errors (``graphdiff_cli.errors``,
a failed graphdiff command) end the stage with one line on stderr and the error's exit code.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from graphdiff_cli.errors import ArtifactError, GraphdiffError, InvalidArgumentError, StateError


def _write_jsonl(path: Path, rows) -> None:
    from graphdiff_cli.io.atomic import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def _read_jsonl(path) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text(encoding="utf-8").splitlines() if x.strip()]


def _graphdiff_exe() -> str:
    return shutil.which("graphdiff") or str(Path(sys.executable).with_name("graphdiff"))


def _graphdiff(gd: str, args) -> None:
    """Run one graphdiff command; its own one-line error is already on stderr when it fails."""
    res = subprocess.run([gd, "-q", *args])
    if res.returncode != 0:
        raise GraphdiffError(f"graphdiff {args[0]} failed (exit {res.returncode}; its error is above)")


def cmd_data(a) -> None:
    from .tasks import make_splits

    train, test, sft = make_splits(a.train_per_cell, a.test_per_cell, a.sft_per_cell, seed=a.seed,
                                   sft_noise=(a.sft_noise_min, a.sft_noise_max),
                                   skills=[x for x in a.skills.split(",") if x])
    out = Path(a.out)
    _write_jsonl(out / "train.jsonl", train)
    _write_jsonl(out / "test.jsonl", test)
    _write_jsonl(out / "sft.jsonl", sft)
    _write_jsonl(out / "prompts.jsonl", [{"id": r["id"], "prompt": r["prompt"]} for r in train])
    print(json.dumps({"train": len(train), "test": len(test), "sft": len(sft), "out": str(out)}))


def cmd_graph(a) -> None:
    """The normal pipeline on the training pool: embed (bundled MiniLM) -> build-graph -> cluster -> init."""
    gd = _graphdiff_exe()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(a.data)
    timings = {}

    def step(name, args):
        t0 = time.perf_counter()
        _graphdiff(gd, args)
        timings[name] = time.perf_counter() - t0

    for p in ("emb.zarr", "graph.zarr", "clusters.zarr", "STATE"):
        if (out / p).exists():
            shutil.rmtree(out / p)
    step("embed", ["embed", str(data / "prompts.jsonl"), "--out", str(out / "emb.zarr"), "--device", "cpu"])
    step("build-graph", ["build-graph", str(out / "emb.zarr"), "--out", str(out / "graph.zarr"), "--k-nn", str(a.k_nn),
                         "--device", "cpu"])
    cl = ["cluster", str(out / "graph.zarr"), "--out", str(out / "clusters.zarr"), "--seed", str(a.cluster_seed)]
    if a.states != "auto":
        cl += ["--states", str(a.states)]
    step("cluster", cl)
    step("init", ["init", "--graph", str(out / "graph.zarr"), "--clusters", str(out / "clusters.zarr"),
                  "--out", str(out / "STATE"), "--preset", a.preset, "--device", "cpu"])
    # node order of the STATE must be the training pool's row order (the loop maps row i to node i)
    t0 = time.perf_counter()
    _graphdiff(gd, ["predict", "--state", str(out / "STATE"), "--out", str(out / "predictions0.jsonl")])
    timings["predict"] = time.perf_counter() - t0
    pred_ids = [r["id"] for r in _read_jsonl(out / "predictions0.jsonl")]
    train_ids = [r["id"] for r in _read_jsonl(data / "train.jsonl")]
    if pred_ids != train_ids:
        raise StateError(f"{out / 'STATE'}: its node order is not the training pool's row order")
    summary = {"prompts": len(train_ids), "k_nn": a.k_nn, "states": a.states, "preset": a.preset,
               "seconds": timings}
    (out / "graph.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))


def cmd_sft(a) -> None:
    import numpy as np
    import torch

    from .policy import build_model, build_tokenizer, greedy_accuracy, pass_counts, save_policy, supervised_warmup
    from .tasks import alphabet

    torch.set_num_threads(a.threads)
    data = Path(a.data)
    train, test, sft = (_read_jsonl(data / f) for f in ("train.jsonl", "test.jsonl", "sft.jsonl"))
    tok = build_tokenizer(alphabet(train + test + sft))
    model = build_model(tok, hidden=a.hidden, layers=a.layers, heads=a.heads, intermediate=2 * a.hidden, seed=a.seed)
    t0 = time.perf_counter()
    log = supervised_warmup(model, tok, sft, steps=a.steps, batch_size=a.batch_size, lr=a.lr, seed=a.seed,
                            log_every=50)
    sft_seconds = time.perf_counter() - t0
    acc, ok = greedy_accuracy(model, tok, test)
    t1 = time.perf_counter()
    c = pass_counts(model, tok, train, n=8, seed=a.seed)
    pass_seconds = time.perf_counter() - t1
    cells = {}
    for r, k in zip(test, ok):
        cells.setdefault(f"{r['skill']}{r['level']}", []).append(float(k))
    out = Path(a.out)
    save_policy(model, tok, out)
    summary = {"seed": a.seed, "steps": a.steps, "parameters": int(sum(p.numel() for p in model.parameters())),
               "sft_seconds": sft_seconds, "heldout_acc": acc,
               "heldout_acc_by_cell": {k: float(np.mean(v)) for k, v in cells.items()},
               "train_pass_histogram_8": np.bincount(c, minlength=9).tolist(),
               "train_effective_rate_8": float(np.mean((c > 0) & (c < 8))),
               "train_pass_seconds": pass_seconds, "loss_log": log}
    (out / "sft.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k not in ("loss_log", "heldout_acc_by_cell")}))


def _device(name: str) -> str:
    if name == "cpu":
        return "cpu"
    import torch

    if torch.cuda.is_available():
        if torch.cuda.device_count() > 1:  # TRL's Trainer would wrap the model in DataParallel and scale the batch
            raise InvalidArgumentError(f"--device {name}: {torch.cuda.device_count()} GPUs are visible; give each run "
                                       "one (CUDA_VISIBLE_DEVICES=i), as bench/closedloop_batch.py does")
        return "cuda"
    if name == "cuda":
        raise InvalidArgumentError("--device cuda: no GPU is visible to torch (use --device cpu or auto)")
    return "cpu"


def _rollout_budget(a) -> int:
    """--rollout-budget, or the rollouts of the finished run named by --rollout-budget-from (its summary.json)."""
    if a.rollout_budget_from:
        path = Path(a.rollout_budget_from) / "summary.json"
        if not path.is_file():
            raise InvalidArgumentError(f"--rollout-budget-from: {path} does not exist (that run has not finished)")
        return int(json.loads(path.read_text(encoding="utf-8"))["rollouts"])
    if a.rollout_budget < 0:
        raise InvalidArgumentError(f"--rollout-budget must be >= 0, got {a.rollout_budget}")
    return int(a.rollout_budget)


def cmd_run(a) -> None:
    from .loop import RunConfig, run

    data = Path(a.data)
    train, test = _read_jsonl(data / "train.jsonl"), _read_jsonl(data / "test.jsonl")
    if a.test_limit:
        test = test[:: max(1, len(test) // a.test_limit)][: a.test_limit]
    cfg = RunConfig(scheduler=a.scheduler, seed=a.seed, steps=a.steps, batch_prompts=a.batch_prompts,
                    group_size=a.group_size, pool_factor=a.pool_factor, max_rounds=a.max_rounds,
                    oracle_samples=a.oracle_samples,
                    alloc_group=a.group_size // 2, learning_rate=a.lr, eval_every=a.eval_every,
                    eval_samples=a.eval_samples, threads=a.threads, device=_device(a.device),
                    rollout_budget=_rollout_budget(a))
    if a.store:
        from dataclasses import asdict

        from . import store

        inputs = store.fingerprint(data, a.policy, a.state, test_limit=a.test_limit)
        reused, why = store.reuse(a.store, cfg.scheduler, cfg.seed, asdict(cfg), inputs, a.out)
        print(f"closedloop run: {why}", file=sys.stderr)
        if reused:
            summary = json.loads((Path(a.out) / "summary.json").read_text(encoding="utf-8"))
            print(json.dumps({k: v for k, v in summary.items() if k != "config"}))
            return
    factory = None
    if a.state:
        from graphdiff_cli.estimator import Estimator

        state = Path(a.state)
        factory = lambda: Estimator.load(state, device="cpu")  # noqa: E731 - a fresh estimator at step 0
    summary = run(cfg, train, test, a.policy, a.out, graphdiff_factory=factory)
    if a.store:  # the run is finished whatever happens here: a store that cannot take it does not fail it
        try:
            kept = store.keep(a.store, cfg.scheduler, cfg.seed, a.out, inputs, commit=store.commit_of(__file__))
            print(f"closedloop run: kept in {kept}", file=sys.stderr)
        except OSError as exc:
            print(f"closedloop run: warning: the run is not kept in {a.store} ({exc}); keep it later with "
                  "`python -m closedloop keep`", file=sys.stderr)
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}))


def cmd_keep(a) -> None:
    from . import store

    art = Path(a.art)
    for need in (art / "data" / "train.jsonl", art / "data" / "test.jsonl", art / "graph" / "STATE"):
        if not need.exists():
            raise InvalidArgumentError(f"--art: {need} does not exist (a grid's artifacts folder holds data/, "
                                       "graph/STATE, policy/ and runs/)")
    if a.test_limit < 0:
        raise InvalidArgumentError(f"--test-limit must be >= 0, got {a.test_limit}")
    runs = sorted((art / "runs").glob("*/s*/summary.json"))
    kept, commit, prints = [], a.commit or store.commit_of(__file__), {}
    for path in runs:
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ArtifactError(f"{path} is not a finished run's summary ({exc})") from None
        cfg = summary.get("config", {})
        scheduler, seed = cfg.get("scheduler"), cfg.get("seed")
        if scheduler is None or seed is None:
            raise StateError(f"{path} has no config.scheduler/seed: not a closed-loop run's summary")
        policy = art / "policy" / f"s{seed if a.policy_seed is None else a.policy_seed}"
        if not policy.is_dir():
            raise InvalidArgumentError(f"{policy} does not exist (give --policy-seed for a grid with one shared "
                                       "warm start)")
        if policy not in prints:  # the data and STATE are the grid's, the warm start one of a few
            prints[policy] = store.fingerprint(art / "data", policy, art / "graph" / "STATE", test_limit=a.test_limit)
        inputs = prints[policy]
        try:
            kept.append(str(store.keep(a.store, scheduler, int(seed), path.parent, inputs, commit=commit)))
        except OSError as exc:
            raise ArtifactError(f"cannot keep {path.parent} in {a.store}: {exc}") from None
    print(json.dumps({"kept": len(kept), "store": str(a.store)}))


def cmd_report(a) -> None:
    from .report import write_report

    res = write_report(a.runs, a.out, sft_dir=a.sft)
    print(json.dumps(res))


def cmd_verdicts(a) -> None:
    from .verdicts import write

    names = tuple(x.strip() for x in a.names.split(",")) if a.names else None
    if names is not None and (len(names) != 2 or not all(names)):
        raise InvalidArgumentError(f"--names takes two comma-separated names, got {a.names!r}")
    print(json.dumps(write(a.reports[0], a.reports[1], a.out, names=names, json_out=a.json)))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m closedloop", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("data", help="generate the training pool, held-out test set and SFT data")
    d.add_argument("--out", required=True)
    d.add_argument("--train-per-cell", type=int, default=100)
    d.add_argument("--test-per-cell", type=int, default=24)
    d.add_argument("--sft-per-cell", type=int, default=200)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--sft-noise-min", type=float, default=0.0,
                   help="systematic wrong-answer rate of the SFT data's least noisy (skill, level) cell")
    d.add_argument("--sft-noise-max", type=float, default=0.0, help="... and of its noisiest cell")
    d.add_argument("--skills", default="add,compare,reverse,sort,count,parity",
                   help="comma-separated skills of the task family (tasks.SKILLS), each at every level")
    d.set_defaults(fn=cmd_data)

    g = sub.add_parser("graph", help="embed, build the graph, cluster and init a STATE (graphdiff CLI)")
    g.add_argument("--data", required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--k-nn", type=int, default=30)
    g.add_argument("--states", default="auto")
    g.add_argument("--cluster-seed", type=int, default=0)
    g.add_argument("--preset", default="default")
    g.set_defaults(fn=cmd_graph)

    s = sub.add_parser("sft", help="build the policy and warm-start it by supervised training")
    s.add_argument("--data", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--steps", type=int, default=600)
    s.add_argument("--batch-size", type=int, default=64)
    s.add_argument("--lr", type=float, default=2e-3)
    s.add_argument("--hidden", type=int, default=128)
    s.add_argument("--layers", type=int, default=3)
    s.add_argument("--heads", type=int, default=4)
    s.add_argument("--threads", type=int, default=1)
    s.set_defaults(fn=cmd_sft)

    r = sub.add_parser("run", help="one GRPO run of one scheduler")
    r.add_argument("--data", required=True)
    r.add_argument("--policy", required=True)
    r.add_argument("--state", default=None, help="graphdiff STATE at step 0 (needed by the gd-* schedulers)")
    r.add_argument("--scheduler", required=True)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", required=True)
    r.add_argument("--steps", type=int, default=40)
    r.add_argument("--batch-prompts", type=int, default=16)
    r.add_argument("--group-size", type=int, default=8)
    r.add_argument("--pool-factor", type=float, default=4.0)
    r.add_argument("--max-rounds", type=int, default=8,
                   help="dynamic sampling: at most this many generation rounds of B prompts per step")
    r.add_argument("--oracle-samples", type=int, default=32,
                   help="oracle arms: completions per measured candidate (not rollouts, not trained on; >= 32)")
    r.add_argument("--lr", type=float, default=5e-4)
    r.add_argument("--eval-every", type=int, default=5)
    r.add_argument("--test-limit", type=int, default=0, help="evaluate on this many held-out prompts (0 = all)")
    r.add_argument("--eval-samples", type=int, default=4,
                   help="also the held-out mean pass rate over this many sampled completions (0 = greedy only)")
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"),
                   help="where the policy runs (training, rollouts, evaluation, the oracle's measurement); auto: "
                        "cuda when a GPU is visible, else cpu")
    budget = r.add_mutually_exclusive_group()
    budget.add_argument("--rollout-budget", type=int, default=0,
                        help="the uncensored regime: stop at the first step whose cumulative rollouts reach this "
                             "many (--steps is then the step cap, stated beforehand); 0: run --steps")
    budget.add_argument("--rollout-budget-from", default=None, metavar="RUN",
                        help="... this many: the rollouts of a finished run's folder (e.g. runs/ds/s0)")
    r.add_argument("--store", default=None, metavar="DIR",
                   help="keep the finished run in DIR/runs/<scheduler>/s<seed>/ and, before training, reuse the run "
                        "kept there when its configuration and inputs (data, policy, STATE) match (closedloop/store.py)")
    r.set_defaults(fn=cmd_run)

    k = sub.add_parser("keep", help="keep an artifacts folder's finished runs in a store (as run --store does)")
    k.add_argument("--art", required=True, help="the grid's artifacts folder (data/, graph/STATE, policy/, runs/)")
    k.add_argument("--store", required=True, metavar="DIR")
    k.add_argument("--policy-seed", type=int, default=None,
                   help="the warm start every run started from (policy/s<N>; a shared SFT: 0); default: the run's seed")
    k.add_argument("--test-limit", type=int, default=0,
                   help="the runs' --test-limit (train.test_limit), part of their inputs; 0: the whole held-out set")
    k.add_argument("--commit", default=None,
                   help="the commit whose code ran these runs, recorded with them (default: this checkout's)")
    k.set_defaults(fn=cmd_keep)

    rp = sub.add_parser("report", help="aggregate runs: table, sign test, plots")
    rp.add_argument("--runs", required=True, help="folder of runs/<scheduler>/s<seed>/")
    rp.add_argument("--out", required=True)
    rp.add_argument("--sft", default=None, help="folder of policy/s<seed>/ (SFT summaries)")
    rp.set_defaults(fn=cmd_report)

    v = sub.add_parser("verdicts", help="two reports' verdicts side by side: which figures flip between grids")
    v.add_argument("reports", nargs=2, metavar="REPORT", help="folders written by `report` (their metrics.json)")
    v.add_argument("--out", required=True, help="markdown file")
    v.add_argument("--json", default=None, help="also the pairing as JSON, to this file")
    v.add_argument("--names", default=None, help="the two grids' names, comma-separated (default: their parents)")
    v.set_defaults(fn=cmd_verdicts)

    a = p.parse_args(argv)
    try:
        a.fn(a)
    except GraphdiffError as exc:  # the one error boundary: one line and the error's exit code
        print(f"closedloop {a.cmd}: error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None


if __name__ == "__main__":
    main()
