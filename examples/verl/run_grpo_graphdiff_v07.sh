#!/usr/bin/env bash
# GRPO in verl (<= 0.7.x) with graphdiff choosing every batch. Every parquet row needs a unique
# extra_info.index: verl fills in 0 when it is missing, and graphdiff refuses such data at start-up.
set -euo pipefail
STATE=${STATE:-runs/STATE}
python3 -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  data.train_files="$HOME/data/math/train.parquet" \
  data.val_files="$HOME/data/math/test.parquet" \
  data.train_batch_size=128 \
  data.dataloader_num_workers=0 \
  data.sampler.class_path=pkg://graphdiff_cli.integrations.verl \
  data.sampler.class_name=GraphdiffCurriculumSampler \
  +data.sampler.state="$STATE" \
  +data.sampler.strategy=target \
  +data.sampler.pool_factor=4 \
  +data.sampler.group_size=8 \
  actor_rollout_ref.rollout.n=8 \
  "$@"
# After a crash, resume verl from checkpoint step C only after: graphdiff rollback --state "$STATE" --to C
