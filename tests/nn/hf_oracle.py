"""Reference features from Hugging Face transformers for the C++ target-model parity test.

Writes tiny random-weight checkpoints with save_pretrained (fp32) and, for a packed batch of
documents of different lengths, the residual stream after chosen decoder layers computed by HF one
document at a time. Layout under --out:

  qwen3/                 Qwen3, tied embeddings, qk_norm, 8 layers (default layer ids)
  llama/                 Llama, llama3 rope_scaling, untied lm_head, attention and MLP biases,
                         sharded (model.safetensors.index.json)
  {qwen3,llama,qwen3_moe}_refs.safetensors
      input_ids [T] int64, positions [T] int64 (restart at 0 per document),
      cu_seqlens [b+1] int32, layer_ids [K] int64,
      features [T, K*H] fp32: per token, the outputs of decoder layers layer_ids[0..K-1]
  qwen3_moe/             Qwen3-MoE, 4 layers: 8 experts, top 2 renormalized, layer 1 dense
                         (mlp_only_layers), untied lm_head
  qwen3_bad_shape/       one tensor with a wrong shape (names in BROKEN below)
  qwen3_missing/         one tensor absent

"Output of layer i" is captured with a forward hook on decoder layer i: HF's hidden_states[i+1]
is the same tensor except for the last layer, where HF returns the final-normed output instead.
"""

import argparse
import copy
import json
import math
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3NextConfig, Qwen3NextForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

# Runs under transformers 4.57 (CPU machines) and 5.x (GPU machine). 5.x renames the config's
# torch_dtype to dtype (4.56+ accept both) and writes rope_theta and rope_scaling as one
# "rope_parameters" object in config.json, which common/model/hf_config.cc reads too.
DTYPE_KEY = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"

DOC_LENGTHS = [5, 17, 1, 9]
VOCAB = 256
GEN_PROMPT_LENGTHS = [5, 11, 1]
GEN_TOKENS = 24
BROKEN = {
    "bad_shape": "model.layers.1.self_attn.k_proj.weight",
    "missing": "model.layers.2.mlp.up_proj.weight",
}


def common_config():
    return dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        attn_implementation="eager",
        **{DTYPE_KEY: "float32"},
    )


