#!/usr/bin/env python3
"""Turns a llama-architecture GGUF file into a Hugging Face checkpoint directory.

Model preparation (not product code): the weights are dequantized by transformers' own GGUF loader
(which also undoes llama.cpp's rotary permutation of the q/k projections) and written as
model.safetensors; the tokenizer is rebuilt from the GGUF's tokenizer metadata in the form the
original Hugging Face tokenizer.json has (transformers' GGUF tokenizer converter writes a different
one: no Digits pre-tokenizer, so "2024" would become one token where the model was trained on four,
and it names <|im_start|> as the end-of-sequence token). Writes:

  config.json, model.safetensors (or shards), generation_config.json   (transformers)
  tokenizer.json, tokenizer_config.json (with the chat template), special_tokens_map.json (here)
  conversion.json (this converter's version, for scripts/models/smollm2.sh)

Usage: gguf_to_hf.py FILE.gguf OUT_DIR [--dtype float32|bfloat16]

Refuses (exit 2, naming the file and the field) an architecture other than llama, a tokenizer
model other than gpt2 (byte-level BPE), or a pre-tokenizer type it does not know: never a silent
approximation. docs/real-model.md describes the whole path.
"""
import argparse
import json
import os
import sys

# Written to OUT_DIR/conversion.json; scripts/models/smollm2.sh converts again when a directory
# holds another version. 2: tokenizer_class PreTrainedTokenizerFast (was GPT2Tokenizer).
CONVERTER_VERSION = 2

# llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) -> the tokenizer.json pre_tokenizer of the
# Hugging Face tokenizer they were converted from. "smollm" (SmolLM/SmolLM2, StarCoder's
# tokenizer) splits every digit off before the GPT-2 byte-level split.
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
              "use_regex": True}
PRE_TOKENIZERS = {
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, BYTE_LEVEL]},
    "starcoder": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, BYTE_LEVEL]},
    "gpt2": BYTE_LEVEL,
    "gpt-2": BYTE_LEVEL,
}
# GGUF token types (gguf.TokenType).
CONTROL, USER_DEFINED = 3, 4


def fail(path, what):
    print(f"gguf_to_hf: {path}: {what}", file=sys.stderr)
    sys.exit(2)


def field(reader, path, key, required=True):
    f = reader.fields.get(key)
    if f is None:
        if required:
            fail(path, f"no metadata field {key}")
        return None
    return f.contents()


def tokenizer_files(reader, path):
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json from the GGUF metadata."""
    model = field(reader, path, "tokenizer.ggml.model")
    if model != "gpt2":
        fail(path, f"tokenizer.ggml.model is {model!r}; only 'gpt2' (byte-level BPE) is supported")
    pre = field(reader, path, "tokenizer.ggml.pre")
    if pre not in PRE_TOKENIZERS:
        fail(path, f"tokenizer.ggml.pre is {pre!r}; known: {', '.join(sorted(PRE_TOKENIZERS))}")
    tokens = field(reader, path, "tokenizer.ggml.tokens")
    types = field(reader, path, "tokenizer.ggml.token_type")
    merges = field(reader, path, "tokenizer.ggml.merges")
    if len(types) != len(tokens):
        fail(path, f"{len(tokens)} tokens but {len(types)} token types")
    bos = field(reader, path, "tokenizer.ggml.bos_token_id", required=False)
    eos = field(reader, path, "tokenizer.ggml.eos_token_id", required=False)
    unk = field(reader, path, "tokenizer.ggml.unknown_token_id", required=False)
    pad = field(reader, path, "tokenizer.ggml.padding_token_id", required=False)
    template = field(reader, path, "tokenizer.chat_template", required=False)
    add_bos = field(reader, path, "tokenizer.ggml.add_bos_token", required=False)

    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": types[i] == CONTROL}
             for i, t in enumerate(tokens) if types[i] in (CONTROL, USER_DEFINED)]
    tok_json = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": [m.split(" ", 1) for m in merges]},
    }
    name = lambda i: tokens[i] if i is not None and 0 <= i < len(tokens) else None
    special = {k: name(v) for k, v in
               (("bos_token", bos), ("eos_token", eos), ("unk_token", unk), ("pad_token", pad))
               if name(v) is not None}
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": {str(a["id"]): {k: a[k] for k in a if k not in ("id",)}
                                 for a in added},
        "additional_special_tokens": [a["content"] for a in added if a["special"]],
        "clean_up_tokenization_spaces": False,
        "model_max_length": 8192,
        # Not "GPT2Tokenizer": transformers 5 builds that class's pipeline itself and replaces
        # tokenizer.json's pre-tokenizer with a plain ByteLevel one, dropping the Digits split:
        # "\n\n    01" then becomes "\n\n   ", " ", "0", "1" instead of "\n\n    ", "0", "1"
        # (seen on 2 of 8 held-out prompts). PreTrainedTokenizerFast loads tokenizer.json as
        # written in transformers 4 and 5 alike, as the tokenizers library and dflash read it.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "vocab_size": len(tokens),
        **special,
    }
    if add_bos is not None:
        config["add_bos_token"] = bool(add_bos)
    if template is not None:
        config["chat_template"] = template
    special_map = {**special, "additional_special_tokens": config["additional_special_tokens"]}
    return tok_json, config, special_map, {"bos": bos, "eos": eos, "pad": pad}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()

    import gguf  # noqa: E402  (the gguf package; transformers reads GGUF through it too)
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, GenerationConfig

    if not os.path.isfile(args.gguf):
        fail(args.gguf, "no such file")
    reader = gguf.GGUFReader(args.gguf)
    arch = field(reader, args.gguf, "general.architecture")
    if arch != "llama":
        fail(args.gguf, f"general.architecture is {arch!r}; only 'llama' is supported")
    supported = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0"}
    for t in reader.tensors:
        if t.tensor_type.name not in supported:
            fail(args.gguf, f"tensor {t.name} has type {t.tensor_type.name}; supported: "
                 f"{', '.join(sorted(supported))}")
    tok_json, tok_config, special_map, ids = tokenizer_files(reader, args.gguf)

    os.makedirs(args.out, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(os.path.abspath(args.gguf)), gguf_file=os.path.basename(args.gguf),
        dtype=dtype)
    # transformers' GGUF config carries the converter's token ids; the GGUF's own are the truth.
    for key in ("bos", "eos", "pad"):
        if ids[key] is not None:
            setattr(model.config, f"{key}_token_id", int(ids[key]))
    model.generation_config = GenerationConfig(
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"])
    # Written by hand: transformers 5 refuses save_pretrained of a model loaded from GGUF.
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.save_pretrained(args.out)
    model.generation_config.save_pretrained(args.out)
    save_file(state, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    for name, obj in (("tokenizer.json", tok_json), ("tokenizer_config.json", tok_config),
                      ("special_tokens_map.json", special_map)):
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=2 if name != "tokenizer.json" else None)
    with open(os.path.join(args.out, "conversion.json"), "w", encoding="utf-8") as f:
        json.dump({"converter": "scripts/models/gguf_to_hf.py", "version": CONVERTER_VERSION,
                   "gguf": os.path.basename(args.gguf), "dtype": args.dtype}, f, indent=2)
    print(f"gguf_to_hf: wrote {args.out} ({args.dtype}, {len(reader.tensors)} tensors, "
          f"vocabulary {tok_config['vocab_size']})")


if __name__ == "__main__":
    main()
