# Shared helpers: paths of every artifact, wildcard formats, the graphdiff command, resources.
# No rules here.

import shlex
import shutil
import sys
from itertools import product
from pathlib import Path

def _resolve_estimator(section):
    from graphdiff_cli.errors import GraphdiffError
    from graphdiff_cli.settings import resolve_layers

    try:
        return resolve_layers([(section, lambda key: f"config estimator.{key}")]).as_dict()
    except GraphdiffError as exc:
        raise WorkflowError(str(exc)) from None


RUN = config["run"]
ART = f"artifacts/{RUN}"
LOGS = f"logs/{RUN}"
# The estimator section: resolved by graphdiff's own resolver (graphdiff_cli.settings, the one home of
# every setting, as init --config and evaluate --config resolve it), so a bad or inert setting fails
# the plan in one line, and BETA, GAMMA, WINDOW below are what init will use.
EST = dict(config["estimator"])
SETTINGS = _resolve_estimator(EST)
RES = config["resources"]
THREADS = config["threads"]
# The software of every rule: used only with --software-deployment-method conda (a machine without the
# project's .venv); otherwise the rules call the graphdiff on PATH. Relative to workflow/rules/.
ENV = "../envs/graphdiff.yaml"


def _graphdiff_command():
    """config["graphdiff"]; "graphdiff" falls back to the one beside the Python running Snakemake."""
    cmd = config["graphdiff"]
    if cmd == "graphdiff" and shutil.which("graphdiff") is None:
        beside = Path(sys.executable).with_name("graphdiff")
        if beside.exists():
            return shlex.quote(str(beside))
    return cmd


GD = _graphdiff_command()


# --- wildcard values: numbers as they read ("2", "0.5"), the window as an integer or "cum" ---------


def fmt_num(x):
    return f"{float(x):g}"


def fmt_window(w):
    return "cum" if w is None else str(int(w))


def fmt_states(k):
    return str(k)


wildcard_constraints:
    run=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    k_nn=r"\d+",
    states=r"auto|\d+",
    seed=r"\d+",
    beta=r"\d+(\.\d+)?(e-?\d+)?",
    gamma=r"\d+(\.\d+)?(e-?\d+)?",
    window=r"cum|\d+",
    i=r"\d+",
    n=r"\d+",


# --- paths -------------------------------------------------------------------------------------------


def prompts_file():
    """The prompts file every embedding is made from."""
    if config["source"]["kind"] == "files":
        return config["source"]["prompts"]
    return f"{ART}/data/prompts.jsonl"


def log_file():
    """The training log (rows step, id, n, s) replayed by the estimate and report stages."""
    if config["source"]["kind"] == "files":
        return config["source"]["log"]
    return f"{ART}/data/log.jsonl"


def id_text_fields():
    """(id column, text column) of the prompts file: the workflow's own files use id and prompt."""
    if config["source"]["kind"] == "files":
        return config["source"]["id_field"], config["source"]["text_field"]
    return "id", "prompt"


EMBEDDINGS = f"{ART}/embeddings.zarr"


def graph_path(k_nn):
    return f"{ART}/graph/k{k_nn}.zarr"


def clusters_path(k_nn, states, seed):
    return f"{ART}/clusters/k{k_nn}_K{states}_s{seed}.zarr"


def evaluate_config_path(beta, gamma, window):
    return f"{ART}/configs/evaluate_b{beta}_g{gamma}_w{window}.yaml"


# The default pipeline's own choice of every setting (the grid varies them).
K_NN = str(config["graph"]["k_nn"])
STATES = fmt_states(config["cluster"]["states"])
SEED = str(config["cluster"]["seed"])
BETA, GAMMA, WINDOW = fmt_num(SETTINGS["beta"]), fmt_num(SETTINGS["gamma"]), fmt_window(SETTINGS["window"])
GRAPH = graph_path(K_NN)
CLUSTERS = clusters_path(K_NN, STATES, SEED)


def grid_points():
    """Every grid point as a dict of wildcard values (seeds innermost)."""
    g = config["grid"]
    return [
        dict(k_nn=str(k), states=fmt_states(K), seed=str(s), beta=fmt_num(b), gamma=fmt_num(gm), window=fmt_window(w))
        for k, K, b, gm, w, s in product(g["k_nn"], g["states"], g["beta"], g["gamma"], g["window"], g["seeds"])
    ]


def grid_point_dir(p):
    return f"{ART}/grid/k{p['k_nn']}_K{p['states']}_s{p['seed']}/b{p['beta']}_g{p['gamma']}_w{p['window']}"


def all_targets():
    targets = [f"{ART}/STATE"]
    if config["evaluate"]["enabled"]:
        targets.append(f"{ART}/report")
    if config["replay"]["enabled"]:
        targets.append(f"{ART}/replay/predictions.jsonl")
    if config["grid"]["enabled"]:
        targets += [f"{ART}/grid/comparison.md", f"{ART}/grid/comparison.csv", f"{ART}/grid/comparison.png"]
    return targets


