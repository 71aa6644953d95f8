# Graph stage (Section 3.3): embeddings -> mutual-kNN graph W, one per k_nn (shared by every
# clustering, estimator setting and seed that uses that k_nn).


rule build_graph:
    input:
        EMBEDDINGS,
    output:
        directory(f"{ART}/graph/k{{k_nn}}.zarr"),
    log:
        f"{LOGS}/graph/k{{k_nn}}.log",
    params:
        gd=GD,
        device=config["graph"]["device"],
        index=config["graph"]["index"],
    conda:
        ENV
    threads: THREADS["graph"]
    resources:
        **gpu_resources("graph"),
    shell:
        "OMP_NUM_THREADS={threads} {params.gd} build-graph {input:q} --out {output:q} --k-nn {wildcards.k_nn} "
        "--device {params.device} --index {params.index} 2> {log:q}"
