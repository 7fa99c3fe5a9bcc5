"""Hugging Face transformers references on the real SmolLM2-135M-Instruct checkpoint (fp32), for
tests/nn/real_model_test.cc.

  hf_real_oracle.py --out DIR --model MODEL_DIR

The inputs are real text: documents are docstrings of the pinned packages of the oracle
environment (torch, transformers) and of the standard library, tokenized with the checkpoint's
tokenizer and cut to DOC_TOKENS; chat prompts are rendered with the checkpoint's chat template
(add_generation_prompt=True, the template's default system prompt). The C++ test reads token ids
only. Layout under --out:

  real_refs.safetensors
      input_ids [T] int64: the documents packed one after another
      positions [T] int64 (restart at 0 per document), cu_seqlens [b+1] int32
      layer_ids [K] int64: DefaultTargetLayerIds(30, 5) = [1, 8, 14, 20, 27]
      features [T, K*H] fp32: per token, HF hidden_states[i+1] for i in layer_ids (the output of
                 decoder layer i), each document run alone
      final_hidden [T, H] fp32: HF hidden_states[-1] (the last layer after the final norm)
      logit_rows [R] int64: packed rows whose logits are kept (first, thirds, last of each doc)
      logits [R, V] fp32: HF logits of those rows
  real_generate.safetensors
      prompts [sum P] int64, prompt_lengths [N] int64
      outputs [sum G] int64, output_lengths [N] int64: HF generate(do_sample=False,
                 max_new_tokens=GEN_TOKENS), each prompt alone, the eos token included when hit
      stop_token_ids [E] int64: the generation config's eos_token_id
      max_new_tokens [] int64: GEN_TOKENS
  real_docs.json: the documents' sources and lengths (for messages)
"""

import argparse
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

LAYER_IDS = [1, 8, 14, 20, 27]
GEN_TOKENS = 48
MIN_LONG_GENERATIONS = 4  # generations that reach GEN_TOKENS

# (source, tokens): documents of different lengths, one short.
DOC_TOKENS = [
    ("transformers.GenerationConfig", 320),
    ("torch.nn.MultiheadAttention", 190),
    ("argparse", 130),
    ("json", 23),
]
DOC_OBJECTS = {
    "transformers.GenerationConfig": transformers.GenerationConfig,
    "torch.nn.MultiheadAttention": torch.nn.MultiheadAttention,
    "argparse": argparse,
    "json": json,
}

CHATS = [
    [{"role": "user", "content": "Write a Python function that checks whether a number is prime, "
                                 "and explain how it works."}],
    [{"role": "user", "content": "Give me three tips for sleeping better."}],
    [{"role": "user", "content": "Translate 'good morning' into French."}],
    [{"role": "user", "content": "What is the capital of France?"},
     {"role": "assistant", "content": "The capital of France is Paris."},
     {"role": "user", "content": "Tell me about its history in a few sentences."}],
    [{"role": "user", "content": "Explain what a hash table is to a ten-year-old."}],
    [{"role": "user", "content": "Write a short story about a robot who learns to paint."}],
]


def doc_text(source):
    """The docstring of a module or class of the oracle environment."""
    text = DOC_OBJECTS[source].__doc__
    if not text:
        raise SystemExit(f"hf_real_oracle.py: {source} has no docstring in this environment")
    return text


def write_refs(model, tok, out):
    docs, sources = [], []
    for source, n in DOC_TOKENS:
        ids = tok(doc_text(source)).input_ids
        if len(ids) < n:
            raise SystemExit(f"hf_real_oracle.py: {source} has {len(ids)} tokens, {n} wanted")
        docs.append(torch.tensor(ids[:n], dtype=torch.int64))
        sources.append({"source": source, "tokens": n})
    num_layers = model.config.num_hidden_layers
    assert max(LAYER_IDS) + 1 < num_layers  # hidden_states[i+1] is pre-norm for every id
    features, final_hidden, logit_rows, logits = [], [], [], []
    offset = 0
    for d in docs:
        with torch.no_grad():
            out_d = model(input_ids=d[None], output_hidden_states=True)
        hs = out_d.hidden_states
        assert len(hs) == num_layers + 1
        features.append(torch.cat([hs[i + 1][0] for i in LAYER_IDS], dim=-1))
        final_hidden.append(hs[-1][0])
        n = len(d)
        rows = sorted({0, n // 3, (2 * n) // 3, n - 1})
        logit_rows.extend(offset + r for r in rows)
        logits.append(out_d.logits[0, rows])
        offset += n
    offsets = [0]
    for d in docs:
        offsets.append(offsets[-1] + len(d))
    save_file(
        {
            "input_ids": torch.cat(docs),
            "positions": torch.cat([torch.arange(len(d)) for d in docs]).to(torch.int64),
            "cu_seqlens": torch.tensor(offsets, dtype=torch.int32),
            "layer_ids": torch.tensor(LAYER_IDS, dtype=torch.int64),
            "features": torch.cat(features).contiguous(),
            "final_hidden": torch.cat(final_hidden).contiguous(),
            "logit_rows": torch.tensor(logit_rows, dtype=torch.int64),
            "logits": torch.cat(logits).float().contiguous(),
        },
        os.path.join(out, "real_refs.safetensors"),
    )
    json.dump(sources, open(os.path.join(out, "real_docs.json"), "w"), indent=1)


def write_generations(model, tok, out):
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos)
    prompts, outputs = [], []
    for chat in CHATS:
        p = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")
        with torch.no_grad():
            g = model.generate(p, attention_mask=torch.ones_like(p), do_sample=False,
                               max_new_tokens=GEN_TOKENS, eos_token_id=eos,
                               pad_token_id=model.generation_config.pad_token_id)
        prompts.append(p[0])
        outputs.append(g[0, p.shape[1]:])
        print(f"prompt {len(prompts) - 1}: {p.shape[1]} tokens -> {len(outputs[-1])}: "
              f"{tok.decode(outputs[-1])!r}")
    stopped = sum(int(o[-1]) in eos for o in outputs)
    long = sum(len(o) == GEN_TOKENS for o in outputs)
    # The test must see both ends: sequences that stop on eos and ones that run to the limit.
    if stopped == 0 or long < MIN_LONG_GENERATIONS:
        raise SystemExit(f"hf_real_oracle.py: {stopped} generations stopped on eos and {long} "
                         f"reached {GEN_TOKENS} tokens; change CHATS")
    save_file(
        {
            "prompts": torch.cat(prompts).to(torch.int64),
            "prompt_lengths": torch.tensor([len(p) for p in prompts], dtype=torch.int64),
            "outputs": torch.cat(outputs).to(torch.int64),
            "output_lengths": torch.tensor([len(o) for o in outputs], dtype=torch.int64),
            "stop_token_ids": torch.tensor(eos, dtype=torch.int64),
            "max_new_tokens": torch.tensor(GEN_TOKENS, dtype=torch.int64),
        },
        os.path.join(out, "real_generate.safetensors"),
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    # One thread: on a shared machine with few cores several threads run many times slower.
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    write_refs(model, tok, args.out)
    write_generations(model, tok, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
