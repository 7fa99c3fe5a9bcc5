"""Reference for target_forward: Hugging Face transformers' Qwen3 forward on the same shapes.

A Qwen3-8B-shaped model (H=4096, 32/8 heads, head_dim 128, I=12288, V=151936, qk_norm) with
random bf16 weights on the GPU, truncated to the 34 decoder layers that dflash runs for layer ids
[1, 9, 17, 25, 33]. It is Qwen3Model (no lm_head) called without output_hidden_states: the cheapest
HF forward that could give those features (output_hidden_states=True keeps references to every
layer's output and costs no extra compute; the lm_head over 8192 tokens would add 2.3 GiB of
logits and about 10 TFLOP). HF has no packed-batch path for sdpa, so each case's documents run one
at a time (batch 1, no padding); the "1 doc" case is a single 8192-token forward.

The cases, the document lengths (same splitmix64 draw), the timing (2 warm-ups, median of --runs,
synchronize after each forward) and the table columns are those of target_forward.cc.
"""

import argparse
import importlib.util
import statistics
import sys
import time

import torch
import transformers
from transformers import Qwen3Config, Qwen3Model

GIB = 1024.0**3
MASK64 = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def mix_lengths(total, seed):
    """Same rule as MixLengths in target_forward.cc."""
    lengths, rest = [], total
    while rest > 0:
        seed, x = splitmix64(seed)
        n = 100 + x % 1901
        if rest - n < 100:
            n = rest if rest <= 2000 else rest - 100
        lengths.append(n)
        rest -= n
    return lengths


def build_model(attn):
    kwargs = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                  num_hidden_layers=34, num_attention_heads=32, num_key_value_heads=8,
                  head_dim=128, rms_norm_eps=1e-6, max_position_embeddings=40960,
                  rope_theta=1000000.0, tie_word_embeddings=False, attn_implementation=attn)
    config = Qwen3Config(**kwargs)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3Model(config)
    torch.set_default_dtype(torch.float32)
    # The same scales as target_forward.cc: matrices N(0, 1/in), embeddings N(0, 1), norms 1.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, p.shape[1] ** -0.5)
    return model.eval()


def forward_flops(layers, lengths):
    """Same count as ForwardFlops in target_forward.cc (GEMMs plus causal attention)."""
    h, d, inter, hq, hkv = 4096, 128, 12288, 32, 8
    gemm_params = h * (hq + 2 * hkv) * d + hq * d * h + 3 * h * inter
    return layers * (2 * gemm_params * sum(lengths) + 2 * sum(n * n for n in lengths) * d * hq)


def run_case(model, name, lengths, runs):
    docs = [torch.randint(0, 151936, (1, n), device="cuda") for n in lengths]
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    with torch.inference_mode():
        for i in range(runs + 2):
            start = time.perf_counter()
            for d in docs:
                model(input_ids=d, use_cache=False)
            torch.cuda.synchronize()
            if i >= 2:
                times.append((time.perf_counter() - start) * 1000.0)
    ms = statistics.median(times)
    tokens = sum(lengths)
    peak = torch.cuda.max_memory_allocated()
    tflops = forward_flops(model.config.num_hidden_layers, lengths) / (ms / 1000.0) / 1e12
    print(f"| HF {model.config._attn_implementation}, one doc at a time | {name} | {len(lengths)} "
          f"| {tokens} | {ms:.1f} | {tokens / (ms / 1000.0):.0f} | {tflops:.0f} | {peak / GIB:.2f} "
          f"| {(peak - base) / GIB:.2f} |", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=8192)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("target_forward_hf: no CUDA device", file=sys.stderr)
        return 1
    attn = "flash_attention_2" if importlib.util.find_spec("flash_attn") else "sdpa"
    model = build_model(attn)
    mix = mix_lengths(args.tokens, 1234)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, attention {attn}")
    print("mix lengths: " + " ".join(str(n) for n in mix))
    print(f"weights: {torch.cuda.memory_allocated() / GIB:.2f} GiB allocated\n")
    print("| impl | case | docs | tokens | median ms | tokens/s | model TFLOP/s | peak GiB "
          "| peak above weights GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    t = args.tokens
    cases = [("mix 100-2000", mix), ("4 docs", [t // 4] * 4), ("64 docs", [t // 64] * 64),
             ("1 doc", [t])]
    for name, lengths in cases:
        run_case(model, name, lengths, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
