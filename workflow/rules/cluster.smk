# Cluster stage (Section 3.4): graph -> K latent difficulty states by spectral clustering, one per
# (k_nn, K, seed) (shared by every estimator setting of the grid).


rule cluster:
    input:
        f"{ART}/graph/k{{k_nn}}.zarr",
    output:
        directory(f"{ART}/clusters/k{{k_nn}}_K{{states}}_s{{seed}}.zarr"),
    log:
        f"{LOGS}/clusters/k{{k_nn}}_K{{states}}_s{{seed}}.log",
    params:
        gd=GD,
    conda:
        ENV
    threads: THREADS["cluster"]
    resources:
        **cpu_resources("cluster"),
    shell:
        "OMP_NUM_THREADS={threads} {params.gd} cluster {input:q} --out {output:q} --states {wildcards.states} "
        "--seed {wildcards.seed} 2> {log:q}"
