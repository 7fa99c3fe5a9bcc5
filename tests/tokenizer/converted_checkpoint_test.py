"""transformers reads the converted SmolLM2 checkpoint's tokenizer as written.

scripts/models/gguf_to_hf.py writes tokenizer.json in the form the model was trained with (a
Digits pre-tokenizer before the GPT-2 byte-level split); dflash and the `tokenizers` library read
that file as it is. transformers must too, in both majors the project meets: 4 (the setup venv's)
and 5 (the oracle folder beside it; the reference inference package and the GPU machine use it).
transformers 5 rebuilds a "GPT2Tokenizer" class's pipeline itself and drops the Digits split, so
prompts with whitespace before a digit ("\\n\\n    01_compress") were tokenized differently by the
reference package than by dflash; gguf_to_hf.py now names PreTrainedTokenizerFast.

Compares AutoTokenizer's ids with tokenizers.Tokenizer.from_file's on crafted strings and on every
prompt of configs/smollm2/heldout-prompts.jsonl and the first 500 of train-prompts.jsonl, rendered
with the checkpoint's chat template. Fails on any difference, naming the prompt.

  converted_checkpoint_test.py [MODEL_DIR]   (default $DFLASH_MODELS/SmolLM2-135M-Instruct)
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CRAFTED = [
    "a.\n\n    01_compress_easy.c",
    "Inc.\n                    51 Franklin St",
    "x   1  22   333\t4\n5",
    "version 2024-12-06, 3.14159 and 1e-5",
    "naïve café — 東京 2 ü",
]


def prompts():
    rows = []
    for name, limit in (("heldout-prompts.jsonl", None), ("train-prompts.jsonl", 500)):
        with open(os.path.join(ROOT, "configs", "smollm2", name), encoding="utf-8") as f:
            lines = [line for line in f if line.strip()]
        for n, line in enumerate(lines[:limit], 1):
            rows.append((f"{name}:{n}", json.loads(line)["messages"]))
    return rows


def check(model_dir):
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(model_dir)
    raw = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    texts = [(f"crafted {i}", t) for i, t in enumerate(CRAFTED)]
    texts += [(where, auto.apply_chat_template(m, tokenize=False, add_generation_prompt=True))
              for where, m in prompts()]
    bad = []
    for where, text in texts:
        a = auto.encode(text, add_special_tokens=False)
        b = raw.encode(text, add_special_tokens=False).ids
        if a != b:
            k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            bad.append(f"{where}: transformers {transformers.__version__} ({type(auto).__name__}) "
                       f"differs at token {k}: {a[k:k + 4]} vs tokenizer.json's {b[k:k + 4]}")
    print(f"transformers {transformers.__version__}: {len(texts)} texts, {len(bad)} differ")
    for line in bad[:10]:
        print("  " + line)
    return not bad


def main():
    model_dir = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else \
        os.path.join(os.environ.get("DFLASH_MODELS") or
                     os.path.expanduser("~/.local/share/dflash/models"), "SmolLM2-135M-Instruct")
    if not os.path.isfile(os.path.join(model_dir, "tokenizer.json")):
        sys.exit(f"FAIL: no converted checkpoint at {model_dir} (scripts/setup.sh makes it)")
    if "--in-process" in sys.argv:
        return 0 if check(model_dir) else 1
    ok = True
    # transformers 4: the interpreter's own; transformers 5: the oracle folder first on the path.
    for extra in ([], [os.path.join(sys.prefix, "oracle-transformers5")]):
        if extra and not os.path.isdir(extra[0]):
            sys.exit(f"FAIL: {extra[0]} is missing: run scripts/setup.sh")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(extra + [os.environ.get("PYTHONPATH", "")]))
        r = subprocess.run([sys.executable, os.path.abspath(__file__), model_dir, "--in-process"],
                           env=env)
        ok &= r.returncode == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
