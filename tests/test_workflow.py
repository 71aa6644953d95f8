"""The Snakemake workflow: lint, a dry run of every config (and the SLURM profile, and sharded
embedding), clear failures for missing data, the grid's comparison table, and one real small run of
the default workflow. Every run happens in a temporary working directory (``-d``), never in the repo."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = REPO / ".venv" / "bin" / "snakemake"
CONFIGS = REPO / "configs"


def smk(workdir: Path, *configfiles, args=(), check=True, timeout=300) -> subprocess.CompletedProcess:
    """snakemake on the repo's Snakefile in ``workdir``; configs/default.yaml first, then ``configfiles``."""
    env = dict(os.environ)
    env["PATH"] = f"{REPO / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    cmd = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "-d", str(workdir),
           "--configfile", str(CONFIGS / "default.yaml"), *map(str, configfiles), *map(str, args)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if check:
        assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return res


def job_counts(res: subprocess.CompletedProcess) -> dict[str, int]:
    """The 'Job stats' table of a dry run."""
    text = res.stdout + res.stderr
    block = text[text.index("Job stats:"):]
    counts = {}
    for line in block.splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m:
            break
        counts[m.group(1)] = int(m.group(2))
    return counts


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.fixture
def user_files(tmp_path):
    """A user's prompts file and log (kind files), as configs/paper.yaml expects them."""
    prompts = tmp_path / "my_prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"What is {i} + {i}?"}) + "\n"
                               for i in range(12)), encoding="utf-8")
    log = tmp_path / "my_log.jsonl"
    log.write_text("".join(json.dumps({"step": t, "id": f"p{i}", "n": 8, "s": (i + t) % 9})
                           + "\n" for t in (1, 2) for i in range(6)), encoding="utf-8")
    return prompts, log


# ------------------------------------------------------------------------------------------ lint


def test_lint_is_clean(tmp_path):
    shards = write_yaml(tmp_path / "shards.yaml", {"embed_shards": 2, "grid": {"enabled": True}})
    for extra in ((), (shards,)):
        res = smk(tmp_path, *extra, args=["--lint"])
        out = res.stdout + res.stderr
        assert "Lints for" not in out and "Congratulations" in out, out[-3000:]


# ------------------------------------------------------------------------------------ dry runs


def test_dry_run_default(tmp_path):
    counts = job_counts(smk(tmp_path, args=["-n"]))
    assert counts == {"simulate": 1, "embed": 1, "build_graph": 1, "cluster": 1, "init_state": 1,
                      "split_log": 1, "replay": 1, "evaluate_config": 1, "report": 1, "all": 1, "total": 10}


def test_dry_run_grid_shares_embeddings_graphs_and_clusters(tmp_path):
    grid = yaml.safe_load((CONFIGS / "grid.yaml").read_text())["grid"]
    counts = job_counts(smk(tmp_path, CONFIGS / "grid.yaml", args=["-n"]))
    n_points = (len(grid["beta"]) * len(grid["states"]) * len(grid["k_nn"]) * len(grid["gamma"])
                * len(grid["window"]) * len(grid["seeds"]))
    assert n_points >= 32 and len(grid["seeds"]) >= 2
    assert counts["grid_point"] == n_points
    assert counts["embed"] == 1                                   # one embedding for everything
    assert counts["build_graph"] == len(grid["k_nn"])             # the default's k_nn is among them
    assert counts["cluster"] == len(grid["k_nn"]) * len(grid["states"]) * len(grid["seeds"]) + 1  # + default's K=auto
    assert counts["grid_baselines"] == len(grid["k_nn"]) and counts["grid_table"] == 1


def test_dry_run_paper_on_user_files(tmp_path, user_files):
    prompts, log = user_files
    # the paper's encoder is not on this machine: the plan is inspected without the plan-time model check
    override = write_yaml(tmp_path / "mine.yaml", {"source": {"prompts": str(prompts), "log": str(log)},
                                                   "embed": {"check_model": False}})
    res = smk(tmp_path, CONFIGS / "paper.yaml", override, args=["-n", "-p"])
    out = res.stdout + res.stderr
    assert "--model Qwen/Qwen3-Embedding-0.6B" in out and "--k-nn 80" in out and "--states 320" in out
    assert "--beta 2.0" in out and "--gamma 0.5" in out and "--schedule synchronous" in out
    assert "--window none" in out and "--window 1" not in out  # the config's explicit null: cumulative
    counts = job_counts(res)
    assert "simulate" not in counts and counts["embed_shard"] == 4 and counts["merge_embeddings"] == 1
    # the paper's evaluate config: estimator beta 2, gamma 0.5, cumulative
    assert "evaluate_b2_g0.5_wcum.yaml" in out


