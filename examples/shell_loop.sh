#!/usr/bin/env bash
# A trainer's between-steps calls from a shell loop: any trainer that can run a command and write a
# file can use graphdiff this way. Once per training step T:
#
#   graphdiff select  --state STATE ...  --out batch.txt          # which prompts to train on next
#   ... the trainer rolls out batch.txt and writes outcomes-T.jsonl ({"id", "reward"} per rollout) ...
#   graphdiff update  --state STATE --step T --outcomes outcomes-T.jsonl
#   graphdiff predict --state STATE --out predictions.jsonl       # p-hat of every prompt for the sampler
#
# Here the "trainer" is a stand-in (each prompt has a hidden success rate that rises a little every
# step): replace `rollout` with your generation and reward code. The loop resumes after a crash at the
# STATE's step + 1 (`graphdiff update` refuses a step twice or a gap). The cron-style alternative,
# where the trainer only drops outcomes files into an inbox, is `graphdiff watch` (docs/reference/workflow.md).
#
#   bash scripts/demo.sh                                  # makes artifacts/demo/STATE (step 0)
#   cp -r artifacts/demo/STATE /tmp/STATE                 # work on a copy
#   bash examples/shell_loop.sh /tmp/STATE 3 32           # STATE, steps, batch size
set -euo pipefail
STATE=${1:?usage: shell_loop.sh STATE [STEPS] [BATCH_SIZE]}
STEPS=${2:-3}
BATCH=${3:-32}
ROLLOUTS=8
here=$(cd "$(dirname "$0")/.." && pwd)
GD=${GRAPHDIFF:-$(command -v graphdiff || echo "$here/.venv/bin/graphdiff")}
PY=${PYTHON:-$(command -v python3)}
WORK="${STATE%/}.work"
mkdir -p "$WORK"

rollout() {  # stand-in trainer: batch file -> outcomes file, one {"id", "reward"} row per rollout
    "$PY" - "$1" "$2" "$3" "$ROLLOUTS" <<'PY'
import json, random, sys, zlib
batch, out, step, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(step)
with open(out, "w") as f:
    for pid in open(batch).read().split():
        p = min(1.0, 0.05 + 0.9 * (zlib.crc32(pid.encode()) % 1000) / 1000 + 0.01 * step)
        for _ in range(n):
            f.write(json.dumps({"id": pid, "reward": float(rng.random() < p)}) + "\n")
PY
}

current=$("$GD" status --state "$STATE" --json | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["step"])')
"$GD" predict --state "$STATE" --out "$WORK/predictions.jsonl" -q
"$PY" -c 'import json, sys; [print(json.loads(l)["id"]) for l in open(sys.argv[1])]' \
    "$WORK/predictions.jsonl" > "$WORK/pool.txt"            # candidates: every prompt

for (( t = current + 1; t <= current + STEPS; t++ )); do
    # before the step: choose the batch (closest predicted p to 0.5: the most informative groups)
    "$GD" select --state "$STATE" --candidates "$WORK/pool.txt" --batch-size "$BATCH" --strategy target \
        --seed "$t" --out "$WORK/batch.txt" -q
    # the training step (stand-in); write to a temporary name, then rename: a reader never sees half
    rollout "$WORK/batch.txt" "$WORK/.outcomes-$t.jsonl.tmp" "$t"
    mv "$WORK/.outcomes-$t.jsonl.tmp" "$WORK/outcomes-$t.jsonl"
    # between steps: apply the outcomes (exactly once), refresh the predictions
    "$GD" update --state "$STATE" --step "$t" --outcomes "$WORK/outcomes-$t.jsonl" -q
    "$GD" predict --state "$STATE" --out "$WORK/predictions.jsonl" --json \
        | "$PY" -c 'import json, sys; r = json.load(sys.stdin); print("step %d: mean p-hat %.3f" % (r["step"], r["p_mean"]))'
done
echo "predictions: $WORK/predictions.jsonl" >&2
