#!/usr/bin/env bash
# The training pipeline on one GPU (GPU targets): coordinator, target worker and drafter
# worker on GPU 0, features through cuda_ipc (placement.transport auto), builtin:qwen3-8b-random
# target (Qwen3-8B shape, random bf16 weights), builtin:long-synthetic data (documents of
# 200-2000 tokens), 5-layer drafter, block 16. Prints per-geometry steps/s, context tokens/s and
# the peak GPU memory of each worker process (LibTorch's caching allocator).
# Env: GEOMS ("8192:512 16384:1024"), each tokens:anchors[:drafter_layers[:recompute]]
# (drafter.recompute: none, mlp or layers); TARGET (builtin:qwen3-8b-random; or
# builtin:qwen3.5-27b-random, Qwen3.5-27B's hybrid shape: 54 GB of bf16 weights).
#   scripts/bench/pipeline.sh BUILD_DIR [STEPS] [OUT_DIR]
set -euo pipefail
build=${1:?usage: pipeline.sh BUILD_DIR [STEPS] [OUT_DIR]}
steps=${2:-20}
out=${3:-/tmp/dflash_pipeline_bench}
bin=$build/services
py=${PYTHON:-python3}
mkdir -p "$out"
metric() {  # metric PORT NAME: the first sample of NAME on that /metrics
  "$py" - "$1" "$2" <<'PY'
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics").read().decode()
for line in body.splitlines():
    if line.startswith(sys.argv[2] + "{") or line.startswith(sys.argv[2] + " "):
        print(float(line.rsplit(" ", 1)[1])); break
PY
}
port_of() { sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p" "$1"; }
wait_file() { for _ in $(seq 600); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }

printf '| tokens | anchors | drafter layers | steps timed | step s (median) | steps/s | context tok/s | target peak GiB | drafter peak GiB | target reserved GiB | drafter reserved GiB |\n'
printf '|---|---|---|---|---|---|---|---|---|---|---|\n'
geoms=${GEOMS:-8192:512 16384:1024}  # unquoted below: one word per geometry
for geom in $geoms; do
  geom=${geom//:/ }
  set -- $geom
  layers=${3:-5}
  recompute=${4:-none}
  d=$out/run_$1_$2_${layers}_$recompute; rm -rf "$d"; mkdir -p "$d"
  "$bin/coordinator/dflash-coordinator" --listen 127.0.0.1:0 --metrics_listen 127.0.0.1:0 \
    --state_dir "$d/state" --ready_file "$d/c.ready" --log_file "$d/c.log" 2>/dev/null &
  pc=$!
  wait_file "$d/c.ready"
  export DFLASH_COORDINATOR=127.0.0.1:$(port_of "$d/c.ready" grpc_port)
  for role in target drafter; do
    "$bin/${role}_worker/dflash-${role}-worker" --coordinator "$DFLASH_COORDINATOR" --gpu 0 \
      --name "$role" --metrics_listen 127.0.0.1:0 --ready_file "$d/$role.ready" \
      --log_file "$d/$role.log" 2>/dev/null &
    eval "p_$role=$!"
    wait_file "$d/$role.ready"
  done
  cat >"$d/run.yaml" <<YAML
name: bench-$1
target: {path: "${TARGET:-builtin:qwen3-8b-random}", dtype: bfloat16}
drafter: {layers: $layers, block_size: 16, recompute: $recompute}
data: {train: "builtin:long-synthetic", max_length: 2048}
batching: {token_budget: $1, max_anchors: $2, grad_accum: 1}
optim: {lr: 6.0e-4, max_steps: $steps}
placement: {pairs: 1, transport: auto}
checkpoint: {every_steps: 100000, keep: 1}
YAML
  "$bin/dflashctl/dflashctl" submit "$d/run.yaml" >"$d/submit.out" 2>&1 || {
    echo "run failed: $(tail -n 3 "$d/submit.out")"; tail -n 20 "$d"/*.log; }
  sleep 1.5  # one more heartbeat: the workers refresh their memory gauges on each
  tp=$(metric "$(port_of "$d/target.ready" metrics_port)" dflash_worker_gpu_memory_peak_bytes)
  dp=$(metric "$(port_of "$d/drafter.ready" metrics_port)" dflash_worker_gpu_memory_peak_bytes)
  tr=$(metric "$(port_of "$d/target.ready" metrics_port)" dflash_worker_gpu_memory_reserved_bytes)
  dr=$(metric "$(port_of "$d/drafter.ready" metrics_port)" dflash_worker_gpu_memory_reserved_bytes)
  kill "$pc" "$p_target" "$p_drafter"; wait 2>/dev/null || true
  # Steps 3 .. steps-2 (the first ones warm up; the last one checkpoints and exports).
  grep "\] loss " "$d/c.log" | sed -n 's/.* step=\([0-9]*\) .* \([0-9]*\) tok  \([0-9.]*\) s.*/\1 \2 \3/p' \
    | awk -v n="$steps" '$1 >= 3 && $1 < n - 1' >"$d/steps.txt"
  rm -rf "$d/state"  # checkpoints of a Qwen3-8B-sized drafter are 12.6 GB each
  lr=$layers; [ "$recompute" = none ] || lr="$layers (recompute $recompute)"
  "$py" - "$d/steps.txt" "$1" "$2" "$tp" "$dp" "$lr" "$tr" "$dr" <<'PY'
import sys, statistics
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
secs = [r[2] for r in rows]; toks = [r[1] for r in rows]
med = statistics.median(secs) if secs else float("nan")
tps = sum(toks) / sum(secs) if secs else float("nan")
gib = lambda b: float(b) / 2**30 if b else float("nan")
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[6]} | {len(rows)} | {med:.3f} | {1/med:.2f} | {tps:,.0f} | "
      f"{gib(sys.argv[4]):.2f} | {gib(sys.argv[5]):.2f} | {gib(sys.argv[7]):.2f} | {gib(sys.argv[8]):.2f} |")
PY
done
