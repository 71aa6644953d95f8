#!/usr/bin/env bash
# The main job: set up .venv/ (scripts/setup.sh), then run the default workflow (configs/default.yaml:
# simulate -> embed -> build-graph -> cluster -> init, then the log replayed through `graphdiff watch` and the
# evaluate report side by side) with Snakemake on 2 cores, and print where the report is.
# Each job writes its progress to logs/<run>/<job>.log; scripts/follow_logs.py shows those lines here as
# they come, prefixed with the job ([embed], [report], ...), beside Snakemake's own messages.
# Extra arguments go to snakemake (e.g. --forceall, or --config run=NAME).
# GRAPHDIFF_CORES sets the cores (default 2); GRAPHDIFF_PROGRESS_SECONDS the seconds between two progress
# lines of a job (default here 10).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
load() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?"; }
echo "demo: [1/2] set-up of .venv/ (scripts/setup.sh; load average $(load))" >&2
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"   # the rules call `graphdiff`
if [ ! -x .venv/bin/snakemake ]; then
    echo "demo: snakemake is not installed in .venv: the workflow needs the workflow extra" \
         "(GRAPHDIFF_EXTRAS=test,workflow bash scripts/setup.sh, or pip install 'graphdiff-rl[workflow]')" >&2
    exit 1
fi
# the run name of configs/default.yaml (`--config run=NAME` among the extra arguments changes it)
run=$(.venv/bin/python -c 'import yaml; print(yaml.safe_load(open("configs/default.yaml"))["run"])')
for arg in "$@"; do
    case "$arg" in run=*) run=${arg#run=} ;; esac
done
logs="logs/$run"
cores=${GRAPHDIFF_CORES:-2}
echo "demo: [2/2] the workflow on $cores cores: simulate -> embed (the longest job) -> build-graph -> cluster" \
     "-> init, then the replay through watch and evaluate's report side by side" >&2
echo "demo: each job's log is $logs/<job>.log, shown below as its [job] lines;" \
     "Snakemake's own log is under .snakemake/log/; outputs go to artifacts/$run/" >&2
export GRAPHDIFF_PROGRESS_SECONDS=${GRAPHDIFF_PROGRESS_SECONDS:-10}
mkdir -p "$logs"
.venv/bin/python scripts/follow_logs.py "$logs" --every "$GRAPHDIFF_PROGRESS_SECONDS" &
follower=$!
trap 'kill "$follower" 2>/dev/null || true' EXIT
status=0
.venv/bin/snakemake --cores "$cores" --printshellcmds "$@" || status=$?
kill "$follower" 2>/dev/null || true
wait "$follower" 2>/dev/null || true
echo "" >&2
echo "demo: done in $(( $(date +%s) - start )) s (load average now $(load), $(nproc) CPUs)" >&2
if [ "$status" -ne 0 ]; then
    echo "demo: snakemake failed (exit $status); the failing job's log is named above, all of them in $logs/" >&2
    exit "$status"
fi
for path in "artifacts/$run/STATE" "artifacts/$run/replay/predictions.jsonl" "artifacts/$run/grid/comparison.md"; do
    if [ -e "$path" ]; then echo "  $path" >&2; fi
done
report="artifacts/$run/report/report.md"
if [ ! -f "$report" ]; then
    echo "demo: no $report (is evaluate.enabled false in the config?)" >&2
    exit 1
fi
echo "report: $PWD/$report (plots beside it)"
