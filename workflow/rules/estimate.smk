# Estimate stage: the estimator STATE a trainer starts from (graphdiff init, step 0), and a replay of
# the training log into a second STATE the way a trainer would feed it: one outcomes file per step in
# an inbox (and the prompt files that join or leave mid-run: replay.add_prompts, replay.retire), applied
# in step order by graphdiff watch, with the predictions after the last step.


rule init_state:
    input:
        graph=GRAPH,
        clusters=CLUSTERS,
    output:
        directory(f"{ART}/STATE"),
    log:
        f"{LOGS}/init_state.log",
    params:
        gd=GD,
        args=init_args(),
    conda:
        ENV
    threads: THREADS["estimate"]
    resources:
        **cpu_resources("estimate"),
    shell:
        "OMP_NUM_THREADS={threads} {params.gd} init --graph {input.graph:q} --clusters {input.clusters:q} "
        "--out {output:q} {params.args} 2> {log:q}"


rule split_log:
    input:
        log_file(),
        [path for _kind, _step, path in prompt_set_changes()],
    output:
        directory(f"{ART}/replay/inbox"),
    log:
        f"{LOGS}/split_log.log",
    params:
        changes=prompt_set_changes(),
    conda:
        ENV
    threads: 1
    resources:
        **cpu_resources("data"),
    script:
        "../scripts/split_log.py"


rule replay:
    input:
        graph=GRAPH,
        clusters=CLUSTERS,
        embeddings=EMBEDDINGS,  # what graphdiff extend reads for replay.add_prompts
        inbox=f"{ART}/replay/inbox",
    output:
        state=directory(f"{ART}/replay/STATE"),
        predictions=f"{ART}/replay/predictions.jsonl",
        summary=f"{ART}/replay/watch.json",
    log:
        f"{LOGS}/replay.log",
    params:
        gd=GD,
        args=init_args(),
        group_size=config["replay"]["group_size"],
    conda:
        ENV
    threads: THREADS["estimate"]
    resources:
        **gpu_resources("estimate"),
    shell:
        "(OMP_NUM_THREADS={threads} {params.gd} init --graph {input.graph:q} --clusters {input.clusters:q} "
        "--embeddings {input.embeddings:q} --out {output.state:q} {params.args} "
        "&& OMP_NUM_THREADS={threads} {params.gd} watch --state {output.state:q} --inbox {input.inbox:q} --once "
        "--predictions {output.predictions:q} --group-size {params.group_size} --json > {output.summary:q}) 2> {log:q}"
