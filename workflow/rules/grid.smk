# Grid stage: graphdiff replayed for every (k_nn, K, seed, beta, gamma, window) of config "grid".
# Wildcards follow what each stage depends on, so nothing shared is recomputed: one embedding for the
# whole grid, one graph per k_nn, one clustering per (k_nn, K, seed), one evaluate per point. The
# baselines (which ignore K, seed and the estimator settings) are replayed once per k_nn. Everything
# ends in one comparison table (markdown + CSV) and one plot.

rule grid_point:
    input:
        log=log_file(),
        graph=f"{ART}/graph/k{{k_nn}}.zarr",
        clusters=f"{ART}/clusters/k{{k_nn}}_K{{states}}_s{{seed}}.zarr",
        config=f"{ART}/configs/evaluate_b{{beta}}_g{{gamma}}_w{{window}}.yaml",
        embeddings=EMBEDDINGS,  # graphdiff's read-out of the embedding (setting readout), as in the report
    output:
        directory(f"{ART}/grid/k{{k_nn}}_K{{states}}_s{{seed}}/b{{beta}}_g{{gamma}}_w{{window}}"),
    log:
        f"{LOGS}/grid/k{{k_nn}}_K{{states}}_s{{seed}}_b{{beta}}_g{{gamma}}_w{{window}}.log",
    params:
        gd=GD,
    conda:
        ENV
    threads: THREADS["grid"]
    resources:
        **gpu_resources("evaluate"),
    shell:
        "OMP_NUM_THREADS={threads} {params.gd} evaluate --log {input.log:q} --graph {input.graph:q} "
        "--clusters {input.clusters:q} --config {input.config:q} --embeddings {input.embeddings:q} --methods graphdiff "
        "--no-counterfactual --out {output:q} 2> {log:q}"


rule grid_baselines:
    input:
        unpack(_baseline_inputs),
    output:
        directory(f"{ART}/grid/baselines_k{{k_nn}}"),
    log:
        f"{LOGS}/grid/baselines_k{{k_nn}}.log",
    params:
        gd=GD,
        methods=",".join(GRID["baselines"]),
        embeddings=lambda wildcards, input: f"--embeddings {shlex.quote(str(input.embeddings))}" if "embeddings" in input.keys() else "",
    conda:
        ENV
    threads: THREADS["grid"]
    resources:
        **cpu_resources("evaluate"),
    shell:
        "OMP_NUM_THREADS={threads} {params.gd} evaluate --log {input.log:q} --graph {input.graph:q} "
        "--clusters {input.clusters:q} --config {input.config:q} {params.embeddings} --methods {params.methods} "
        "--no-counterfactual --out {output:q} 2> {log:q}"


rule grid_table:
    input:
        unpack(_grid_table_inputs),
    output:
        md=f"{ART}/grid/comparison.md",
        csv=f"{ART}/grid/comparison.csv",
        points=f"{ART}/grid/points.csv",
        png=f"{ART}/grid/comparison.png",
    log:
        f"{LOGS}/grid/comparison.log",
    params:
        points=grid_points(),
    conda:
        ENV
    threads: 1
    resources:
        **cpu_resources("report"),
    script:
        "../scripts/grid_table.py"
