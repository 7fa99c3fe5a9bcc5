#!/usr/bin/env bash
# On the GPU machine (no package registry there): installs the wheels wheels.sh fetched into a
# --target directory put first on PYTHONPATH (the venv itself is left as it is: its transformers /
# huggingface-hub are not upgraded), then runs the peers' own DFlash training steps at the
# Qwen3-8B drafter geometry, 8192 context tokens / 512 anchors, and appends one JSON line per peer
# to $OUT/peers.jsonl (a failed peer leaves {"impl", "error", "log_tail"} instead).
#
#   scripts/bench/peers/run_peers.sh WHEELS_DIR            (from the repository root)
#
# Env: OUT (default /tmp/peers_out), PYTHON (default /opt/torch/.venv/bin/python3 when present,
# else python3), SITE (the --target dir, default /tmp/peers_site), TOKENS (8192), ANCHORS (512),
# STEPS (10), WARMUP (3), PEERS (default "specforge speculators"; "speculators_sw" adds
# speculators with its CLI's default sliding window of 2048 on every layer), SPECFORGE_ARGS /
# SPECULATORS_ARGS (extra flags for one peer), COMMON_ARGS (extra flags for both, e.g. a tiny
# geometry), DEVICE (cuda; cpu for a rehearsal with a tiny geometry), PEER_TIMEOUT (seconds per
# peer, default 280, so that both fit one 600-s device call; a peer that runs out leaves its error
# line and the next one still runs), LOGS (1, the default: keep each peer's stdout+stderr as
# $OUT/peers_NAME.log; 0: only the JSON lines).
# Exit status: 0 when every peer produced its line, 1 otherwise.
set -uo pipefail
wheels=${1:?usage: run_peers.sh WHEELS_DIR}
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${PYTHON:-}" ]; then
  if [ -x /opt/torch/.venv/bin/python3 ]; then PYTHON=/opt/torch/.venv/bin/python3; else PYTHON=python3; fi
fi
out=${OUT:-/tmp/peers_out}
site=${SITE:-/tmp/peers_site}
tokens=${TOKENS:-8192}
anchors=${ANCHORS:-512}
steps=${STEPS:-10}
warmup=${WARMUP:-3}
peers=${PEERS:-specforge speculators}
mkdir -p "$out"
: >"$out/peers.jsonl"

ls "$wheels"/*.whl >/dev/null || { echo "run_peers.sh: no wheels in $wheels" >&2; exit 1; }
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site" "$wheels"/*.whl || { echo "run_peers.sh: wheel install failed" >&2; exit 1; }
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
"$PYTHON" -c 'import torch, transformers, specforge, sys; print("python", sys.version.split()[0],
"torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers", transformers.__version__)'

common=(--tokens "$tokens" --anchors "$anchors" --steps "$steps" --warmup "$warmup"
        --device "${DEVICE:-cuda}")
status=0
for name in $peers; do
  case $name in
    specforge) script=specforge_step.py; extra=${SPECFORGE_ARGS:-} ;;
    speculators) script=speculators_step.py; extra=${SPECULATORS_ARGS:-} ;;
    speculators_sw) script=speculators_step.py; extra="--sliding-window 2048 ${SPECULATORS_ARGS:-}" ;;
    *) echo "run_peers.sh: unknown peer $name" >&2; status=1; continue ;;
  esac
  log="$out/peers_$name.log"
  line=$(mktemp /tmp/peers_line.XXXXXX)
  echo "== $name: $script ${common[*]} ${COMMON_ARGS:-} $extra"
  # shellcheck disable=SC2086  # $extra: one word per flag
  timeout "${PEER_TIMEOUT:-280}" "$PYTHON" "$here/$script" "${common[@]}" ${COMMON_ARGS:-} $extra \
    --json "$line" >"$log" 2>&1
  rc=$?
  if [ -s "$line" ]; then
    # The result is written once the timed steps are done; a peer that then fails to exit (on the
    # H100 run of 2026-12-07 speculators' process outlived PEER_TIMEOUT after writing it) keeps
    # its measurement, with the exit status beside it.
    if [ $rc -eq 0 ]; then
      cat "$line" >>"$out/peers.jsonl"
    else
      "$PYTHON" -c 'import json, sys; r = json.loads(open(sys.argv[1]).readline()); r["exit_after_result"] = sys.argv[2]; print(json.dumps(r))' \
        "$line" "exit $rc$([ $rc -eq 124 ] && echo ' (timeout)')" >>"$out/peers.jsonl"
    fi
    tail -n 1 "$out/peers.jsonl" | cut -c1-400
  else
    status=1
    echo "run_peers.sh: $name failed (exit $rc); the end of its log:" >&2
    tail -n 15 "$log" >&2
    "$PYTHON" - "$name" "$rc" "$log" >>"$out/peers.jsonl" <<'PY'
import json, sys
name, rc, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
tail = open(log, errors="replace").read()[-3000:]
print(json.dumps({"impl": name, "error": f"exit {rc}" + (" (timeout)" if rc == 124 else ""),
                  "log_tail": tail}))
PY
  fi
  rm -f "$line"
  [ "${LOGS:-1}" = 1 ] || rm -f "$log"
done
echo "run_peers.sh: $(wc -l <"$out/peers.jsonl") line(s) in $out/peers.jsonl"
exit $status
