"""Kept closed-loop runs (closedloop/store.py): a run is reused only when its configuration and inputs match.

A CPU grid outlives its machine; `run --store DIR` keeps each finished run with the fingerprint of what it started
from and reuses it on a fresh clone instead of training it again. Checked on a real STATE directory written by the
product: the fingerprint ignores file metadata and the SFT's timing summary but moves with one changed byte of
data or weights, one more estimator step, or another configuration; a reused run is a copy of the kept files; a
kept run is replaced whole; `keep` and `run --store` through the command line (no training: the run is reused).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from closedloop import store

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {"scheduler": "gd-ds", "seed": 1, "steps": 80, "batch_prompts": 32, "rollout_budget": 0, "device": "cpu"}


def _state(root: Path, steps: int = 0) -> Path:
    """A STATE directory over a ring of 12 prompts in 3 cells, advanced ``steps`` steps."""
    from graphdiff_cli import Estimator
    from graphdiff_cli.io.state_dir import StateDir

    n = 12
    i = np.arange(n)
    w = sp.coo_matrix((np.full(n, 0.7), (i, (i + 1) % n)), shape=(n, n)).tocsr()
    w = (w + w.T).tocsr()
    est = Estimator(w, np.repeat(np.arange(3), 4), n_states=3)
    sd = StateDir.create(root, est.state_dict(), [f"p{k}" for k in range(n)], durable=False)
    for _ in range(steps):
        est.update(np.arange(4), np.full(4, 8), np.array([0, 3, 8, 5]))
        sd.commit_step(est.state_dict(), {"kind": "update"}, durable=False)
    return root


def _inputs(tmp_path: Path):
    data, policy = tmp_path / "data", tmp_path / "policy" / "s0"
    data.mkdir()
    policy.mkdir(parents=True)
    for name in ("train.jsonl", "test.jsonl"):
        (data / name).write_text('{"id": "p0", "prompt": "1<2?", "answer": "yes"}\n')
    (policy / "model.safetensors").write_bytes(bytes(range(256)))
    (policy / "config.json").write_text('{"hidden": 32}\n')
    (policy / "sft.json").write_text('{"wall_seconds": 12.5}\n')
    return data, policy, _state(tmp_path / "graph" / "STATE")


def _finished_run(path: Path, config: dict) -> Path:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text('{"step": 0, "heldout_acc": 0.41}\n{"step": 5, "heldout_acc": 0.44}\n')
    (path / "outcomes.jsonl").write_text('{"step": 1, "ids": ["p0"], "n": [8], "s": [3]}\n')
    (path / "summary.json").write_text(json.dumps({"config": config, "rollouts": 2560, "steps": 80}) + "\n")
    return path


def test_a_kept_run_is_reused_only_with_the_same_configuration_and_inputs(tmp_path):
    data, policy, state = _inputs(tmp_path)
    inputs = store.fingerprint(data, policy, state)
    assert set(inputs) == {"data", "policy", "state"}
    assert store.fingerprint(data, policy, state) == inputs  # the same files, read again
    run = _finished_run(tmp_path / "art" / "runs" / "gd-ds" / "s1", CONFIG)
    kept = store.keep(tmp_path / "store", "gd-ds", 1, run, inputs, commit="abc1234")
    assert kept == tmp_path / "store" / "runs" / "gd-ds" / "s1"
    assert sorted(p.name for p in kept.iterdir()) == sorted([*store.RUN_FILES, store.INPUTS])

    out = tmp_path / "fresh" / "runs" / "gd-ds" / "s1"
    reused, why = store.reuse(tmp_path / "store", "gd-ds", 1, dict(CONFIG), inputs, out)
    assert reused and "abc1234" in why
    for name in store.RUN_FILES:
        assert (out / name).read_bytes() == (run / name).read_bytes()

    # the SFT's timing summary, hidden files (Snakemake's stamp in a directory output) and the files' times are
    # not inputs ...
    (policy / "sft.json").write_text('{"wall_seconds": 99.0}\n')
    (policy / ".snakemake_timestamp").write_text("")
    assert store.fingerprint(data, policy, state) == inputs
    # ... but a byte of the weights, of the data, or one more estimator step are
    before = inputs
    for change, part in ((lambda: (policy / "model.safetensors").write_bytes(bytes(range(255)) + b"\x00"), "policy"),
                         (lambda: (data / "test.jsonl").write_text('{"id": "p0", "prompt": "2<1?", "answer": "no"}\n'),
                          "data")):
        change()
        moved = store.fingerprint(data, policy, state)
        assert moved[part] != before[part] and all(moved[k] == before[k] for k in inputs if k != part)
        before = moved
        reused, why = store.reuse(tmp_path / "store", "gd-ds", 1, dict(CONFIG), moved, tmp_path / "other")
        assert not reused and part in why and not (tmp_path / "other").exists()
    # which held-out prompts a run evaluates (run --test-limit) is not in its configuration: an input where not 0
    assert store.fingerprint(data, policy, state, test_limit=0) == before
    limited = store.fingerprint(data, policy, state, test_limit=50)
    assert limited == {**before, "test_limit": 50}
    reused, why = store.reuse(tmp_path / "store", "gd-ds", 1, dict(CONFIG), limited, tmp_path / "other")
    assert not reused and "test_limit" in why
    stepped = store.fingerprint(data, policy, _state(tmp_path / "stepped", steps=1))["state"]
    assert stepped != inputs["state"]
    assert store.fingerprint(data, policy, _state(tmp_path / "again"))["state"] == inputs["state"]  # rebuilt

    # another configuration, another seed or scheduler: trained again
    reused, why = store.reuse(tmp_path / "store", "gd-ds", 1, {**CONFIG, "steps": 240}, inputs, tmp_path / "x")
    assert not reused and "steps" in why
    assert not store.reuse(tmp_path / "store", "gd-ds", 2, dict(CONFIG), inputs, tmp_path / "x")[0]
    assert not store.reuse(tmp_path / "store", "ds", 1, dict(CONFIG), inputs, tmp_path / "x")[0]


def test_a_reused_run_replaces_what_its_folder_held_and_an_unreadable_kept_run_is_trained_again(tmp_path):
    """Reuse into a folder an earlier attempt wrote to: none of that attempt's files remain beside the kept ones,
    and no staging file is left; a kept run whose summary cannot be read is not reused (trained again)."""
    data, policy, state = _inputs(tmp_path)
    inputs = store.fingerprint(data, policy, state)
    run = _finished_run(tmp_path / "a", CONFIG)
    (run / "outcomes.jsonl").unlink()  # a kept run without outcomes
    store.keep(tmp_path / "store", "gd-ds", 1, run, inputs)
    out = tmp_path / "out"
    out.mkdir()
    (out / "outcomes.jsonl").write_text('{"step": 1, "ids": ["stale"]}\n')
    (out / "metrics.jsonl").write_text('{"step": 0, "heldout_acc": 0.0}\n')
    assert store.reuse(tmp_path / "store", "gd-ds", 1, dict(CONFIG), inputs, out)[0]
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl", "summary.json"]
    assert (out / "metrics.jsonl").read_bytes() == (run / "metrics.jsonl").read_bytes()
    kept = store.kept_dir(tmp_path / "store", "gd-ds", 1)
    (kept / "summary.json").write_text('{"config": {"sched')  # cut short
    reused, why = store.reuse(tmp_path / "store", "gd-ds", 1, dict(CONFIG), inputs, tmp_path / "other")
    assert not reused and "cannot be read" in why and not (tmp_path / "other").exists()


def test_keeping_again_replaces_the_kept_run_whole(tmp_path):
    data, policy, state = _inputs(tmp_path)
    inputs = store.fingerprint(data, policy, state)
    first = _finished_run(tmp_path / "a", CONFIG)
    store.keep(tmp_path / "store", "gd-ds", 1, first, inputs)
    second = _finished_run(tmp_path / "b", CONFIG)
    (second / "outcomes.jsonl").unlink()  # a run that wrote no outcomes: nothing of the first may remain
    (second / "summary.json").write_text(json.dumps({"config": CONFIG, "rollouts": 999}) + "\n")
    kept = store.keep(tmp_path / "store", "gd-ds", 1, second, inputs)
    assert json.loads((kept / "summary.json").read_text())["rollouts"] == 999
    assert not (kept / "outcomes.jsonl").exists()
    assert [p.name for p in kept.parent.iterdir()] == ["s1"]  # no staging or old folder left beside it
    unfinished = tmp_path / "c"
    unfinished.mkdir()
    (unfinished / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(FileNotFoundError, match="has not finished"):
        store.keep(tmp_path / "store", "gd-ds", 1, unfinished, inputs)
    assert json.loads((kept / "summary.json").read_text())["rollouts"] == 999


def _closedloop(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "closedloop", *args], capture_output=True, text=True, cwd=cwd)


def test_keep_and_run_with_a_store_from_the_command_line(tmp_path):
    """`keep` stores an artifacts folder's finished runs; `run --store` then reuses the one whose configuration
    is the run's own (that of `run`'s flags) without training, and says so."""
    data, policy, state = _inputs(tmp_path)
    flags = {"scheduler": "ds", "seed": 0, "steps": 3, "batch_prompts": 4, "group_size": 4, "pool_factor": 4.0,
             "max_rounds": 8, "oracle_samples": 32, "lr": 5e-4, "eval_every": 5, "eval_samples": 4, "threads": 1}
    from closedloop.loop import RunConfig
    from dataclasses import asdict

    config = asdict(RunConfig(scheduler="ds", seed=0, steps=3, batch_prompts=4, group_size=4, pool_factor=4.0,
                              max_rounds=8, oracle_samples=32, alloc_group=2, learning_rate=5e-4, eval_every=5,
                              eval_samples=4, threads=1, device="cpu", rollout_budget=0))
    _finished_run(tmp_path / "runs" / "ds" / "s0", config)
    head = lambda: subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],  # noqa: E731
                                  capture_output=True, text=True)
    before = head()
    res = _closedloop("keep", "--art", str(tmp_path), "--store", str(tmp_path / "store"), "--policy-seed", "0")
    after = head()
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["kept"] == 1
    if before.returncode == 0:  # a checkout (not an unpacked sdist): the commit that kept it is recorded (one
        # made beside this test while it runs may have moved HEAD: either is this checkout's)
        kept_at = json.loads((tmp_path / "store" / "runs" / "ds" / "s0" / "inputs.json").read_text())["commit"]
        assert kept_at in (before.stdout.strip(), after.stdout.strip())

    out = tmp_path / "fresh"
    args = ["run", "--data", str(data), "--policy", str(policy), "--state", str(state), "--out", str(out),
            "--store", str(tmp_path / "store"), "--device", "cpu"]
    for key, value in flags.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    res = _closedloop(*args)
    assert res.returncode == 0, res.stderr
    assert "reused the kept run" in res.stderr
    assert json.loads(res.stdout)["rollouts"] == 2560
    assert (out / "summary.json").read_bytes() == (tmp_path / "runs" / "ds" / "s0" / "summary.json").read_bytes()

    res = _closedloop("keep", "--art", str(tmp_path), "--store", str(tmp_path / "store"),  # policy/s<seed>: s0
                      "--commit", "0259610")
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "store" / "runs" / "ds" / "s0" / "inputs.json").read_text())["commit"] == "0259610"
    bad = _closedloop("keep", "--art", str(tmp_path), "--store", str(tmp_path / "store"), "--policy-seed", "7")
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "policy/s7" in bad.stderr
    bad = _closedloop("keep", "--art", str(tmp_path / "runs"), "--store", str(tmp_path / "store"))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "train.jsonl" in bad.stderr
    (tmp_path / "runs" / "ds" / "s0" / "summary.json").write_text("{")
    bad = _closedloop("keep", "--art", str(tmp_path), "--store", str(tmp_path / "store"), "--policy-seed", "0")
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "summary.json" in bad.stderr

    # runs evaluated on fewer held-out prompts (--test-limit): kept and reused as such, on both sides
    (tmp_path / "runs" / "ds" / "s0" / "summary.json").write_text(json.dumps({"config": config, "rollouts": 7}))
    res = _closedloop("keep", "--art", str(tmp_path), "--store", str(tmp_path / "limited"), "--policy-seed", "0",
                      "--test-limit", "1")
    assert res.returncode == 0, res.stderr
    kept = json.loads((tmp_path / "limited" / "runs" / "ds" / "s0" / "inputs.json").read_text())["inputs"]
    assert kept["test_limit"] == 1
    limited = [x if x != str(tmp_path / "store") else str(tmp_path / "limited") for x in args]
    res = _closedloop(*[x if x != str(out) else str(tmp_path / "fresh-limited") for x in limited], "--test-limit", "1")
    assert res.returncode == 0 and "reused the kept run" in res.stderr, res.stderr
    assert json.loads(res.stdout)["rollouts"] == 7
