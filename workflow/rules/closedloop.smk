# Closed-loop benchmark: real GRPO runs (TRL GRPOTrainer, tiny policy; CPU, or a GPU with
# train.device auto/cuda, which 16 jobs at a time share) where each scheduler
# picks the prompts with its native estimator or with graphdiff; seeds paired. Stages call
# `python -m closedloop` (the package closedloop/ at the repository root; data -> graph -> sft per seed ->
# run per scheduler x seed -> report).
#
#   .venv/bin/snakemake --cores all closedloop --configfile configs/closedloop.yaml
#
# Settings: the config's `closedloop` section (workflow/schemas/config.schema.yaml: every key, its type,
# default and meaning), passed to each stage as flags.

wildcard_constraints:
    scheduler=r"[a-z][a-z-]*",


rule closedloop:
    input:
        f"{CL_ART}/report/report.md",


rule closedloop_data:
    output:
        train=f"{CL_ART}/data/train.jsonl",
        test=f"{CL_ART}/data/test.jsonl",
        sft=f"{CL_ART}/data/sft.jsonl",
        prompts=f"{CL_ART}/data/prompts.jsonl",
    log:
        f"{CL_LOGS}/data.log",
    params:
        cl=CL_MAIN,
        d=CL["data"],
        skills=",".join(CL["data"]["skills"]),
        noise=CL["data"]["sft_noise"],
        out=lambda w, output: _cl_os.path.dirname(output.train),
    conda:
        ENV
    shell:
        "{params.cl} data --out {params.out:q} --train-per-cell {params.d[train_per_cell]} "
        "--test-per-cell {params.d[test_per_cell]} --sft-per-cell {params.d[sft_per_cell]} "
        "--seed {params.d[seed]} --sft-noise-min {params.noise[0]} --sft-noise-max {params.noise[1]} "
        "--skills {params.skills} "
        "> {log:q} 2>&1"


rule closedloop_graph:
    input:
        prompts=f"{CL_ART}/data/prompts.jsonl",
        train=f"{CL_ART}/data/train.jsonl",
    output:
        directory(f"{CL_ART}/graph"),
    log:
        f"{CL_LOGS}/graph.log",
    params:
        cl=CL_MAIN,
        g=CL["graph"],
        data=lambda w, input: _cl_os.path.dirname(input.train),
    conda:
        ENV
    threads: 2
    shell:
        "OMP_NUM_THREADS={threads} {params.cl} graph --data {params.data:q} --out {output:q} --k-nn {params.g[k_nn]} "
        "--states {params.g[states]} --cluster-seed {params.g[cluster_seed]} --preset {params.g[preset]} > {log:q} 2>&1"


rule closedloop_sft:
    input:
        sft=f"{CL_ART}/data/sft.jsonl",
        test=f"{CL_ART}/data/test.jsonl",
        train=f"{CL_ART}/data/train.jsonl",
    output:
        directory(f"{CL_ART}/policy/s{{seed}}"),
    log:
        f"{CL_LOGS}/sft_s{{seed}}.log",
    params:
        cl=CL_MAIN,
        p=CL["policy"],
        data=lambda w, input: _cl_os.path.dirname(input.train),
    conda:
        ENV
    threads: CL_THREADS
    shell:
        "OMP_NUM_THREADS={threads} {params.cl} sft --data {params.data:q} --out {output:q} --seed {wildcards.seed} "
        "--steps {params.p[sft_steps]} --batch-size {params.p[sft_batch_size]} --lr {params.p[sft_lr]} "
        "--hidden {params.p[hidden]} --layers {params.p[layers]} --heads {params.p[heads]} "
        "--threads {threads} > {log:q} 2>&1"


rule closedloop_run:
    input:
        train=f"{CL_ART}/data/train.jsonl",
        graph=f"{CL_ART}/graph",
        policy=lambda wc: f"{CL_ART}/policy/s{_cl_policy_seed(wc.seed)}",
        ds=lambda wc: [f"{CL_ART}/runs/ds/s{wc.seed}"] if _cl_uncensored(wc.scheduler) else [],
    output:
        directory(f"{CL_ART}/runs/{{scheduler}}/s{{seed}}"),
    log:
        f"{CL_LOGS}/run_{{scheduler}}_s{{seed}}.log",
    params:
        cl=CL_MAIN,
        t=CL["train"],
        data=lambda w, input: _cl_os.path.dirname(input.train),
        steps=lambda wc: CL["train"]["uncensored_step_cap"] if _cl_uncensored(wc.scheduler) else CL["train"]["steps"],
        budget=lambda wc, input: f"--rollout-budget-from {shlex.quote(input.ds[0])}" if input.ds else "",
        store=f"--store {shlex.quote(CL['store'])}" if CL.get("store") else "",
    conda:
        ENV
    threads: CL_THREADS
    shell:
        "OMP_NUM_THREADS={threads} {params.cl} run --data {params.data:q} --state {input.graph:q}/STATE "
        "--policy {input.policy:q} --scheduler {wildcards.scheduler} --seed {wildcards.seed} --out {output:q} "
        "--steps {params.steps} {params.budget} --batch-prompts {params.t[batch_prompts]} --group-size {params.t[group_size]} "
        "--pool-factor {params.t[pool_factor]} --max-rounds {params.t[max_rounds]} --oracle-samples {params.t[oracle_samples]} --lr {params.t[lr]} "
        "--eval-every {params.t[eval_every]} --test-limit {params.t[test_limit]} "
        "--eval-samples {params.t[eval_samples]} --threads {threads} --device {params.t[device]} {params.store} > {log:q} 2>&1"


rule closedloop_report:
    input:
        runs=expand(f"{CL_ART}/runs/{{scheduler}}/s{{seed}}", scheduler=CL["schedulers"], seed=CL["seeds"]),
        policies=sorted({f"{CL_ART}/policy/s{_cl_policy_seed(s)}" for s in CL["seeds"]}),
    output:
        md=f"{CL_ART}/report/report.md",
        metrics=f"{CL_ART}/report/metrics.json",
    log:
        f"{CL_LOGS}/report.log",
    params:
        cl=CL_MAIN,
        runs=lambda w, input: _cl_os.path.dirname(_cl_os.path.dirname(input.runs[0])),
        out=lambda w, output: _cl_os.path.dirname(output.md),
        sft=lambda w, input: _cl_os.path.dirname(input.policies[0]),
    conda:
        ENV
    shell:
        "{params.cl} report --runs {params.runs:q} --out {params.out:q} --sft {params.sft:q} > {log:q} 2>&1"
