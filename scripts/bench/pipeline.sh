#!/usr/bin/env bash
# The training pipeline on one GPU (GPU targets): coordinator, target worker and drafter
# worker on GPU 0, features through cuda_ipc (placement.transport auto), builtin:qwen3-8b-random
# target (Qwen3-8B shape, random bf16 weights), builtin:long-synthetic data (documents of
# 200-2000 tokens), 5-layer drafter, block 16. Prints per-geometry steps/s, context tokens/s and
# the peak GPU memory of each worker process (LibTorch's caching allocator).
# Env: GEOMS ("8192:512 16384:1024"), each tokens:anchors[:drafter_layers[:recompute]]
# (drafter.recompute: none, mlp or layers); TARGET (builtin:qwen3-8b-random; or
# builtin:qwen3.5-27b-random, Qwen3.5-27B's hybrid shape: 54 GB of bf16 weights);
# PROFILE=FIRST:COUNT (e.g. 8:4): both workers run those steps under the kernel profiler
# (--profile_steps, docs/operations.md) and a second table shows, per geometry, the step's wall
# time at the coordinator (median of the unprofiled steps), each process's device busy time (median
# of its profiled steps) and what is left outside the two processes' kernels; a third, each
# process's device time by kernel category. The profiled steps are left out of the first table.
#   scripts/bench/pipeline.sh BUILD_DIR [STEPS] [OUT_DIR]
set -euo pipefail
build=${1:?usage: pipeline.sh BUILD_DIR [STEPS] [OUT_DIR]}
steps=${2:-20}
out=${3:-/tmp/dflash_pipeline_bench}
bin=$build/services
py=${PYTHON:-python3}
mkdir -p "$out"; rm -f "$out/profile_rows.md"
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
      --log_file "$d/$role.log" ${PROFILE:+--profile_steps "$PROFILE"} 2>/dev/null &
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
    | awk -v n="$steps" -v p="${PROFILE:-0:0}" 'BEGIN { split(p, q, ":") }
        $1 >= 3 && $1 < n - 1 && !($1 >= q[1] && $1 < q[1] + q[2])' >"$d/steps.txt"
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
  [ -z "${PROFILE:-}" ] || "$py" - "$d" "$1" "$2" >>"$out/profile_rows.md" <<'PY'
import re, statistics, sys
d, tokens, anchors = sys.argv[1:4]
secs = [float(l.split()[2]) for l in open(f"{d}/steps.txt") if l.strip()]
def profiled(role):  # the key=value pairs of each "step profile:" line of the worker's log
    rows = []
    for line in open(f"{d}/{role}.log", errors="replace"):
        if "step profile: wall_ms=" in line:
            rows.append({k: float(v) for k, v in re.findall(r"(\w+)_ms=([0-9.]+)", line)})
    return rows
t, dr = profiled("target"), profiled("drafter")
med = lambda rows, k: statistics.median(r.get(k, 0.0) for r in rows) if rows else float("nan")
step_ms = 1000 * statistics.median(secs) if secs else float("nan")
tb, db = med(t, "busy"), med(dr, "busy")
out = step_ms - tb - db
print(f"A| {tokens} | {anchors} | {len(secs)} / {len(t)}, {len(dr)} | {step_ms:.1f} | {tb:.1f} | "
      f"{db:.1f} | {tb + db:.1f} | {out:.1f} | {100 * out / step_ms:.0f}% | {med(t, 'wall'):.1f} | "
      f"{med(dr, 'wall'):.1f} |")
cats = ["gemm", "attention", "loss", "elementwise_other", "optimizer", "copy", "fp8_quantization"]
for role, rows in (("target", t), ("drafter", dr)):
    print(f"B| {tokens} | {anchors} | {role} | " + " | ".join(f"{med(rows, c):.1f}" for c in cats)
          + f" | {med(rows, 'kernel'):.1f} |")
PY
done
if [ -n "${PROFILE:-}" ] && [ -f "$out/profile_rows.md" ]; then
  printf '\nwhere a step goes (ms; profiled steps %s; one GPU runs both processes, so their busy times add)\n\n' "$PROFILE"
  printf '| tokens | anchors | steps timed / profiled (target, drafter) | step ms (median) | target busy | drafter busy | both | outside the kernels | share | target wall in its step | drafter wall in its step |\n'
  printf '|---|---|---|---|---|---|---|---|---|---|---|\n'
  sed -n 's/^A//p' "$out/profile_rows.md"
  printf '\ndevice ms by kernel category (median of the profiled steps)\n\n'
  printf '| tokens | anchors | process | gemm | attention | loss | elementwise / other | optimizer | copy | fp8 quantization | all kernels |\n'
  printf '|---|---|---|---|---|---|---|---|---|---|---|\n'
  sed -n 's/^B//p' "$out/profile_rows.md"
  rm -f "$out/profile_rows.md"
fi
