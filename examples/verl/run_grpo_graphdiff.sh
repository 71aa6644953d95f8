#!/usr/bin/env bash
# GRPO in verl 0.9 (its default v1 trainer) with graphdiff choosing every batch and fed every step's
# outcomes. Every parquet row needs a unique extra_info.index (verl fills in 0 when it is missing, and
# graphdiff refuses such data at start-up); the STATE's prompt ids are the str() of those indexes.
# verl 0.7 and older: run_grpo_graphdiff_v07.sh (the data.sampler.class_path hook).
set -euo pipefail
STATE=${STATE:-runs/STATE}
# verl imports this module in every process (also Ray workers started by this ray.init): it registers
# trainer.v1.trainer_mode=graphdiff. On an existing Ray cluster pass it through the runtime env instead:
#   +ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=graphdiff_cli.integrations.verl_v1
export VERL_USE_EXTERNAL_MODULES=graphdiff_cli.integrations.verl_v1
python3 -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  data.train_files="$HOME/data/math/train.parquet" \
  data.val_files="$HOME/data/math/test.parquet" \
  data.train_batch_size=128 \
  data.dataloader_num_workers=0 \
  trainer.v1.trainer_mode=graphdiff \
  +graphdiff.state="$STATE" \
  +graphdiff.strategy=target \
  +graphdiff.pool_factor=4 \
  +graphdiff.group_size=8 \
  actor_rollout_ref.rollout.n=8 \
  "$@"
# After a crash, resume verl from checkpoint step C only after: graphdiff rollback --state "$STATE" --to C
