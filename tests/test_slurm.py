"""The workflow submitted for real through the SLURM profile (configs/profiles/slurm) and
snakemake-executor-plugin-slurm: a small run whose jobs go through sbatch to whatever SLURM answers on
this machine (scripts/slurm-single-node.sh starts a one-node cluster). Skips, saying why, without sbatch,
without a controller that answers, without an idle node, or without the plugin."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
PROFILE = REPO / "configs" / "profiles" / "slurm"

pytestmark = pytest.mark.slow


def _ask(*cmd: str) -> str:
    """A SLURM client command's output; skips the test when no controller answers it."""
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        res = subprocess.CompletedProcess(cmd, 1, "", "no answer in 30 s")
    if res.returncode != 0:
        said = (res.stderr.strip() or res.stdout.strip()).splitlines()[:1]
        pytest.skip(f"no SLURM controller answers ({cmd[0]}: {' '.join(said)}; scripts/slurm-single-node.sh start)")
    return res.stdout


@pytest.fixture
def site_overlay(tmp_path) -> Path:
    """The site values of the cluster that answers, laid over the repository's profile as a second
    --profile: its default partition for every job, no account (none is needed without accounting),
    no GPU request, threads capped at a node's CPUs, job states from squeue, the jobs' SLURM logs kept."""
    if shutil.which("sbatch") is None:
        pytest.skip("sbatch not found: no SLURM on this machine (scripts/slurm-single-node.sh start sets one up)")
    pytest.importorskip("snakemake_executor_plugin_slurm", reason="snakemake-executor-plugin-slurm not installed")
    _ask("scontrol", "ping")  # fails at once where sinfo retries for 10-20 s first
    lines = [line.split() for line in _ask("sinfo", "-h", "-o", "%P %t %c").splitlines() if line.strip()]
    default = next((p.rstrip("*") for p, _, _ in lines if p.endswith("*")), None)
    ready = [int(c) for p, t, c in lines if p.rstrip("*") == default and t in ("idle", "mix")]
    if default is None or not ready:
        pytest.skip(f"no idle node in a default SLURM partition (sinfo: {lines})")

    profile = yaml.safe_load((PROFILE / "config.yaml").read_text())
    defaults = {k: v for k, v in profile["default-resources"].items() if k != "slurm_account"}
    overlay = {
        "default-resources": {**defaults, "slurm_partition": default},
        "set-resources": {rule: {**res, "slurm_partition": default, "gpu": 0}
                          for rule, res in profile["set-resources"].items()},
        "max-threads": max(ready),
        "slurm-status-command": "squeue",
        "slurm-init-seconds-before-status-checks": 3,
        "slurm-keep-successful-logs": True,
    }
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(overlay), encoding="utf-8")
    return folder


def test_a_small_run_goes_through_slurm(tmp_path, site_overlay):
    """60 prompts x 6 steps, the STATE and the replay: every job but the local ones is an sbatch job
    that completed, and the artifacts are those of the run."""
    work = tmp_path / "run"
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "run": "tiny", "source": {"simulate": {"prompts": 60, "steps": 6, "batch_size": 16}},
        "graph": {"k_nn": 8}, "cluster": {"states": 4},
        "embed": {"device": "cpu"}, "estimator": {"device": "cpu"}, "evaluate": {"enabled": False},
        "threads": {"embed": 1, "graph": 1, "cluster": 1, "estimate": 1},  # side by side on a 2-CPU node
    }), encoding="utf-8")
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    cmd = [str(VENV_BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(work),
           "--configfile", str(REPO / "configs" / "default.yaml"), str(config),
           "--profile", str(PROFILE), "--profile", str(site_overlay)]
    started = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    out = res.stdout + res.stderr
    assert res.returncode == 0, f"{' '.join(cmd)}\n{out[-6000:]}"

    # every job went to SLURM: one sbatch id per job run, and SLURM says each completed
    submitted = dict(re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", out))
    rules = re.findall(r"^rule (\w+):", out, flags=re.M)  # the jobs not run locally (localrule ...)
    assert set(rules) >= {"simulate", "embed", "build_graph", "cluster", "init_state", "replay"}, rules
    assert len(submitted) == len(rules), (submitted, rules)
    logs = work / "logs" / "slurm"  # slurmd writes each job's output to the log the plugin named by its id
    assert all(list(logs.rglob(f"{i}.log")) for i in submitted.values()), (sorted(logs.rglob("*.log")), submitted)
    # squeue still knows the jobs that ended within MinJobAge (300 s by default): each says COMPLETED
    known = dict(line.split() for line in subprocess.run(["squeue", "--states=all", "-h", "-o", "%i %T"],
                                                       capture_output=True, text=True, check=True).stdout.splitlines())
    ours = {i: known[i] for i in submitted.values() if i in known}
    assert ours and set(ours.values()) == {"COMPLETED"}, ours

    # the artifacts: the STATE a trainer starts from and the log replayed through graphdiff watch
    art = work / "artifacts" / "tiny"
    status = json.loads(subprocess.run([str(VENV_BIN / "graphdiff"), "status", "--state", str(art / "STATE"),
                                        "--json"], capture_output=True, text=True, check=True).stdout)
    assert status["step"] == 0 and status["n_prompts"] == 60 and status["states"] == 4
    watched = json.loads((art / "replay" / "watch.json").read_text())
    assert [a["step"] for a in watched["applied"]] == list(range(1, 7))
    preds = [json.loads(r) for r in (art / "replay" / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 60 and sum(p["n_seen"] for p in preds) == 6 * 16 * 8
    print(f"{len(submitted)} SLURM jobs in {time.monotonic() - started:.0f} s")
