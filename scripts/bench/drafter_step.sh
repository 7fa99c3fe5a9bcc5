#!/usr/bin/env bash
# The drafter training step against a PyTorch reference of the same step, in one run (GPU
# targets): drafter_step (ours: DrafterModel + DrafterTrainer) writes its batch, its initial weights
# and its JSON; drafter_step_ref.py runs the same step in PyTorch (compiled FlexAttention, chunked
# cross-entropy, fused AdamW) from those files and cross-checks the first step's loss. Then one
# markdown table with the issue's three ratios. Run on the GPU machine from a build tree:
#   PYTHON=/opt/torch/.venv/bin/python3 scripts/bench/drafter_step.sh BUILD_DIR [OUT_DIR]
# Env: GEOMS ("8192:512 16384:1024", tokens:anchors), STEPS (10), WARMUP (3), REF_ARGS (extra
# drafter_step_ref.py flags, e.g. "--compile flex"), OURS_ARGS (extra drafter_step flags; "--device
# cpu --target builtin:tiny-qwen3 ..." for the CPU smoke test), WORK (large files: 4.2 GB of F32
# weights, the features; default /tmp/drafter_step_work), PHASES ("ours ref": run ours, then the
# reference, per geometry; "ours" or "ref" alone runs one side for every geometry, so that
# PHASES=ours then PHASES=ref measures ours at every geometry before the reference's compiles).
set -euo pipefail
build=${1:?usage: drafter_step.sh BUILD_DIR [OUT_DIR]}
out=${2:-/tmp/drafter_step_bench}
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
work=${WORK:-/tmp/drafter_step_work}
steps=${STEPS:-10}
warmup=${WARMUP:-3}
mkdir -p "$out" "$work"
first=1
geoms=${GEOMS:-8192:512 16384:1024}  # unquoted below: one word per geometry
for geom in $geoms; do
  geom=${geom/:/ }
  set -- $geom
  echo "== drafter step: $1 context tokens, max_anchors $2 =="
  export_flag=()
  # Same seed at every geometry: the same initial drafter, exported once.
  [ "$first" = 1 ] && export_flag=(--export-weights "$work/weights")
  first=0
  phases=${PHASES:-"ours ref"}
  [[ " $phases " == *" ours "* ]] && "$build/scripts/bench/drafter_step" --tokens "$1" --anchors "$2" --steps "$steps" \
    --warmup "$warmup" --json "$out/ours_$1.json" --dump-dir "$work/batch_$1" \
    "${export_flag[@]}" ${OURS_ARGS:-}
  [[ " $phases " == *" ref "* ]] && PYTHONUNBUFFERED=1 "$py" "$here/drafter_step_ref.py" --dump-dir "$work/batch_$1" \
    --weights "$work/weights" --ours "$out/ours_$1.json" --json "$out/ref_$1.json" \
    --steps "$steps" --warmup "$warmup" ${REF_ARGS:-}
done
[[ " ${PHASES:-ours ref} " == *" ref "* ]] || exit 0
"$py" - "$out" $geoms <<'PY'
import json, sys
out = sys.argv[1]
gib = lambda b: b / 2**30
print()
print("| tokens / anchors | implementation | ms/step (median) | ms/step back to back | steps/s | context tok/s | peak GiB | "
      "static GiB (params+grads+Adam / frozen tensors on the device) | beyond static GiB | first-step loss |")
print("|---|---|---|---|---|---|---|---|---|---|")
ratios = []
for g in sys.argv[2:]:
    t = g.split(":")[0]
    try:
        o = json.load(open(f"{out}/ours_{t}.json"))
        r = json.load(open(f"{out}/ref_{t}.json"))
    except FileNotFoundError as e:
        print(f"| {g} | missing: {e.filename} |")
        continue
    for x in (o, r):
        print(f"| {x['tokens']} / {x['anchors']} | {x['impl']} | {x['ms_median']:.1f} | "
              f"{x.get('ms_pipelined', float('nan')):.1f} | "
              f"{x['steps_per_s']:.2f} | {x['ctx_tok_per_s']:,.0f} | {gib(x['peak_bytes']):.2f} | "
              f"{gib(x['static_bytes']):.2f} ({gib(x['train_static_bytes']):.2f} / "
              f"{gib(x['frozen_bytes']):.2f}) | {gib(x['beyond_bytes']):.2f} | {x['first_loss']:.5f} |")
    rel = abs(o["first_loss"] - r["first_loss"]) / abs(r["first_loss"])
    pk = o["peak_bytes"] / r["peak_bytes"] if r["peak_bytes"] else float("nan")
    by = o["beyond_bytes"] / r["beyond_bytes"] if r["beyond_bytes"] else float("nan")
    piped = r.get("ms_pipelined", float("nan")) / o.get("ms_pipelined", float("nan"))
    ratios.append((f"{o['tokens']} / {o['anchors']}", o["ctx_tok_per_s"] / r["ctx_tok_per_s"], pk, by,
                   rel, o.get("other_target_bytes", 0), piped))
print()
print("| tokens / anchors | tok/s ours / ref (target >= 1.5) | back to back | peak ours / ref (<= 0.8) | "
      "beyond ours / ref (<= 0.5) | first-step loss rel. diff (<= 2e-2) | ours: other target tensors at load (freed), GiB |")
print("|---|---|---|---|---|---|---|")
for g, tk, pk, by, rel, other, piped in ratios:
    mark = lambda ok: "met" if ok else "MISSED"
    print(f"| {g} | {tk:.2f}x {mark(tk >= 1.5)} | {piped:.2f}x | {pk:.2f} {mark(pk <= 0.8)} | {by:.2f} {mark(by <= 0.5)} | "
          f"{rel:.1e} {'OK' if rel <= 2e-2 else 'MISMATCH'} | {gib(other):.2f} |")
PY
