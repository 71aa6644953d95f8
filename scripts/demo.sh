#!/usr/bin/env bash
# The main job: set up .venv/ (scripts/setup.sh), then run the default workflow (configs/default.yaml:
# simulate -> embed -> build-graph -> cluster -> init, the log replayed through `graphdiff watch`, and
# the evaluate report) with Snakemake on 2 cores, and print where the report is.
# Extra arguments go to snakemake (e.g. --forceall, or --config run=NAME).
# GRAPHDIFF_CORES sets the cores (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"   # the rules call `graphdiff`
start=$(date +%s)
.venv/bin/snakemake --cores "${GRAPHDIFF_CORES:-2}" --printshellcmds "$@"
# the run name of configs/default.yaml (`--config run=NAME` among the extra arguments changes it)
run=$(.venv/bin/python -c 'import yaml; print(yaml.safe_load(open("configs/default.yaml"))["run"])')
for arg in "$@"; do
    case "$arg" in run=*) run=${arg#run=} ;; esac
done
echo "" >&2
echo "done in $(( $(date +%s) - start )) s" >&2
for path in "artifacts/$run/STATE" "artifacts/$run/replay/predictions.jsonl" "artifacts/$run/grid/comparison.md"; do
    if [ -e "$path" ]; then echo "  $path" >&2; fi
done
report="artifacts/$run/report/report.md"
if [ ! -f "$report" ]; then
    echo "demo: no $report (is evaluate.enabled false in the config?)" >&2
    exit 1
fi
echo "report: $PWD/$report (plots beside it)"
