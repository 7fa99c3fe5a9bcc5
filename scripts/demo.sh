#!/usr/bin/env bash
# The README's first command: sets up and builds dflash, starts a coordinator, one target worker
# and one drafter worker on loopback (ports chosen by the OS), submits configs/demo.yaml with
# `dflashctl submit` and follows the run to its end. Everything stops when the script exits.
# Logs and the run store stay in $DFLASH_DEMO_DIR (default: a fresh temporary folder).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
bin=${DFLASH_BUILD_DIR:-$root/build}/services
dir=${DFLASH_DEMO_DIR:-$(mktemp -d /tmp/dflash-demo-XXXXXX)}
mkdir -p "$dir"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# Waits until a ready file exists and prints the named integer field of its JSON.
ready_port() {
  local file=$1 field=$2
  for _ in $(seq 1 600); do
    if [ -s "$file" ]; then
      sed -n "s/.*\"$field\":\([0-9]*\).*/\1/p" "$file"
      return 0
    fi
    sleep 0.05
  done
  echo "[demo] $file did not appear; see the logs in $dir" >&2
  return 1
}

echo "[demo] logs and state in $dir"
"$bin/coordinator/dflash-coordinator" --listen 127.0.0.1:0 --metrics_listen 127.0.0.1:0 \
  --state_dir "$dir/state" --ready_file "$dir/coordinator.ready" --log_file "$dir/coordinator.log" \
  2>/dev/null &
pids+=($!)
port=$(ready_port "$dir/coordinator.ready" grpc_port)
export DFLASH_COORDINATOR=127.0.0.1:$port
for role in target drafter; do
  "$bin/${role}_worker/dflash-${role}-worker" --coordinator "$DFLASH_COORDINATOR" \
    --name "demo-$role" --ready_file "$dir/$role.ready" --log_file "$dir/$role.log" 2>/dev/null &
  pids+=($!)
  ready_port "$dir/$role.ready" grpc_port >/dev/null
done
echo "[demo] coordinator on $DFLASH_COORDINATOR (metrics on port $(ready_port "$dir/coordinator.ready" metrics_port))"

ctl="$bin/dflashctl/dflashctl"
for _ in $(seq 1 200); do
  [ "$("$ctl" workers -o json | grep -o '"WORKER_HEALTH_UP"' | wc -l)" -ge 2 ] && break
  sleep 0.05
done
"$ctl" workers

# Trains configs/demo.yaml through the workers, with a live progress line, to its end.
"$ctl" submit "$root/configs/demo.yaml"
run=$("$ctl" list -o json | sed -n 's/.*"run_id":"\([^"]*\)".*/\1/p' | tail -n 1)
"$ctl" export "$run" --out "$dir/drafter"

# The exported drafter loads back: a one-step run that starts from it (drafter.init_from) reports
# the loss of the loaded weights (computed before its update), not the untrained loss.
sed -e "s|^name: demo|name: demo-reload|" -e "s|max_steps: 300|max_steps: 1|" \
  -e "s|mask_token_id: auto}|mask_token_id: auto, init_from: \"$dir/drafter\"}|" \
  "$root/configs/demo.yaml" >"$dir/reload.yaml"
"$ctl" submit "$dir/reload.yaml" >"$dir/reload.out"
# The loss of a run's first step (from the coordinator's log) and of its last (dflashctl status).
first_loss() { grep -m1 " run=$1 step=0 .*\] loss " "$dir/coordinator.log" | sed 's/.*\] loss \([0-9.]*\).*/\1/'; }
last_loss() { "$ctl" status "$1" -o json | sed -n 's/.*"loss":\([0-9.e+-]*\).*/\1/p' | xargs printf '%.4f'; }
reload=$("$ctl" list -o json | sed -n 's/.*"run_id":"\([^"]*\)".*/\1/p' | tail -n 1)
cat <<MSG
[demo] run $run trained the drafter through the target and drafter workers:
[demo]   loss $(first_loss "$run") at step 1 -> $(last_loss "$run") at step 300 (dflashctl status $run)
[demo]   exported to $dir/drafter (config.json + model.safetensors, the serving format)
[demo] reloaded with drafter.init_from (run $reload): loss $(first_loss "$reload") on its first batch
[demo] logs, run store and run directories: $dir
MSG
