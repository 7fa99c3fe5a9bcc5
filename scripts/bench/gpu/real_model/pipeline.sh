#!/usr/bin/env bash
# The job, on /tmp/rm: regeneration for $1 seconds (its output kept as /tmp/regen.jsonl.gz, which
# poll.sh returns in pieces, so that a later lease can skip it); then, side by side, the main
# training (MAX_STEPS, default 6000) and the reference comparison on /tmp/rmref (REF_STEPS steps of
# dflash and of the PyTorch loop scripts/bench/train_ref.py on the same data, each evaluated at
# batch 32 on 128 held-out prompts; bounded by REF_TIMEOUT so that it is over before the final
# evaluations time anything); then the final evaluations (EVAL_SETS) and the reference package's
# evaluation in fp32 (REFPKG_PROMPTS).
set -uo pipefail
source /tmp/repo/.devdeps/env.sh >/dev/null 2>&1; export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cuda/lib64
cd /tmp/repo
export MODEL=/tmp/models/SmolLM2-135M-Instruct TRAIN_PROMPTS=configs/smollm2/train-prompts-xl.jsonl.gz
export MAX_ANCHORS=2048 EVAL_MAX_PROMPTS=32
stamp() { echo "[pipeline] $(date -u +%FT%TZ) $*"; }
stamp "regen $1 s"
STAGES=regen REGEN_BATCH=512 REGEN_SECONDS=$1 bash scripts/bench/real_model.sh /tmp/b /tmp/rm
stamp "regen rc=$? records=$(wc -l </tmp/rm/regen.jsonl)"
(gzip -1 -c /tmp/rm/regen.jsonl >/tmp/regen.jsonl.gz.tmp && mv /tmp/regen.jsonl.gz.tmp /tmp/regen.jsonl.gz) &
refpid=
if [ "${REF_STEPS:-600}" -gt 0 ]; then
  mkdir -p /tmp/rmref && cp /tmp/rm/regen.jsonl /tmp/rmref/
  (STAGES="train eval ref" MAX_STEPS=${REF_STEPS:-600} EVAL_EVERY=0 EVAL_SETS="32:128" UNTRAINED_SET=32:8 \
     timeout "${REF_TIMEOUT:-480}" bash scripts/bench/real_model.sh /tmp/b /tmp/rmref >/tmp/rmref.log 2>&1
   echo "[ref] rc=$?" >>/tmp/rmref.log) &
  refpid=$!
fi
STAGES=train MAX_STEPS=${MAX_STEPS:-6000} EVAL_EVERY=${EVAL_EVERY:-1000} \
  bash scripts/bench/real_model.sh /tmp/b /tmp/rm
stamp "train rc=$?"
[ -n "$refpid" ] && wait "$refpid"; stamp "reference comparison: $(tail -n 1 /tmp/rmref.log 2>/dev/null)"
STAGES="eval refpkg" MAX_STEPS=${MAX_STEPS:-6000} EVAL_SETS="${EVAL_SETS:-1:64 32:294}" UNTRAINED_SET=32:64 \
  REFPKG_PROMPTS=${REFPKG_PROMPTS:-8} DFLASH_PATH=/tmp/site bash scripts/bench/real_model.sh /tmp/b /tmp/rm
stamp "eval rc=$?"
touch /tmp/rm.done
