# Embedding stage (Section 3.3): prompts file -> embeddings artifact. With embed_shards = N > 1 the
# prompts are embedded by N independent jobs (graphdiff embed --shard I/N, I = 0..N-1) and joined by
# graphdiff merge-embeddings, so a large prompt set spreads over N GPUs of a cluster. The prompts' covariates
# (embed.covariates, categories, reference_rate, answer_field, text_statistics) are encoded over all the prompts:
# sharded, they are computed after the merge by graphdiff embed on the whole file onto the merged artifact
# (every row's embedding reused from it: the model is not loaded).

SHARDS = config["embed_shards"]
_E = config["embed"]
if _E["check_model"]:
    check_encoder(_E["model"])
_ID, _TEXT = id_text_fields()
INSTRUCTION_ARGS = " ".join(
    ([f"--instruction {shlex.quote(_E['instruction'])}"] if _E["instruction"] else [])
    + (["--no-instruction"] if _E["no_instruction"] else [])
)
# embed.backend openvino-int8: the model is exported once (graphdiff export-encoder, int8 calibrated on this
# run's prompts with embed's instruction) and every embed job loads the export instead of the model
ENCODER = f"{ART}/encoder/openvino-int8" if _E["backend"] == "openvino-int8" else None
if ENCODER and _E["device"] == "cuda":
    raise WorkflowError("embed.backend openvino-int8 runs on the CPU: set embed.device to auto or cpu, or "
                        "embed.backend to torch for the GPU")
EMBED_ARGS = " ".join(
    [
        f"--model {shlex.quote(ENCODER or _E['model'])}",
        f"--batch-size {_E['batch_size']}",
        f"--device {_E['device']}",
        f"--id-field {shlex.quote(_ID)}",
        f"--text-field {shlex.quote(_TEXT)}",
        INSTRUCTION_ARGS,
    ]
    + ([f"--dim {_E['dim']}"] if _E["dim"] else [])
)

if ENCODER:

    rule export_encoder:
        input:
            prompts_file(),
        output:
            directory(ENCODER),
        log:
            f"{LOGS}/export-encoder.log",
        params:
            gd=GD,
            args=(f"--model {shlex.quote(_E['model'])} --id-field {shlex.quote(_ID)} "
                  f"--text-field {shlex.quote(_TEXT)} {INSTRUCTION_ARGS}"),
        conda:
            ENV
        threads: THREADS["embed"]
        resources:
            **cpu_resources("embed"),
        shell:
            "OMP_NUM_THREADS={threads} {params.gd} export-encoder --out {output:q} --calibration {input:q} "
            "{params.args} 2> {log:q}"


COVARIATE_ARGS = " ".join(
    [f"--covariate {shlex.quote(f)}" for f in _E["covariates"]]
    + [f"--category {shlex.quote(f)}" for f in _E["categories"]]
    + ([f"--reference-rate {shlex.quote(_E['reference_rate'])}"] if _E["reference_rate"] else [])
    + ([f"--answer-field {shlex.quote(_E['answer_field'])}"] if _E["answer_field"] else [])
    + ([] if _E["text_statistics"] else ["--no-text-statistics"])
)
ANY_COVARIATES = bool(_E["covariates"] or _E["categories"] or _E["reference_rate"] or _E["answer_field"]
                      or _E["text_statistics"])


if SHARDS == 1:

    rule embed:
        input:
            prompts=prompts_file(),
            **({"encoder": ENCODER} if ENCODER else {}),
        output:
            directory(EMBEDDINGS),
        log:
            f"{LOGS}/embed.log",
        params:
            gd=GD,
            args=f"{EMBED_ARGS} {COVARIATE_ARGS}",
        conda:
            ENV
        threads: THREADS["embed"]
        resources:
            **(cpu_resources("embed") if ENCODER else gpu_resources("embed")),
        shell:
            "OMP_NUM_THREADS={threads} {params.gd} embed {input.prompts:q} --out {output:q} {params.args} 2> {log:q}"

else:

    rule embed_shard:
        input:
            prompts=prompts_file(),
            **({"encoder": ENCODER} if ENCODER else {}),
        output:
            directory(f"{ART}/embeddings/shard-{{i}}-of-{{n}}.zarr"),
        log:
            f"{LOGS}/embed/shard-{{i}}-of-{{n}}.log",
        params:
            gd=GD,
            args=EMBED_ARGS,
        conda:
            ENV
        threads: THREADS["embed"]
        resources:
            **(cpu_resources("embed") if ENCODER else gpu_resources("embed")),
        shell:
            "OMP_NUM_THREADS={threads} {params.gd} embed {input.prompts:q} --out {output:q} --shard {wildcards.i}/{wildcards.n} "
            "{params.args} 2> {log:q}"

    rule merge_embeddings:
        input:
            shards=expand(f"{ART}/embeddings/shard-{{i}}-of-{SHARDS}.zarr", i=range(SHARDS)),
            prompts=prompts_file(),
            **({"encoder": ENCODER} if ENCODER else {}),
        output:
            directory(EMBEDDINGS),
        log:
            f"{LOGS}/merge_embeddings.log",
        params:
            gd=GD,
            # the covariates over all the prompts, onto the merged artifact (every embedding reused)
            covariates=lambda wildcards, input, output, threads: (
                f"&& OMP_NUM_THREADS={threads} {GD} embed {shlex.quote(str(input.prompts))} --out {shlex.quote(str(output[0]))} {EMBED_ARGS} "
                f"{COVARIATE_ARGS}" if ANY_COVARIATES else ""
            ),
        conda:
            ENV
        threads: 1
        resources:
            **cpu_resources("embed"),
        shell:
            "({params.gd} merge-embeddings {input.shards:q} --out {output:q} {params.covariates}) 2> {log:q}"
