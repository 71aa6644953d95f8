# Report stage: graphdiff evaluate replays the training log step by step (no look-ahead) through
# graphdiff and the baselines and writes report.md, PNG plots and metrics.json. The estimator
# settings go to evaluate through a small YAML file per (beta, gamma, window), written here and
# shared with the grid.

localrules:
    evaluate_config,


rule evaluate_config:
    output:
        f"{ART}/configs/evaluate_b{{beta}}_g{{gamma}}_w{{window}}.yaml",
    log:
        f"{LOGS}/configs/evaluate_b{{beta}}_g{{gamma}}_w{{window}}.log",
    params:
        estimator=evaluate_estimator_settings(),
        evaluate=config["evaluate"]["settings"],
    conda:
        ENV
    threads: 1
    resources:
        **cpu_resources("report"),
    script:
        "../scripts/evaluate_config.py"


rule report:
    input:
        log=log_file(),
        graph=GRAPH,
        clusters=CLUSTERS,
        embeddings=EMBEDDINGS,
        config=evaluate_config_path(BETA, GAMMA, WINDOW),
    output:
        # snakemake --report: the HTML page and the plots of the report folder
        report(directory(f"{ART}/report"), patterns=["{name}.html", "{name}.png"],
               caption="../report/evaluate.rst", category="Evaluation"),
    log:
        f"{LOGS}/report.log",
    params:
        gd=GD,
        methods=",".join(config["evaluate"]["methods"]),
        counterfactual={True: "--counterfactual", False: "--no-counterfactual"}.get(
            config["evaluate"]["counterfactual"], ""),
    conda:
        ENV
    threads: THREADS["evaluate"]
    resources:
        **gpu_resources("evaluate"),
    shell:
        "OMP_NUM_THREADS={threads} {params.gd} evaluate --log {input.log:q} --graph {input.graph:q} "
        "--clusters {input.clusters:q} --embeddings {input.embeddings:q} --config {input.config:q} "
        "--methods {params.methods} {params.counterfactual} --out {output:q} 2> {log:q}"