def test_paths_with_a_space_and_a_semicolon_are_quoted_in_every_command(tmp_path):
    """A user's files in a folder named "my data; touch PWNED": every shell command names them as one quoted
    word (a dry run prints the commands; shlex reads each path back whole, and no command would run `touch`)."""
    import shlex

    folder = tmp_path / "my data; touch PWNED"
    folder.mkdir()
    prompts, log = folder / "prompts.jsonl", folder / "log.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"What is {i} + {i}?"}) + "\n"
                               for i in range(12)), encoding="utf-8")
    log.write_text("".join(json.dumps({"step": 1, "id": f"p{i}", "n": 8, "s": i % 9}) + "\n" for i in range(6)),
                   encoding="utf-8")
    override = write_yaml(tmp_path / "mine.yaml", {"source": {"kind": "files", "prompts": str(prompts),
                                                              "log": str(log)}})
    res = smk(tmp_path, override, args=["-n", "-p"])
    out = res.stdout + res.stderr
    commands = [line for line in out.splitlines() if str(folder) in line  # not the job's "input: ..." lines
                and not line.strip().startswith(("input:", "output:", "log:", "reason:"))]
    assert any(" embed " in c for c in commands) and any(" evaluate " in c for c in commands)
    for c in commands:
        words = shlex.split(c)
        assert "touch" not in words and "PWNED" not in words, c
        assert any(w in (str(prompts), str(log)) or w.startswith(str(folder)) for w in words), c


def test_dry_run_oneshot(tmp_path, shared_data):
    override = write_yaml(tmp_path / "here.yaml", {"source": {"oneshot_dir": str(shared_data / "oneshot_rlvr")}})
    counts = job_counts(smk(tmp_path, CONFIGS / "oneshot.yaml", override, args=["-n"]))
    assert counts["oneshot"] == 1 and "simulate" not in counts and counts["report"] == 1
    res = smk(tmp_path, CONFIGS / "oneshot.yaml", override, args=["--lint"])
    assert "Lints for" not in res.stdout + res.stderr


def test_oneshot_without_its_data_fails_with_a_clear_message(tmp_path):
    override = write_yaml(tmp_path / "gone.yaml", {"source": {"oneshot_dir": str(tmp_path / "nowhere")}})
    res = smk(tmp_path, CONFIGS / "oneshot.yaml", override, args=["-n"], check=False)
    assert res.returncode != 0
    out = res.stdout + res.stderr
    assert "One-Shot-RLVR folder" in out and str(tmp_path / "nowhere") in out


def test_files_source_without_paths_and_bad_config_are_refused(tmp_path):
    res = smk(tmp_path, write_yaml(tmp_path / "f.yaml", {"source": {"kind": "files"}}), args=["-n"], check=False)
    assert res.returncode != 0 and "source.prompts is not set" in res.stdout + res.stderr
    res = smk(tmp_path, write_yaml(tmp_path / "b.yaml", {"estimator": {"betta": 2}}), args=["-n"], check=False)
    assert res.returncode != 0 and "betta" in res.stdout + res.stderr  # the schema refuses unknown keys


