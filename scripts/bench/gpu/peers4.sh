#!/usr/bin/env bash
# The four DFlash training steps of issue 28's comparison in one device call (docs/benchmarks-
# training.md, "The peers' own DFlash step beside ours"): ours (drafter_step), the compiled
# PyTorch reference (drafter_step_ref.py on ours' batch and initial weights), SpecForge 0.2.0 and
# speculators 0.9.0 (their own steps, scripts/bench/peers/), at the Qwen3-8B drafter geometry,
# 8192 context tokens / 512 anchors, 10 timed steps after 3 warm-up steps each; then one table.
# Prepared on the CPU machine (the three carried paths fit one call's 64 MiB with the tree, where
# .devdeps would not):
#   scripts/bench/gpu/gpu_tests.sh pack '^$'       -> .gpu/t (the benchmarks only, ~3 MB)
#   scripts/bench/gpu/libs_for.sh .gpu/libs build/scripts/bench/drafter_step   (~7 MB)
#   scripts/bench/peers/wheels.sh .gpu/peer-wheels                               (~31 MB)
# then `run` with carry [".gpu/t", ".gpu/libs", ".gpu/peer-wheels"] and
# `bash scripts/bench/gpu/peers4.sh`. Results in $OUT: ds/ (ours and the reference), peers.jsonl,
# the peers' logs, table.md.
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:?set OUT to the folder the results go to}
py=/opt/torch/.venv/bin/python3; [ -x "$py" ] || py=python3
rm -rf build && mkdir -p build && tar -xzf .gpu/t/gt.tgz -C build
torch_lib=$("$py" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH="$(pwd)/.gpu/libs:$torch_lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "[peers4] binaries of $(cat .gpu/t/gt.rev), $(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader)" | tee "$out/log"
# Ours, then the reference on the same batch and initial weights (its compile: about a minute).
GEOMS=8192:512 PYTHON=$py timeout 290 bash scripts/bench/drafter_step.sh build "$out/ds" 2>&1 |
  tail -n 8 | tee -a "$out/log"
OUT=$out PYTHON=$py PEER_TIMEOUT=${PEER_TIMEOUT:-140} timeout 290 \
  bash scripts/bench/peers/run_peers.sh .gpu/peer-wheels 2>&1 | grep -v '^  ' | tail -n 12 | tee -a "$out/log"
"$py" - "$out" <<'PY' | tee "$out/table.md"
import json, os, sys
out = sys.argv[1]
rows = []
for name in ("ds/ours_8192.json", "ds/ref_8192.json"):
    p = os.path.join(out, name)
    if os.path.exists(p):
        rows.append(json.load(open(p)))
p = os.path.join(out, "peers.jsonl")
if os.path.exists(p):
    rows += [json.loads(l) for l in open(p) if l.strip()]
ours = rows[0] if rows and rows[0].get("impl", "").startswith("dflash") else None
print("| implementation | ms/step (median) | context tok/s | peak GiB | ours' speed-up | ours' peak / theirs |")
print("|---|---|---|---|---|---|")
for r in rows:
    if "error" in r:
        print(f"| {r['impl']} | failed: {r['error']} | | | | |")
        continue
    ms, peak = r["ms_median"], r["peak_bytes"] / 2**30
    up = f"{r['ms_median'] / ours['ms_median']:.2f}x" if ours and r is not ours else "-"
    ratio = f"{ours['peak_bytes'] / r['peak_bytes']:.2f}" if ours and r is not ours else "-"
    if "exit_after_result" in r:
        r["impl"] += f" ({r['exit_after_result']} after its result)"
    print(f"| {r['impl']} | {ms:.1f} | {r.get('ctx_tok_per_s', 0):,.0f} | {peak:.2f} | {up} | {ratio} |")
PY
