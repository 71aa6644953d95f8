# Source stage: the prompts file and the training log (rows step, id, n, s).
#   simulate: graphdiff simulate writes both (a synthetic policy that improves unevenly across topics);
#   files:    your own files (source.prompts, source.log), used in place;
#   oneshot:  the One-Shot-RLVR replay converted from source.oneshot_dir.

SRC = config["source"]

if SRC["kind"] == "files":
    for _key in ("prompts", "log"):
        if not SRC[_key]:
            raise WorkflowError(
                f"source.kind is 'files' but source.{_key} is not set: name your {_key} file in the config "
                f"(e.g. --config 'source={{kind: files, prompts: my_prompts.jsonl, log: my_log.jsonl}}')"
            )

if SRC["kind"] == "oneshot" and not Path(SRC["oneshot_dir"]).is_dir():
    raise WorkflowError(
        f"source.kind is 'oneshot' but the One-Shot-RLVR folder {SRC['oneshot_dir']!r} does not exist "
        f"(relative to the working directory {Path.cwd()}); set source.oneshot_dir to the folder holding "
        "prompts.jsonl, acc_history.jsonl and acc_step_500.raw.json"
    )


if SRC["kind"] == "simulate":

    rule simulate:
        input:
            [SRC["simulate"]["math"]] if SRC["simulate"]["math"] else [],
        output:
            prompts=f"{ART}/data/prompts.jsonl",
            log=f"{ART}/data/log.jsonl",
        log:
            f"{LOGS}/simulate.log",
        params:
            gd=GD,
            args=" ".join(
                [
                    f"--prompts {SRC['simulate']['prompts']}",
                    f"--steps {SRC['simulate']['steps']}",
                    f"--batch-size {SRC['simulate']['batch_size']}",
                    f"--rollouts {SRC['simulate']['rollouts']}",
                    f"--seed {SRC['simulate']['seed']}",
                ]
                + ([f"--math {shlex.quote(SRC['simulate']['math'])}"] if SRC["simulate"]["math"] else [])
            ),
        conda:
            ENV
        threads: 1
        resources:
            **cpu_resources("data"),
        shell:
            "{params.gd} simulate --out-prompts {output.prompts:q} --out-log {output.log:q} {params.args} 2> {log:q}"


if SRC["kind"] == "oneshot":

    rule oneshot:
        input:
            prompts=f"{SRC['oneshot_dir']}/prompts.jsonl",
            history=f"{SRC['oneshot_dir']}/acc_history.jsonl",
            raw=f"{SRC['oneshot_dir']}/acc_step_500.raw.json",
        output:
            prompts=f"{ART}/data/prompts.jsonl",
            log=f"{ART}/data/log.jsonl",
        log:
            f"{LOGS}/oneshot.log",
        params:
            seed=SRC["oneshot_seed"],
            batch_size=SRC["oneshot_batch_size"],
        conda:
            ENV
        threads: 1
        resources:
            **cpu_resources("data"),
        script:
            "../scripts/oneshot.py"