def test_the_estimator_section_is_resolved_by_graphdiff_at_plan_time(tmp_path):
    """The workflow resolves its estimator section with graphdiff_cli.settings (as init --config does): a
    setting that cannot act under the preset fails the plan in one line, before any job runs; state.keep
    reaches init as --keep."""
    inert = write_yaml(tmp_path / "i.yaml", {"estimator": {"preset": "default", "tol": 0.01}})
    res = smk(tmp_path, inert, args=["-n"], check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "config estimator.tol: tol = 0.01 has no effect here" in out, out[-3000:]
    assert len([line for line in out.splitlines() if "has no effect" in line]) == 1
    keep = write_yaml(tmp_path / "k.yaml", {"state": {"keep": 3}, "estimator": {"preset": "paper", "beta": 4}})
    out = (lambda r: r.stdout + r.stderr)(smk(tmp_path, keep, args=["-n", "-p"]))
    init = next(line for line in out.splitlines() if " init --graph " in line)
    assert "--preset paper --keep 3 " in init and "--beta 4" in init and "evaluate_b4_g0.5_wcum.yaml" in out
    res = smk(tmp_path, write_yaml(tmp_path / "k1.yaml", {"state": {"keep": 1}}), args=["-n"], check=False)
    assert res.returncode != 0 and "keep" in res.stdout + res.stderr  # init's minimum, in the schema


def test_dry_run_closedloop_passes_its_config_section_as_flags(tmp_path):
    """The closed-loop benchmark is configured by the config's closedloop section (schema defaults filled
    in), passed to `python -m closedloop` by the rules, with the repository root on PYTHONPATH."""
    small = write_yaml(tmp_path / "cl.yaml", {"closedloop": {"run": "cl", "seeds": [0, 1], "schedulers": ["uniform", "gd-thompson"],
                                                             "train": {"steps": 3}, "policy": {"shared_sft": False}}})
    res = smk(tmp_path, small, args=["-n", "-p", "closedloop"])
    out = res.stdout + res.stderr
    counts = job_counts(res)
    assert counts["closedloop_run"] == 4 and counts["closedloop_sft"] == 2 and counts["closedloop_data"] == 1
    assert f"PYTHONPATH={REPO}" in out and "-m closedloop run" in out and "--steps 3 " in out
    assert "--train-per-cell 250 " in out and "--skills compare,sort" in out  # the schema's defaults
    assert "--store" not in out  # no store unless one is set ...
    kept = write_yaml(tmp_path / "kept.yaml", {"closedloop": {"run": "cl", "seeds": [0], "schedulers": ["uniform"],
                                                              "store": "results/cl kept"}})
    out = smk(tmp_path, kept, args=["-n", "-p", "closedloop"]).stdout
    assert "--store 'results/cl kept'" in out  # ... and then every run keeps (and reuses) its runs there
    res = smk(tmp_path, write_yaml(tmp_path / "bad.yaml", {"closedloop": {"train": {"stepz": 3}}}), args=["-n", "closedloop"],
              check=False)
    assert res.returncode != 0 and "stepz" in res.stdout + res.stderr


def test_a_missing_encoder_is_refused_at_plan_time(tmp_path):
    """Not once per embed shard when the jobs run: the dry run itself fails in one line naming the fix."""
    override = write_yaml(tmp_path / "m.yaml", {"embed": {"model": "someone/not-downloaded-model"}, "embed_shards": 4})
    res = smk(tmp_path, override, args=["-n"], check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "embed.model: embedding model 'someone/not-downloaded-model' is not in the " \
        "local Hugging Face cache" in out and "hf download someone/not-downloaded-model" in out, out


def test_the_openvino_backend_exports_once_and_every_embed_job_loads_the_export(tmp_path):
    override = write_yaml(tmp_path / "ov.yaml", {"run": "ov", "embed": {"backend": "openvino-int8"},
                                                 "embed_shards": 3})
    res = smk(tmp_path, override, args=["-n", "-p"])
    out = res.stdout + res.stderr
    counts = job_counts(res)
    assert counts["export_encoder"] == 1 and counts["embed_shard"] == 3
    export = [line for line in out.splitlines() if " export-encoder " in line]
    assert len(export) == 1 and "--out artifacts/ov/encoder/openvino-int8" in export[0]
    assert "--calibration artifacts/ov/data/prompts.jsonl" in export[0] and "--model bundled" in export[0]
    embeds = [line for line in out.splitlines() if " embed " in line and "--shard" in line]
    assert len(embeds) == 3 and all("--model artifacts/ov/encoder/openvino-int8" in c for c in embeds)
    # the GPU is refused at plan time, in one line
    cuda = write_yaml(tmp_path / "cuda.yaml", {"embed": {"backend": "openvino-int8", "device": "cuda"}})
    res = smk(tmp_path, cuda, args=["-n"], check=False)
    assert res.returncode != 0 and "embed.backend openvino-int8 runs on the CPU" in res.stdout + res.stderr


def test_dry_run_with_the_slurm_profile(tmp_path):
    pytest.importorskip("snakemake_executor_plugin_slurm", reason="snakemake-executor-plugin-slurm not installed")
    res = smk(tmp_path, CONFIGS / "grid.yaml", args=["-n", "--profile", CONFIGS / "profiles" / "slurm"])
    text = res.stdout + res.stderr
    jobs = re.split(r"\nrule ", text)
    embed = next(j for j in jobs if j.startswith("embed:"))
    cluster = next(j for j in jobs if j.startswith("cluster:"))
    assert "slurm_partition=SITE_GPU_PARTITION" in embed and "gpu=1" in embed
    assert "slurm_partition=SITE_CPU_PARTITION" in cluster and "gpu=" not in cluster


def test_site_specific_values_live_in_the_profile_only():
    profile = yaml.safe_load((CONFIGS / "profiles" / "slurm" / "config.yaml").read_text())
    assert profile["executor"] == "slurm" and "slurm_account" in profile["default-resources"]
    for path in [REPO / "Snakefile", *(REPO / "workflow").rglob("*.smk"), *CONFIGS.glob("*.yaml")]:
        assert "SITE_" not in path.read_text() and "slurm_account" not in path.read_text(), path


# --------------------------------------------------------------------------------- grid table


def _load_grid_table():
    spec = importlib.util.spec_from_file_location("grid_table", REPO / "workflow" / "scripts" / "grid_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _metrics(folder: Path, methods: dict[str, float]) -> Path:
    """A metrics.json shaped like graphdiff evaluate's, with the given full-log MAE per method."""
    def phases(mae):
        block = {"mae": mae, "batch_r": 0.5, "within_r": 1 - mae, "brier": mae / 2, "ece": 0.1, "auroc": 0.6,
                 "seconds_per_step": 0.01}
        return {p: {"all": dict(block)} for p in ("early", "middle", "last", "full")}

    folder.mkdir(parents=True)
    doc = {"metrics": {"methods": {m: {"oracle": m.startswith("oracle"), "phases": phases(v)}
                                   for m, v in methods.items()}},
           "ground_truth": {"methods": {m: v / 2 for m, v in methods.items()}}}
    (folder / "metrics.json").write_text(json.dumps(doc))
    return folder


def test_grid_table_averages_seeds_and_orders_by_mae(tmp_path):
    gt = _load_grid_table()
    base = dict(k_nn="10", states="4", gamma="0.5", window="cum")
    points = [dict(base, beta="1", seed="0"), dict(base, beta="1", seed="1"),
              dict(base, beta="2", seed="0"), dict(base, beta="2", seed="1")]
    maes = [0.30, 0.20, 0.12, 0.14]
    folders = [_metrics(tmp_path / f"p{i}", {"graphdiff": m}) for i, m in enumerate(maes)]
    bfolder = _metrics(tmp_path / "b10", {"history": 0.4, "labelprop": 0.25, "oracle-sbs": 0.01})
    out = {k: tmp_path / f"out.{k}" for k in ("md", "csv", "points", "png")}
    res = gt.write_comparison(points, folders, [bfolder], ["10"], out["md"], out["csv"], out["points"], out["png"])
    assert res["points"] == 4 and res["settings"] == 2 and res["baselines"] == 2
    assert res["best"]["beta"] == "2" and res["best"]["mae"] == pytest.approx(0.13)

    import csv

    rows = list(csv.DictReader(out["csv"].open()))
    grid_rows = [r for r in rows if r["kind"] == "grid"]
    assert [r["beta"] for r in grid_rows] == ["2", "1"]  # best MAE first
    assert float(grid_rows[1]["mae"]) == pytest.approx(0.25)
    assert float(grid_rows[1]["mae_sd"]) == pytest.approx(0.0707107, rel=1e-5)  # sample sd of 0.3, 0.2
    assert float(grid_rows[0]["true_mae"]) == pytest.approx(0.065)
    assert [r["method"] for r in rows if r["kind"] == "baseline"] == ["history", "labelprop"]  # no oracles
    assert len(list(csv.DictReader(out["points"].open()))) == 4
    md = out["md"].read_text()
    assert "| 10 | 4 | 2 | 0.5 | cum | 2 | **0.130 ± 0.014** |" in md and "| labelprop | 10 |" in md
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------- one real small run


@pytest.mark.slow
def test_small_real_run_of_the_default_workflow(tmp_path):
    """The default pipeline end to end on 60 prompts x 6 steps, with a 2-point grid on the side."""
    new = [{"id": f"late-{i}", "prompt": text} for i, text in enumerate(
        ["What is the sum of the first 50 odd numbers?", "Find the area of a triangle with sides 5, 12 and 13.",
         "How many ways can 4 books be arranged on a shelf?"])]
    (tmp_path / "late.jsonl").write_text("".join(json.dumps(r) + "\n" for r in new))
    (tmp_path / "gone.txt").write_text("late-1\n")
    tiny = write_yaml(tmp_path / "tiny.yaml", {
        "run": "tiny",
        "replay": {"add_prompts": [{"step": 3, "prompts": "late.jsonl"}], "retire": [{"step": 5, "ids": "gone.txt"}]},
        "source": {"simulate": {"prompts": 60, "steps": 6, "batch_size": 16}},
        "graph": {"k_nn": 8}, "cluster": {"states": 4},
        "embed": {"device": "cpu"}, "estimator": {"device": "cpu"},
        "grid": {"enabled": True, "k_nn": [8], "states": [4], "beta": [2.0], "seeds": [0, 1],
                 "baselines": ["history", "labelprop"]},
    })
    smk(tmp_path, tiny, args=["--cores", "2"], timeout=900)
    art = tmp_path / "artifacts" / "tiny"

    report = art / "report"
    assert (report / "report.md").read_text().startswith("# graphdiff evaluation report")
    assert {p.name for p in report.glob("*.png")} >= {"batch_mean.png", "mae_over_steps.png", "reliability.png"}
    metrics = json.loads((report / "metrics.json").read_text())
    assert metrics["run"]["steps"] == 6 and metrics["run"]["n_prompts"] == 60 and metrics["run"]["n_states"] == 4
    assert "graphdiff" in metrics["metrics"]["methods"]
    md = (report / "report.md").read_text()
    assert md.index("## The answer first") < md.index("## Accuracy and overhead")  # the headline opens it
    assert metrics["headline"]["selection"]["baseline"]  # the decision replay ran by default
    page = (report / "report.html").read_text()
    assert "The answer first" in page and page.count('src="data:image/png;base64,') == 4

    # the STATE a trainer starts from, and the replay of the log through graphdiff watch
    status = json.loads(subprocess.run([str(REPO / ".venv" / "bin" / "graphdiff"), "status", "--state",
                                        str(art / "STATE"), "--json"], capture_output=True, text=True,
                                       check=True).stdout)
    assert status["step"] == 0 and status["n_prompts"] == 60 and status["states"] == 4
    watched = json.loads((art / "replay" / "watch.json").read_text())
    assert [a["step"] for a in watched["applied"]] == list(range(1, 7)) and watched["step"] == 6
    assert [(c["kind"], c["version"]) for c in watched["prompt_set_changes"]] == [("prompts", "2.1"), ("retire", "4.1")]
    preds = (art / "replay" / "predictions.jsonl").read_text().splitlines()  # 60 + 3 added - 1 retired
    assert len(preds) == 62 and sum(json.loads(r)["n_seen"] for r in preds) == 6 * 16 * 8

    grid = art / "grid"
    md = (grid / "comparison.md").read_text()
    assert "| 8 | 4 | 2 | 0.5 | cum | 2 |" in md and "| history | 8 |" in md
    assert (grid / "comparison.png").stat().st_size > 0 and len((grid / "points.csv").read_text().splitlines()) == 3

    assert (tmp_path / "logs" / "tiny" / "embed.log").is_file()
    # snakemake's own report gathers the evaluation page and plots
    smk(tmp_path, tiny, args=["--report", tmp_path / "snakemake_report.html"], timeout=300)
    page = (tmp_path / "snakemake_report.html").read_text()
    assert "report.html" in page and "batch_mean.png" in page and "graphdiff's evaluation" in page
    # a second run has nothing to do
    res = smk(tmp_path, tiny, args=["--cores", "2", "-n"])
    assert "Nothing to be done" in res.stdout + res.stderr
