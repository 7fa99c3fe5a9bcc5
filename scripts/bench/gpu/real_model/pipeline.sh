#!/usr/bin/env bash
# The job: regeneration for $1 seconds, then training and evaluation, on /tmp/rm.
set -uo pipefail
source /tmp/repo/.devdeps/env.sh >/dev/null 2>&1; export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cuda/lib64
cd /tmp/repo
export MODEL=/tmp/models/SmolLM2-135M-Instruct TRAIN_PROMPTS=configs/smollm2/train-prompts-xl.jsonl.gz
echo "[pipeline] $(date -u +%FT%TZ) regen $1 s"
STAGES=regen REGEN_BATCH=512 REGEN_SECONDS=$1 bash scripts/bench/real_model.sh /tmp/b /tmp/rm
echo "[pipeline] $(date -u +%FT%TZ) regen rc=$?"
STAGES="train eval" MAX_STEPS=${MAX_STEPS:-3000} EVAL_EVERY=500 EVAL_MAX_PROMPTS=32 MAX_ANCHORS=2048 \
  EVAL_SETS="1:24 8:64 32:128" UNTRAINED_SET=8:32 bash scripts/bench/real_model.sh /tmp/b /tmp/rm
echo "[pipeline] $(date -u +%FT%TZ) train+eval rc=$?"
touch /tmp/rm.done
