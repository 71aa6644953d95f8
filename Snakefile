# graphdiff workflow: prompts + training log -> embeddings -> mutual-kNN graph -> spectral clusters ->
# estimator STATE, replay and report (and optionally an experiment grid). Thin on purpose: every rule
# calls the `graphdiff` CLI; the stages live in workflow/rules/, the config schema in workflow/schemas/.
# Run:  snakemake --cores 2                       (configs/default.yaml: the offline demo)
#       snakemake --cores 2 --configfile configs/grid.yaml
#       snakemake --profile configs/profiles/slurm --configfile configs/grid.yaml   (a SLURM cluster)
# docs/reference/workflow.md describes every config key and output; docs/how-to/slurm.md the cluster profile.

from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "configs/default.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/embed.smk"
include: "workflow/rules/graph.smk"
include: "workflow/rules/cluster.smk"
include: "workflow/rules/estimate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/grid.smk"
include: "workflow/rules/closedloop.smk"


rule all:
    input:
        all_targets(),
    default_target: True