def default_layer_ids(num_layers, k):
    """method.md §2; Python's round() is round-half-even."""
    if k == 1:
        return [num_layers // 2]
    return [round(1 + i * (num_layers - 4) / (k - 1)) for i in range(k)]


def randomize(model):
    """Weights far from HF's init (std 0.02, norms 1) so that attention is not uniform."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]))


def decoder_layers(model):
    """The decoder layers; a vision-language model's are those of its language model."""
    inner = model.model
    return inner.language_model.layers if hasattr(inner, "language_model") else inner.layers


def capture_layers(model, doc, layer_ids):
    """Outputs of the decoder layers [n, H] each, for one document (positions 0..n-1)."""
    captured = {}
    hooks = []
    layers = decoder_layers(model)
    for i in sorted(set(layer_ids)):
        def hook(module, args, output, i=i):
            captured[i] = (output[0] if isinstance(output, tuple) else output)[0].clone()
        hooks.append(layers[i].register_forward_hook(hook))
    with torch.no_grad():
        out = model(input_ids=doc[None], output_hidden_states=True)
    for h in hooks:
        h.remove()
    for i, t in captured.items():
        if i + 1 < len(layers):  # the last entry of hidden_states is after the final norm
            torch.testing.assert_close(t, out.hidden_states[i + 1][0], rtol=0, atol=0)
    return torch.cat([captured[i] for i in layer_ids], dim=-1)


def write_refs(model, layer_ids, path, generator, doc_lengths=DOC_LENGTHS):
    docs = [torch.randint(0, VOCAB, (n,), generator=generator) for n in doc_lengths]
    offsets = [0]
    for d in docs:
        offsets.append(offsets[-1] + len(d))
    features = torch.cat([capture_layers(model, d, layer_ids) for d in docs], dim=0)
    save_file(
        {
            "input_ids": torch.cat(docs).to(torch.int64),
            "positions": torch.cat([torch.arange(len(d)) for d in docs]).to(torch.int64),
            "cu_seqlens": torch.tensor(offsets, dtype=torch.int32),
            "layer_ids": torch.tensor(layer_ids, dtype=torch.int64),
            "features": features.contiguous(),
        },
        path,
    )


# Hybrid linear-attention models (Qwen3-Next, Qwen3.5): documents longer than the 64-token chunks
# of the chunked delta rule, one of exactly one chunk, and single tokens.
HYBRID_DOC_LENGTHS = [70, 5, 150, 1, 64, 20]


def hybrid_text_config(layer_types):
    """Tiny Qwen3-Next / Qwen3.5 text fields: 2 key heads serving 4 value heads in the delta-rule
    layers, head_dim 32 with a quarter of it rotated in the gated full-attention layers."""
    config = common_config()
    config.update(head_dim=32, num_hidden_layers=len(layer_types), layer_types=layer_types,
                  linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                  linear_num_key_heads=2, linear_num_value_heads=4, tie_word_embeddings=False)
    return config


def randomize_hybrid(model):
    """As randomize, for the parameters hybrid models add: zero-centered norms (scale 1 + w) near
    0, the delta rule's gated norm near 1, decays A = exp(A_log) in [0.05, 2.7], dt_bias, the
    depthwise convolution."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.uniform_(0.5, 1.5)
            elif "norm" in name:
                p.uniform_(-0.5, 0.5)
            elif name.endswith("A_log"):
                p.uniform_(-3.0, 1.0)
            elif name.endswith("dt_bias"):
                p.normal_(0.0, 0.5)
            elif "conv1d" in name:
                p.normal_(0.0, 0.5)
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))


def write_generations(model, path, generator):
    """HF greedy generation (no stop token) of GEN_TOKENS tokens after prompts of a few lengths.

    Beside the tokens, for the bf16 comparisons (which cannot be token for token: see
    docs/models.md, "Generation in bf16"), teacher-forced over prompt + generated tokens:
    `margins`, the fp32 logit gap between each generated token and the runner-up, and
    `bf16_argmax`, the next token transformers' own bf16 copy of the model picks at each step.
    """
    prompts = [torch.randint(0, VOCAB, (n,), generator=generator) for n in GEN_PROMPT_LENGTHS]
    model.generation_config.eos_token_id = None
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    outputs, margins, bf16_argmax = [], [], []
    for p in prompts:
        with torch.no_grad():
            g = model.generate(p[None], attention_mask=torch.ones_like(p[None]), do_sample=False,
                               max_new_tokens=GEN_TOKENS, pad_token_id=0)
            assert g.shape[1] == len(p) + GEN_TOKENS, g.shape
            steps = slice(len(p) - 1, len(p) - 1 + GEN_TOKENS)
            top2 = model(g).logits[0, steps].float().topk(2).values
            low = bf16(g).logits[0, steps].float()
        outputs.append(g[0, len(p):])
        margins.append(top2[:, 0] - top2[:, 1])
        bf16_argmax.append(low.argmax(-1))
    save_file(
        {
            "prompts": torch.cat(prompts).to(torch.int64),
            "prompt_lengths": torch.tensor(GEN_PROMPT_LENGTHS, dtype=torch.int64),
            "outputs": torch.stack(outputs).to(torch.int64).contiguous(),
            "margins": torch.stack(margins).to(torch.float32).contiguous(),
            "bf16_argmax": torch.stack(bf16_argmax).to(torch.int64).contiguous(),
        },
        path,
    )


def write_penalized(model, path, generator, penalty):
    """HF greedy generation with repetition_penalty after prompts of a few lengths (a prompt
    token repeated, so that the penalty applies from the first step)."""
    prompts = [torch.randint(0, VOCAB, (n,), generator=generator) for n in GEN_PROMPT_LENGTHS]
    prompts = [torch.cat([p, p[:1]]) for p in prompts]
    model.generation_config.eos_token_id = None
    outputs = []
    for p in prompts:
        with torch.no_grad():
            g = model.generate(p[None], attention_mask=torch.ones_like(p[None]), do_sample=False,
                               max_new_tokens=GEN_TOKENS, pad_token_id=0,
                               repetition_penalty=penalty)
        outputs.append(g[0, len(p):])
    save_file(
        {
            "prompts": torch.cat(prompts).to(torch.int64),
            "prompt_lengths": torch.tensor([len(p) for p in prompts], dtype=torch.int64),
            "outputs": torch.stack(outputs).to(torch.int64).contiguous(),
            "penalty": torch.tensor([penalty], dtype=torch.float64),
        },
        path,
    )


def write_broken(src_dir, out_dir, kind):
    """A copy of a single-file checkpoint with one tensor damaged (wrong shape) or removed."""
    os.makedirs(out_dir, exist_ok=True)
    shutil.copy(os.path.join(src_dir, "config.json"), out_dir)
    tensors = load_file(os.path.join(src_dir, "model.safetensors"))
    name = BROKEN[kind]
    if kind == "bad_shape":
        tensors[name] = tensors[name][: tensors[name].shape[0] // 2].contiguous()
    else:
        del tensors[name]
    save_file(tensors, os.path.join(out_dir, "model.safetensors"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(1234)
    generator = torch.Generator().manual_seed(42)

    qwen = Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=8, tie_word_embeddings=True,
                                        rope_theta=10000.0, **common_config())).eval()
    randomize(qwen)
    qwen.save_pretrained(os.path.join(args.out, "qwen3"))
    write_refs(qwen, default_layer_ids(8, 5), os.path.join(args.out, "qwen3_refs.safetensors"),
               generator)

    # llama3 scaling with small wavelength thresholds (32 / 1 and 32 / 4 tokens) so that the
    # high, medium and low frequency bands of a 16-wide head are all present.
    rope_scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    llama = LlamaForCausalLM(LlamaConfig(num_hidden_layers=4, tie_word_embeddings=False,
                                         rope_theta=10000.0, rope_scaling=rope_scaling,
                                         attention_bias=True, mlp_bias=True,
                                         **common_config())).eval()
    randomize(llama)
    llama.save_pretrained(os.path.join(args.out, "llama"), max_shard_size="200KB")
    # Unsorted, and including the last layer (pre-norm output).
    write_refs(llama, [0, 3, 1], os.path.join(args.out, "llama_refs.safetensors"), generator)

    moe = Qwen3MoeForCausalLM(Qwen3MoeConfig(num_hidden_layers=4, tie_word_embeddings=False,
                                             rope_theta=10000.0, num_experts=8,
                                             num_experts_per_tok=2, moe_intermediate_size=32,
                                             norm_topk_prob=True, decoder_sparse_step=1,
                                             mlp_only_layers=[1], **common_config())).eval()
    randomize(moe)
    moe.save_pretrained(os.path.join(args.out, "qwen3_moe"))
    write_refs(moe, [0, 1, 2, 3], os.path.join(args.out, "qwen3_moe_refs.safetensors"), generator)

    # Qwen3-Next: fused per-key-head input projections, MoE with a shared expert, one dense layer.
    # transformers 4.x stores the experts one module each; 5.x stacked.
    nxt = Qwen3NextForCausalLM(Qwen3NextConfig(
        rope_theta=10000.0, partial_rotary_factor=0.25, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=48, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[1],
        **hybrid_text_config(["linear_attention", "linear_attention", "full_attention",
                              "linear_attention", "full_attention"]))).eval()
    randomize_hybrid(nxt)
    nxt.save_pretrained(os.path.join(args.out, "qwen3_next"))
    write_refs(nxt, [0, 1, 2, 3, 4], os.path.join(args.out, "qwen3_next_refs.safetensors"),
               generator, HYBRID_DOC_LENGTHS)

    gen_generator = torch.Generator().manual_seed(7)
    write_generations(qwen, os.path.join(args.out, "qwen3_generate.safetensors"), gen_generator)
    write_generations(llama, os.path.join(args.out, "llama_generate.safetensors"), gen_generator)
    write_generations(moe, os.path.join(args.out, "qwen3_moe_generate.safetensors"), gen_generator)
    # Greedy with transformers' repetition_penalty (1.3) on the Qwen3 checkpoint: the prompts and
    # outputs only.
    write_penalized(qwen, os.path.join(args.out, "qwen3_penalty_generate.safetensors"),
                    torch.Generator().manual_seed(9), 1.3)
    # The hybrid: its generate() keeps the linear-attention layers' conv and recurrent states.
    write_generations(nxt, os.path.join(args.out, "qwen3_next_generate.safetensors"), gen_generator)

    for kind in BROKEN:
        write_broken(os.path.join(args.out, "qwen3"), os.path.join(args.out, f"qwen3_{kind}"), kind)
    json.dump(BROKEN, open(os.path.join(args.out, "broken.json"), "w"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
