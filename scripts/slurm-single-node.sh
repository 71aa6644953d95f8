#!/usr/bin/env bash
# A one-machine SLURM cluster (controller and compute node on this host), to try the workflow's SLURM
# profile for real:  scripts/slurm-single-node.sh start | stop | status      (as root, on Debian)
#
#   start   installs slurm-wlm and munge with apt-get if they are missing, writes /etc/slurm/slurm.conf
#           for this host (its hostname, CPUs and memory as `slurmd -C` reads them; one partition,
#           `local`; select/cons_tres; no accounting daemon), starts munged, slurmctld and slurmd
#           directly (no systemd needed) and waits until sinfo shows the node idle. Idempotent: daemons
#           already running are left alone, and slurm.conf is rewritten only when its content changes.
#   stop    stops slurmd, slurmctld and munged (the ones this script started: their pid files).
#   status  the daemons' pids, sinfo, and the command that runs the workflow through the cluster.
#
# Outside the repository it writes only under /etc/slurm (slurm.conf, and the profile overlay
# /etc/slurm/snakemake/config.yaml), /var/spool (slurmctld's state, slurmd's spool), /var/log/slurm
# (the daemons' logs) and /var/run = /run (pid files, munge's socket); apt-get installs the packages.
#
# No accounting: AccountingStorageType=accounting_storage/none, so sacct, sacctmgr and sshare have
# nothing to say. The repository profile's slurm_account is therefore dropped by the overlay (the
# plugin submits without -A when no account is given and none can be guessed), and the plugin asks
# squeue for the jobs' states (slurm-status-command: squeue; MinJobAge=300 s keeps a finished job
# visible to squeue for 5 min, more than the plugin's 3 x 10 s threshold). No GRES either: the overlay
# sets the GPU-capable rules' resource gpu to 0 (no --gpus request), and every stage runs on the CPU.
#
# Run the demo through it (docs/how-to/slurm-single-node.md):
#   .venv/bin/snakemake --profile configs/profiles/slurm --profile /etc/slurm/snakemake
set -euo pipefail

CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
OVERLAY=$CONF_DIR/snakemake/config.yaml
LOG_DIR=/var/log/slurm
PARTITION=local
PIDS=(/run/munge/munged.pid /run/slurmctld.pid /run/slurmd.pid)

die() { echo "slurm-single-node: $*" >&2; exit 1; }

alive() {  # alive PIDFILE: the pid in PIDFILE is a running process
    [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    ((${#missing[@]} == 0)) && return 0
    echo "installing slurm-wlm and munge (missing: ${missing[*]})"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
}

write_conf() {
    local node host new cpus
    host=$(hostname -s)
    # "NodeName=<host> CPUs=.. Boards=.. SocketsPerBoard=.. CoresPerSocket=.. ThreadsPerCore=.. RealMemory=.."
    node=$(slurmd -C | head -n 1)
    [[ $node == "NodeName=$host "* ]] || die "slurmd -C did not describe this host ($host): $node"
    cpus=$(sed -n 's/.* CPUs=\([0-9]*\) .*/\1/p' <<<"$node")
    getent hosts "$host" >/dev/null || die "the hostname $host does not resolve (add it to /etc/hosts)"
    new=$(cat <<EOF
# Written by graphdiff's scripts/slurm-single-node.sh: a one-node cluster on $host.
ClusterName=graphdiff
SlurmctldHost=$host
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
# no cgroups needed (none are managed without systemd): processes tracked through /proc
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# no slurmdbd: no accounting, no job completion log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
MinJobAge=300
$node State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
)
    mkdir -p "$CONF_DIR"
    if [[ ! -f $CONF ]] || [[ "$(cat "$CONF")" != "$new" ]]; then
        printf '%s\n' "$new" >"$CONF"
        echo "wrote $CONF ($node)"
    fi
    mkdir -p "$(dirname "$OVERLAY")"
    cat >"$OVERLAY" <<EOF
# Written by graphdiff's scripts/slurm-single-node.sh: the site values of the one-node cluster on $host,
# laid over the repository's profile (a later --profile replaces the earlier one's top-level keys):
#   snakemake --profile configs/profiles/slurm --profile $(dirname "$OVERLAY")
# No account (this cluster has no accounting), every job on partition $PARTITION, job states from
# squeue (sacct needs slurmdbd), no GPU requests (gpu: 0; no GRES configured here), and no job asking
# for more threads than the node's $cpus CPUs (a larger --cpus-per-task would pend forever).
default-resources:
  slurm_partition: "$PARTITION"
  mem_mb: 4000
  runtime: 60
set-resources:
  embed: {slurm_partition: "$PARTITION", gpu: 0}
  embed_shard: {slurm_partition: "$PARTITION", gpu: 0}
  build_graph: {slurm_partition: "$PARTITION", gpu: 0}
  replay: {slurm_partition: "$PARTITION", gpu: 0}
  report: {slurm_partition: "$PARTITION", gpu: 0}
  grid_point: {slurm_partition: "$PARTITION", gpu: 0}
max-threads: $cpus
slurm-status-command: squeue
slurm-init-seconds-before-status-checks: 10
EOF
}

start() {
    [[ $(id -u) == 0 ]] || die "start needs root (apt-get, the daemons)"
    install_packages
    write_conf
    install -d -o slurm -g slurm /var/spool/slurmctld "$LOG_DIR"
    install -d /var/spool/slurmd
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
    [[ -s /etc/munge/munge.key ]] || runuser -u munge -- mungekey --create
    alive /run/munge/munged.pid || runuser -u munge -- munged
    alive /run/slurmctld.pid || slurmctld
    alive /run/slurmd.pid || slurmd
    local i
    for i in $(seq 60); do
        if sinfo -h -N -o '%t' 2>/dev/null | grep -qx 'idle'; then
            sinfo
            return 0
        fi
        sleep 1
    done
    sinfo -N -l || true
    die "the node is not idle after 60 s: see $LOG_DIR/slurmctld.log and $LOG_DIR/slurmd.log"
}

stop() {
    local f pid i
    for f in /run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid; do
        pid=$(cat "$f" 2>/dev/null) || continue
        kill -0 "$pid" 2>/dev/null || continue
        kill "$pid"
        for i in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
        kill -0 "$pid" 2>/dev/null && die "$(basename "$f" .pid) (pid $pid) still runs 30 s after SIGTERM"
        echo "stopped $(basename "$f" .pid)"
    done
}

status() {
    local f pid rc=0
    for f in "${PIDS[@]}"; do
        pid=$(cat "$f" 2>/dev/null) || pid=
        if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then echo "$(basename "$f" .pid): running (pid $pid)"
        else echo "$(basename "$f" .pid): not running"; rc=1; fi
    done
    scontrol ping >/dev/null 2>&1 && sinfo || rc=1
    echo "run the workflow: .venv/bin/snakemake --profile configs/profiles/slurm --profile $(dirname "$OVERLAY")"
    return $rc
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
