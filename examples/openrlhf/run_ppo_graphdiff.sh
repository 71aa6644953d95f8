#!/usr/bin/env bash
# GRPO with OpenRLHF 0.11 (Ray + vLLM), graphdiff fed every training step's outcomes through the reward
# function (examples/openrlhf/reward_func.py), and graphdiff choosing what each wave generates (the Ray
# setup hook replaces OpenRLHF's prompt loader in the trainer process; GRESO's pre-filter under dynamic
# filtering; docs/how-to/openrlhf.md, "Steering what OpenRLHF generates"). Each row of train.jsonl: {"prompt": ..., "label":
# "{\"id\": \"p17\", \"answer\": \"42\"}"}; the ids are the STATE's prompt ids.
set -euo pipefail
STATE=${STATE:-runs/STATE}
B=128; N=8
ray job submit --address="http://127.0.0.1:8265" \
  --runtime-env-json "{\"worker_process_setup_hook\": \"graphdiff_cli.integrations.openrlhf.install\",
    \"env_vars\": {\"GRAPHDIFF_CHOOSE\": \"prefilter\", \"GRAPHDIFF_STATE\": \"$PWD/$STATE\", \"GRAPHDIFF_BATCH_SIZE\": \"$B\",
    \"GRAPHDIFF_N_SAMPLES\": \"$N\", \"GRAPHDIFF_FILTER_RANGE\": \"0,1\",
    \"GRAPHDIFF_EPISODE_PROMPTS\": \"$(wc -l < train.jsonl)\"}}" \
  -- python3 -m openrlhf.cli.train_ppo_ray \
  --reward.remote_url "$PWD/examples/openrlhf/reward_func.py" \
  --data.prompt_dataset train.jsonl --data.input_key prompt --data.label_key label \
  --rollout.batch_size $B --rollout.n_samples_per_prompt $N \
  --algo.dynamic_filtering_enable --algo.dynamic_filtering_range 0 1 \
  "$@"
# Synchronous training only (--train.async_enable is refused). Drop worker_process_setup_hook and
# GRAPHDIFF_CHOOSE to keep OpenRLHF's own shuffle and only record outcomes.
# After a crash, resume from checkpoint step C only after: graphdiff rollback --state "$STATE" --to C,
# and remove runs/STATE.openrlhf/{pending.jsonl,closing.json,episode.json} (the interrupted wave).
