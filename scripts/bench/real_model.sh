#!/usr/bin/env bash
# The real-model job end to end (docs/real-model.md): a DFlash drafter for SmolLM2-135M-Instruct.
#   1. starts a coordinator, a target worker and a drafter worker (GPU 0, or the CPU with DEVICE=cpu);
#   2. dflashctl regen: the target answers the training prompts (configs/smollm2/train-prompts.jsonl);
#   3. dflashctl prepare + submit of configs/smollm2/run.yaml on those answers, with the held-out
#      acceptance length measured every eval.every_steps (the tau curve);
#   4. dflashctl export (--best), then dflashctl eval of the trained and an untrained drafter on the held-out
#      prompts at each batch size of EVAL_BATCHES (tau, acceptance by position, tokens/s against
#      plain greedy decoding of the same prompts);
#   5. writes OUT/summary.json and OUT/curves.jsonl (loss and tau by step) for the plots.
#
#   scripts/bench/real_model.sh BUILD_DIR OUT_DIR
#
# Env: MODEL (the Hugging Face checkpoint; default $DFLASH_MODELS/SmolLM2-135M-Instruct, made by
# scripts/models/smollm2.sh), DEVICE (gpu|cpu), TRAIN_PROMPTS / HELDOUT_PROMPTS (default the
# committed sets; .jsonl.gz is read too, e.g. configs/smollm2/train-prompts-xl.jsonl.gz), MAX_TRAIN
# (first N training prompts; default all), REGEN_BATCH (sequences decoded together; 512),
# REGEN_SECONDS (stop the regeneration then, keep the records written so far and end the script),
# REGEN_MAX_NEW (512), EPOCHS / MAX_STEPS (override optim.*), EVAL_EVERY (eval.every_steps),
# EVAL_PROMPTS (held-out prompts kept; default all), EVAL_MAX_NEW (256), EVAL_SETS (the final
# evals as BATCH:PROMPTS, default "1:64 8:294 32:294"), UNTRAINED_SET (BATCH:PROMPTS of the untrained
# drafter's eval; default the last of EVAL_SETS), EVAL_MAX_PROMPTS (eval.max_prompts of the held-out
# curve during training; 64), STAGES (default "regen train eval"; add
# "refpkg" for the reference package's evaluation (REFPKG_PROMPTS, DFLASH_PATH) and "ref" for the
# PyTorch reference loop (REF_COMPILE; on the GPU with --static-shapes); the stages of one OUT_DIR can run in separate calls), TOKEN_BUDGET / MAX_ANCHORS, CKPT_EVERY, RUN_YAML (another run.yaml of the same form), EXPORT (best: the snapshot
# of the best held-out tau, the default; last: the last step's drafter), LOSS_WEIGHTING (decay or
# dpace: loss.weighting), DRAFTER_PRECISION (auto or fp8: drafter.precision), DRAFTER_KIND (dflash
# or dflash2: drafter.kind, its other settings auto).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:?usage: real_model.sh BUILD_DIR OUT_DIR}
out=${2:?usage: real_model.sh BUILD_DIR OUT_DIR}
build=$(cd "$build" && pwd)
mkdir -p "$out"; out=$(cd "$out" && pwd)
bin=$build/services
ctl=$bin/dflashctl/dflashctl
model=${MODEL:-${DFLASH_MODELS:-$HOME/.local/share/dflash/models}/SmolLM2-135M-Instruct}
device=${DEVICE:-gpu}
train_prompts=${TRAIN_PROMPTS:-$root/configs/smollm2/train-prompts.jsonl}
heldout=${HELDOUT_PROMPTS:-$root/configs/smollm2/heldout-prompts.jsonl}
log() { printf '[real_model %s] %s\n' "$(date +%T)" "$*" >&2; }
[ -f "$model/config.json" ] || { log "no checkpoint at $model (scripts/models/smollm2.sh makes it)"; exit 2; }

pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
port_of() { sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p" "$1"; }
wait_file() { for _ in $(seq 1200); do [ -s "$1" ] && return 0; sleep 0.1; done; log "$1 did not appear"; return 1; }

# 1. The processes.
rm -f "$out"/*.ready
"$bin/coordinator/dflash-coordinator" --listen 127.0.0.1:0 --metrics_listen 127.0.0.1:0 \
  --state_dir "$out/state" --ready_file "$out/coordinator.ready" --log_file "$out/coordinator.log" 2>/dev/null &
pids+=($!)
wait_file "$out/coordinator.ready"
export DFLASH_COORDINATOR=127.0.0.1:$(port_of "$out/coordinator.ready" grpc_port)
gpu_flag=(); [ "$device" = gpu ] && gpu_flag=(--gpu 0)
for role in target drafter; do
  "$bin/${role}_worker/dflash-${role}-worker" --coordinator "$DFLASH_COORDINATOR" "${gpu_flag[@]}" \
    --name "$role" --metrics_listen 127.0.0.1:0 --ready_file "$out/$role.ready" \
    --log_file "$out/$role.log" 2>/dev/null &
  pids+=($!)
  wait_file "$out/$role.ready"
done
for _ in $(seq 200); do
  [ "$("$ctl" workers -o json | grep -o '"WORKER_HEALTH_UP"' | wc -l)" -ge 2 ] && break; sleep 0.1
done

# The run.yaml: configs/smollm2/run.yaml with this machine's paths and the env's overrides.
# The first N lines (all without N) of a JSONL file, gzip-compressed or not.
head_n() { zcat -f "$1" | awk -v n="${2:-0}" 'n == 0 || NR <= n'; }
head_n "$train_prompts" "${MAX_TRAIN:-}" >"$out/train-prompts.jsonl"
head_n "$heldout" "${EVAL_PROMPTS:-}" >"$out/heldout-prompts.jsonl"
yaml=$out/run.yaml
sed -e "s|path: SmolLM2-135M-Instruct|path: \"$model\"|" \
    -e "s|train: regen.jsonl|train: \"$out/regen.jsonl\"|" \
    -e "s|prompts: heldout-prompts.jsonl|prompts: \"$out/heldout-prompts.jsonl\"|" \
    "${RUN_YAML:-$root/configs/smollm2/run.yaml}" >"$yaml"
[ -n "${EPOCHS:-}" ] && sed -i "s|epochs: [0-9.]*|epochs: $EPOCHS|" "$yaml"
[ -n "${MAX_STEPS:-}" ] && sed -i "s|epochs: [0-9.]*|epochs: 1, max_steps: $MAX_STEPS|" "$yaml"
[ -n "${EVAL_EVERY:-}" ] && sed -i "s|every_steps: 250|every_steps: $EVAL_EVERY|" "$yaml"
[ -n "${EVAL_MAX_PROMPTS:-}" ] && sed -i "s|max_prompts: 64|max_prompts: $EVAL_MAX_PROMPTS|" "$yaml"
[ -n "${TOKEN_BUDGET:-}" ] && sed -i "s|token_budget: [0-9]*|token_budget: $TOKEN_BUDGET|" "$yaml"
[ -n "${MAX_ANCHORS:-}" ] && sed -i "s|max_anchors: [0-9]*|max_anchors: $MAX_ANCHORS|" "$yaml"
[ -n "${LOSS_WEIGHTING:-}" ] && sed -i "s|loss: {gamma: auto}|loss: {gamma: auto, weighting: $LOSS_WEIGHTING}|" "$yaml"
[ -n "${DRAFTER_KIND:-}" ] && sed -i "s|^drafter: {|drafter: {kind: $DRAFTER_KIND, |" "$yaml"
[ -n "${DRAFTER_PRECISION:-}" ] && sed -i "s|^drafter: {|drafter: {precision: $DRAFTER_PRECISION, |" "$yaml"
[ -n "${CKPT_EVERY:-}" ] && sed -i "s|checkpoint: {every_steps: [0-9]*|checkpoint: {every_steps: $CKPT_EVERY|" "$yaml"
[ "$device" = cpu ] && sed -i "s|dtype: bfloat16|dtype: float32|" "$yaml"

has() { [[ " ${STAGES:-regen train eval} " == *" $1 "* ]]; }
newest_run() { "$ctl" list -o json | sed -n 's/.*"run_id":"\([^"]*\)".*/\1/p' | tail -n 1; }
# eval_drafter NAME DIR BATCH PROMPTS: held-out tau and tokens/s against plain greedy decoding.
eval_drafter() {
  head -n "$4" "$out/heldout-prompts.jsonl" >"$out/heldout-$4.jsonl"
  log "eval $1 at batch $3 on $4 prompts"
  "$ctl" eval "$yaml" --drafter "$2" --prompts "$out/heldout-$4.jsonl" --max_prompts 100000 \
    --max_new_tokens "${EVAL_MAX_NEW:-256}" --batch_size "$3" -o json >"$out/eval-$1-b$3.json"
}

# 2. The target's own answers to the training prompts.
if has regen; then
  log "regen of $(wc -l <"$out/train-prompts.jsonl") prompts"
  t0=$(date +%s.%N)
  sed "s|train: \"$out/regen.jsonl\"|train: \"$out/train-prompts.jsonl\"|" "$yaml" >"$out/regen.yaml"
  rc=0
  timeout "${REGEN_SECONDS:-0}" "$ctl" regen "$out/regen.yaml" --input "$out/train-prompts.jsonl" \
    --out "$out/regen.jsonl" --batch_size "${REGEN_BATCH:-512}" \
    --max_new_tokens "${REGEN_MAX_NEW:-512}" -o json >"$out/regen.json" || rc=$?
  echo "$(date +%s.%N) $t0" | awk '{printf "%.1f\n", $1 - $2}' >"$out/regen.seconds"
  if [ "$rc" = 124 ]; then
    # Out of time: the complete lines written so far are the training data (a torn last line,
    # without its newline, is left out); the coordinator still generating ends with this script.
    head -n "$(wc -l <"$out/regen.jsonl.partial")" "$out/regen.jsonl.partial" >"$out/regen.jsonl"
    log "regen stopped after ${REGEN_SECONDS} s: $(wc -l <"$out/regen.jsonl") records kept"
    exit 0
  fi
  [ "$rc" = 0 ] || exit "$rc"
  log "regen done in $(cat "$out/regen.seconds") s"
fi

# 3. Prepare and train; the same drafter untrained (one step at a negligible learning rate).
if has train; then
  "$ctl" prepare "$yaml" -o json >"$out/prepare.json"
  log "training: $(tr -d ' \n' <"$out/prepare.json" | grep -o '"documents":[0-9]*')"
  t0=$(date +%s.%N)
  "$ctl" submit "$yaml" >"$out/submit.out" 2>&1 || { tail -n 5 "$out/submit.out" >&2; exit 1; }
  echo "$(date +%s.%N) $t0" | awk '{printf "%.1f\n", $1 - $2}' >"$out/train.seconds"
  run=$(newest_run); echo "$run" >"$out/run_id"
  "$ctl" status "$run" -o json >"$out/status.json"
  # EXPORT=best (default): the snapshot of the best held-out tau (`dflashctl export --best`);
  # EXPORT=last: the last step's drafter (needed without held-out evaluations, EVAL_EVERY=0).
  best_flag=(); [ "${EXPORT:-best}" = best ] && best_flag=(--best)
  rm -rf "$out/drafter"; "$ctl" export "$run" "${best_flag[@]}" --out "$out/drafter" -o json >"$out/export.json"
  grep -E "run=$run .*\] loss " "$out/coordinator.log" >"$out/loss.log" || true
  rundir=$(tr -d ' \n' <"$out/status.json" | sed -n 's/.*"run_dir":"\([^"]*\)".*/\1/p' | head -n 1)
  cp "$rundir/eval/results.jsonl" "$out/tau-curve.jsonl" 2>/dev/null || : >"$out/tau-curve.jsonl"
  log "trained in $(cat "$out/train.seconds") s: run $run"
  sed -e "s|^name: smollm2-dflash|name: smollm2-untrained|" \
      -e "s|epochs: [0-9.]*\(, max_steps: [0-9]*\)\?|epochs: 1, max_steps: 1|" \
      -e "s|lr: [0-9.e-]*|lr: 1.0e-12|" -e "s|every_steps: [0-9]*, prompts|every_steps: 0, prompts|" \
      "$yaml" >"$out/untrained.yaml"
  "$ctl" submit "$out/untrained.yaml" >"$out/untrained.out" 2>&1
  rm -rf "$out/drafter-untrained"; "$ctl" export "$(newest_run)" --out "$out/drafter-untrained" >/dev/null
fi

# 4. Held-out acceptance length and speed-up: EVAL_SETS of BATCH:PROMPTS for the trained drafter;
# the untrained one at UNTRAINED_SET (default the last of them).
if has eval; then
  for set in ${EVAL_SETS:-1:64 8:294 32:294}; do
    eval_drafter trained "$out/drafter" "${set%%:*}" "${set##*:}"
  done
  set=${UNTRAINED_SET:-$set}
  eval_drafter untrained "$out/drafter-untrained" "${set%%:*}" "${set##*:}"
fi

# Optional: the reference inference package (dflash==0.1.0) on this target and export, beside
# `dflashctl eval` of the same prompts, both in float32 at batch 1 (REFPKG_PROMPTS, default 16):
# the same tokens, taus and emitted-per-verification histogram are expected (near-ties aside).
# DFLASH_PATH: the folder holding the package when the interpreter lacks it. REFPKG_PROMPTS=0
# skips it (an empty prompt file is an error to `dflashctl eval`, and ended the stage's summary).
if has refpkg && [ "${REFPKG_PROMPTS:-16}" = 0 ]; then
  log "REFPKG_PROMPTS=0: no reference-package evaluation"
elif has refpkg; then
  n=${REFPKG_PROMPTS:-16}
  head -n "$n" "$out/heldout-prompts.jsonl" >"$out/heldout-refpkg.jsonl"
  sed "s|dtype: bfloat16|dtype: float32|" "$yaml" >"$out/fp32.yaml"
  log "eval in float32 at batch 1 on $n prompts: dflashctl, then the reference package"
  "$ctl" eval "$out/fp32.yaml" --drafter "$out/drafter" --prompts "$out/heldout-refpkg.jsonl" \
    --max_prompts 100000 --max_new_tokens "${EVAL_MAX_NEW:-256}" --batch_size 1 -o json \
    >"$out/eval-fp32-b1.json"
  python3 "$root/scripts/bench/dflash_reference_eval.py" --target "$model" --drafter "$out/drafter" \
    --prompts "$out/heldout-refpkg.jsonl" --max-new-tokens "${EVAL_MAX_NEW:-256}" --dtype float32 \
    ${DFLASH_PATH:+--dflash-path "$DFLASH_PATH"} --per-step >"$out/refpkg.json" 2>"$out/refpkg.log" \
    || { tail -n 20 "$out/refpkg.log" >&2; exit 1; }
fi

# Optional: the PyTorch reference loop (scripts/bench/train_ref.py) on the same run.yaml and
# prepared data, its export evaluated as ours at the largest batch.
if has ref; then
  log "reference training loop"
  python3 "$root/scripts/bench/train_ref.py" "$yaml" --device "$([ "$device" = gpu ] && echo cuda || echo cpu)" \
    --compile "${REF_COMPILE:-full}" $([ "$device" = gpu ] && echo --static-shapes) \
    --out "$out/ref" >"$out/ref.log" 2>&1 || { tail -n 20 "$out/ref.log" >&2; exit 1; }
  set=${EVAL_SETS:-1:64 8:294 32:294}; set=${set##* }
  eval_drafter reference "$out/ref/drafter" "${set%%:*}" "${set##*:}"
fi

# 5. Summary.
python3 - "$out" <<'PY'
import glob, json, os, re, sys
out = sys.argv[1]
run = open(os.path.join(out, "run_id")).read().strip() if os.path.exists(os.path.join(out, "run_id")) else ""
summary = {"run": run, "evals": {}}
for f in sorted(glob.glob(os.path.join(out, "eval-*.json"))):
    r = json.load(open(f))
    summary["evals"][os.path.basename(f)[5:-5]] = {
        k: r.get(k) for k in ("tau", "tau_pooled", "tau_prompt_mean", "prompts", "new_tokens",
                              "verifications", "tokens_per_second", "baseline_tokens_per_second",
                              "baseline_identical_prompts", "acceptance_by_position",
                              "emitted_histogram")}
    b = r.get("baseline_tokens_per_second") or 0
    summary["evals"][os.path.basename(f)[5:-5]]["speedup"] = (r.get("tokens_per_second", 0) / b) if b else None
curves = []
for line in open(os.path.join(out, "loss.log")) if os.path.exists(os.path.join(out, "loss.log")) else []:
    m = re.search(r"step=(\d+) [^]]*\] loss ([0-9.eE+-]+)", line)
    if m: curves.append({"step": int(m.group(1)) + 1, "loss": float(m.group(2))})
for line in open(os.path.join(out, "tau-curve.jsonl")) if os.path.exists(os.path.join(out, "tau-curve.jsonl")) else []:
    if line.strip():
        r = json.loads(line)
        curves.append({"step": int(r.get("step", 0)), "tau": float(r.get("tau", 0))})
with open(os.path.join(out, "curves.jsonl"), "w") as f:
    for c in curves: f.write(json.dumps(c) + "\n")
p = os.path.join(out, "refpkg.json")
if os.path.exists(p):
    r = json.load(open(p))
    r.pop("per_prompt", None)
    summary["reference_package"] = r
    ours = summary["evals"].get("fp32-b1")
    if ours:  # the same prompts through dflashctl eval: its histogram holds shares, the package's counts
        counts = [round(x * int(ours["verifications"])) for x in ours.get("emitted_histogram") or []]
        r["dflashctl"] = {"tau_pooled": ours["tau_pooled"], "tau_prompt_mean": ours["tau_prompt_mean"],
                          "new_tokens": ours["new_tokens"], "verifications": ours["verifications"],
                          "emitted_histogram": counts,
                          "baseline_identical_prompts": ours["baseline_identical_prompts"]}
        r["histograms_equal"] = counts == r["emitted_histogram"]
for name in ("regen", "train"):
    p = os.path.join(out, name + ".seconds")
    if os.path.exists(p): summary[name + "_seconds"] = float(open(p).read())
if os.path.exists(os.path.join(out, "status.json")):
    summary["status"] = json.load(open(os.path.join(out, "status.json")))
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
if "reference_package" in summary:
    r = summary["reference_package"]
    print(f"{'reference package (fp32, b1)':28s} tau pooled {r['tau_pooled']:.3f}  per-prompt mean "
          f"{r['tau_prompt_mean']:.3f}  greedy equal {r['greedy_equal']}")
    if "dflashctl" in r:
        d = r["dflashctl"]
        print(f"{'dflashctl eval (fp32, b1)':28s} tau pooled {d['tau_pooled']:.3f}  per-prompt mean "
              f"{d['tau_prompt_mean']:.3f}  identical {d['baseline_identical_prompts']} of "
              f"{r['prompts']}  histograms equal {r['histograms_equal']}")
for k, v in summary["evals"].items():
    sp = f"{v['speedup']:.2f}x" if v["speedup"] else "-"
    print(f"{k:28s} tau {v['tau']:.3f}  {v['tokens_per_second']:.1f} tok/s  speed-up {sp}")
PY