def gpu_resources(stage):
    """Resources of a GPU-capable job: gpu (0 = none requested), mem_mb, runtime (minutes)."""
    return dict(gpu=RES["gpu"], mem_mb=RES["mem_mb"][stage], runtime=RES["runtime"][stage])


def cpu_resources(stage):
    return dict(mem_mb=RES["mem_mb"][stage], runtime=RES["runtime"][stage])


# --- estimate stage: graphdiff init flags --------------------------------------------------------


def _flag_value(value):
    return "none" if value is None else shlex.quote(str(value))


def init_args():
    """graphdiff init's flags: the preset, every setting the config's estimator section gives, and the
    STATE's retention (state.keep; null = init's default)."""
    args = [f"--preset {EST.get('preset') or 'default'}"]
    if config["state"]["keep"] is not None:
        args.append(f"--keep {int(config['state']['keep'])}")
    args += [f"--{k.replace('_', '-')} {_flag_value(v)}" for k, v in EST.items() if k != "preset"]
    return " ".join(args)


def evaluate_estimator_settings():
    """The estimator section of evaluate's --config, but beta, gamma and window (from the wildcards)."""
    return {k: v for k, v in EST.items() if k not in ("beta", "gamma", "window")}


# --- grid stage: input functions -----------------------------------------------------------------

GRID = config["grid"]


def _baseline_inputs(wildcards):
    # evaluate needs a clustering even when graphdiff is not among the methods: take the grid's first
    # (K, seed) for this k_nn, which the grid computes anyway.
    inputs = dict(
        log=log_file(),
        graph=graph_path(wildcards.k_nn),
        clusters=clusters_path(wildcards.k_nn, fmt_states(GRID["states"][0]), str(GRID["seeds"][0])),
        config=evaluate_config_path(BETA, GAMMA, WINDOW),
    )
    from graphdiff_cli.evaluation.methods import EMBEDDING_METHODS  # the peers that read the embeddings

    if set(GRID["baselines"]) & set(EMBEDDING_METHODS):
        inputs["embeddings"] = EMBEDDINGS
    return inputs


def _grid_table_inputs(wildcards):
    inputs = {"points": [grid_point_dir(p) for p in grid_points()]}
    if GRID["baselines"]:
        inputs["baselines"] = [f"{ART}/grid/baselines_k{k}" for k in dict.fromkeys(GRID["k_nn"])]
    return inputs


# --- closed-loop benchmark (workflow/rules/closedloop.smk) ------------------------------------------
# Its settings are the config's `closedloop` section (workflow/schemas/config.schema.yaml, defaults
# filled in by validate); the rules pass them to `python -m closedloop` as flags. The benchmark is the
# package closedloop/ at the repository root, not part of graphdiff_cli: its jobs run in the working
# directory (-d), so the repository root goes on PYTHONPATH for them.

import os as _cl_os

CL = config["closedloop"]
CL_ART = f"artifacts/{CL['run']}"
CL_LOGS = f"logs/{CL['run']}"
_CL_ROOT = shlex.quote(str(Path(workflow.basedir).resolve()))
CL_MAIN = f"PYTHONPATH={_CL_ROOT}${{PYTHONPATH:+:$PYTHONPATH}} {shlex.quote(sys.executable)} -m closedloop"
CL_THREADS = CL["threads"]


def _cl_policy_seed(seed):
    """The SFT policy a run of ``seed`` starts from: seed 0's for every seed when policy.shared_sft."""
    return str(CL["seeds"][0]) if CL["policy"]["shared_sft"] else str(seed)


def check_encoder(model):
    """At plan time, before any embed job: is the configured encoder on this machine? A missing one fails
    here in one line naming the fix, instead of in every embed shard (each retried). Skipped when the
    embeddings exist (nothing to embed) or when graphdiff cannot be run here (rules deployed with conda)."""
    import subprocess

    if Path(EMBEDDINGS).exists():
        return
    res = subprocess.run(f"{GD} check-encoder --model {shlex.quote(model)}", shell=True, capture_output=True,
                         text=True)
    if res.returncode in (126, 127):  # no graphdiff in this environment: the jobs bring their own
        return
    if res.returncode != 0:
        line = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"
        raise WorkflowError(f"embed.model: {line.removeprefix('graphdiff: error: ')}")


def prompt_set_changes():
    """(kind, step, file) of every prompt set change the replay applies: replay.add_prompts, replay.retire."""
    rp = config["replay"]
    return ([("prompts", c["step"], c["prompts"]) for c in rp.get("add_prompts", [])]
            + [("retire", c["step"], c["ids"]) for c in rp.get("retire", [])])


def _cl_uncensored(scheduler):
    """The closed loop (closedloop.smk): does this arm run in the uncensored regime (train.uncensored_step_cap > 0
    and a pre-filter arm)?"""
    return CL["train"]["uncensored_step_cap"] > 0 and scheduler.endswith("-ds") and scheduler != "ds"
