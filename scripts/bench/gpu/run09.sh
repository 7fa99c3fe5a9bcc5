#!/usr/bin/env bash
# Device run 9: the demo's flow at full size on one GPU, target and drafter workers on GPU 0:
# `dflashctl regen` of all 2000 tiny-chat conversations by builtin:tiny-qwen3 (batches of 256),
# configs/demo.yaml trained 600 steps on the regenerated answers with a measured tau every 200
# steps, then `dflashctl eval` (64 prompts x 128 tokens) of the export at batch 1, 16 and 64 and of
# an untrained drafter (one step at lr 1e-12) at batch 16: tau, tokens/s against plain greedy.
# Cited in: docs/benchmarks.md, "Speculative decoding with a drafter the system trained, on one
# H200" (the table, and "Again at 6bab102").
# Recorded: 2026-12-03, main at 1e452ce, and the same call again at 6bab102; one NVIDIA H200.
# Reconstructed after the fact from the command recorded beside the figure; the original one-off
# wrapper was not kept.
# Inferred: the docs give the three dflashctl commands and the run's settings, not the wrapper; the
# processes are started, the drafter exported and the untrained run made as scripts/demo.sh does
# them (the workers with --gpu 0), and the run.yaml is configs/demo.yaml edited as the docs say
# (regen.jsonl pretokenized, 600 steps, placement.transport auto, the eval line). Build type not
# recorded: device_run.sh's default, Release.
# Run from a checkout on the GPU machine with OUT set; the output is in $OUT/log, the files in
# $OUT/run09.
set -euo pipefail
cd "$(dirname "$0")/../../.."
export OUT=${OUT:?set OUT to the folder the results go to}
[ "${1:-}" = steps ] || exec scripts/bench/device_run.sh /tmp/b \
  "dflash-coordinator dflash-target-worker dflash-drafter-worker dflashctl" \
  bash scripts/bench/gpu/run09.sh steps
# Inside device_run.sh (BUILD exported):
bin=$BUILD/services
ctl=$bin/dflashctl/dflashctl
d=$OUT/run09
rm -rf "$d" && mkdir -p "$d"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
wait_file() { for _ in $(seq 600); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }
last_run() { "$ctl" list -o json | sed -n 's/.*"run_id":"\([^"]*\)".*/\1/p' | tail -n 1; }
"$bin/coordinator/dflash-coordinator" --listen 127.0.0.1:0 --metrics_listen 127.0.0.1:0 \
  --state_dir "$d/state" --ready_file "$d/c.ready" --log_file "$d/c.log" 2>/dev/null &
pids+=($!)
wait_file "$d/c.ready"
port=$(sed -n 's/.*"grpc_port":\([0-9]*\).*/\1/p' "$d/c.ready")
export DFLASH_COORDINATOR=127.0.0.1:$port
for role in target drafter; do
  "$bin/${role}_worker/dflash-${role}-worker" --coordinator "$DFLASH_COORDINATOR" --gpu 0 \
    --name "$role" --ready_file "$d/$role.ready" --log_file "$d/$role.log" 2>/dev/null &
  pids+=($!)
  wait_file "$d/$role.ready"
done
for _ in $(seq 200); do  # both workers registered and up (as scripts/demo.sh waits)
  [ "$("$ctl" workers -o json | grep -o '"WORKER_HEALTH_UP"' | wc -l)" -ge 2 ] && break
  sleep 0.05
done
# 1. Regeneration.
"$ctl" regen configs/demo.yaml --out "$d/regen.jsonl" --batch_size 256
# 2. Training on the regenerated answers.
sed -e "s|data: {train: \"builtin:tiny-chat\", format: chat|data: {train: \"$d/regen.jsonl\", \
format: pretokenized|" \
  -e "s|max_steps: 300|max_steps: 600|" -e "s|transport: host|transport: auto|" \
  configs/demo.yaml >"$d/run.yaml"
echo 'eval: {every_steps: 200, prompts: "builtin:tiny-chat", max_prompts: 64,'\
' max_new_tokens: 128}' >>"$d/run.yaml"
"$ctl" prepare "$d/run.yaml"
"$ctl" submit "$d/run.yaml"
"$ctl" export "$(last_run)" --out "$d/drafter"
sed -e "s|^name: demo|name: demo-untrained|" -e "s|max_steps: 600|max_steps: 1|" \
  -e "s|lr: 2.0e-2|lr: 1.0e-12|" -e "/^eval:/d" "$d/run.yaml" >"$d/untrained.yaml"
"$ctl" submit "$d/untrained.yaml"
"$ctl" export "$(last_run)" --out "$d/drafter-untrained"
# 3. Speculative decoding against plain greedy decoding.
ev() {
  "$ctl" eval "$d/run.yaml" --drafter "$1" --prompts builtin:tiny-chat --max_prompts 64 \
    --max_new_tokens 128 --batch_size "$2"
}
for b in 1 16 64; do ev "$d/drafter" "$b"; done
ev "$d/drafter-untrained" 16
