"""Shared pieces of the peer step scripts (specforge_step.py, speculators_step.py): the flags, the
synthetic batch (the same recipe as scripts/bench/drafter_step.cc), the timing loop and the JSON
line. Nothing here touches a peer's model or loss; each script builds its package's own.

The batch (what drafter_step.cc builds, redrawn here with torch's RNG, so the same shape and
statistics, not the same numbers): documents of --doc-min..--doc-max tokens packed to exactly
--tokens tokens (the last one cut); token ids uniform in [16, min(V, 151000)), never the mask id;
loss mask alternating prompt / answer runs of 16..271 tokens (prompt first); features
[T, K*H] ~ N(0, 1) in bf16 (the target's dtype); the same batch every step. Anchors are NOT
passed: both peers draw up to --anchors anchors themselves inside their forward, at random, every
step (drafter_step.cc draws them once with batching::SampleAnchors). With about half of the tokens
supervised, both always find the full --anchors.
"""

import argparse
import json
import math
import os
import resource
import sys
import time

# Qwen3-8B: the drafter geometry (defaults) and what a config needs beside it.
QWEN3_8B_TARGET_LAYERS = 36
QWEN3_ROPE_THETA = 1_000_000.0
QWEN3_RMS_EPS = 1e-6
QWEN3_MAX_POSITIONS = 40960

# With 512 tokens (one document of 200..2000 cut to 512) about 220 positions are supervised; with
# 256 the first prompt run can cover nearly all of it (seed 1: 5 supervised tokens, 4 anchors).
TINY = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=512, layers=2,
            num_target_layers=2, tokens=512, anchors=8, steps=2, warmup=1)


def add_common_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("geometry (defaults: the Qwen3-8B drafter)")
    g.add_argument("--hidden", type=int, default=4096)
    g.add_argument("--heads", type=int, default=32)
    g.add_argument("--kv-heads", type=int, default=8)
    g.add_argument("--head-dim", type=int, default=128)
    g.add_argument("--intermediate", type=int, default=12288)
    g.add_argument("--vocab", type=int, default=151936)
    g.add_argument("--layers", type=int, default=5, help="drafter decoder layers")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--num-target-layers", type=int, default=5,
                   help="K: target layers whose hidden states are concatenated (features K*H)")
    g.add_argument("--target-depth", type=int, default=QWEN3_8B_TARGET_LAYERS,
                   help="layers of the target model the K feature layers are spread over")
    b = p.add_argument_group("batch")
    b.add_argument("--tokens", type=int, default=8192, help="context tokens of the one batch")
    b.add_argument("--anchors", type=int, default=512, help="max anchors (block starts)")
    b.add_argument("--doc-min", type=int, default=200)
    b.add_argument("--doc-max", type=int, default=2000)
    b.add_argument("--seed", type=int, default=1)
    r = p.add_argument_group("run")
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--steps", type=int, default=10)
    r.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    r.add_argument("--json", default="", help="also write the JSON line to this file")
    r.add_argument("--tiny", action="store_true",
                   help="CPU smoke geometry: " + " ".join(f"--{k.replace('_', '-')} {v}"
                                                          for k, v in TINY.items()))


def parse(p: argparse.ArgumentParser):
    args = p.parse_args()
    if args.tiny:
        given = {a.split("=")[0] for a in sys.argv[1:] if a.startswith("--")}
        for k, v in TINY.items():
            if f"--{k.replace('_', '-')}" not in given:
                setattr(args, k, v)
    if args.hidden != args.heads * args.head_dim:
        # Qwen3 allows it (o_proj maps heads*head_dim to hidden); just say so.
        print(f"note: hidden {args.hidden} != heads*head_dim {args.heads * args.head_dim}",
              file=sys.stderr)
    return args


def target_layer_ids(k: int, depth: int):
    """K distinct target layers spread over a depth-layer target (the DFlash recipe's
    build_target_layer_ids: from layer 1 to depth-3). Only the count matters for the cost."""
    if k == 1:
        return [depth // 2]
    start, end = 1, depth - 3
    return [int(round(start + i * (end - start) / (k - 1))) for i in range(k)]


def mask_token_id(vocab: int) -> int:
    # V-1: never drawn at V = 151936 (ids come from [16, 151000)); below 151000 a drawn V-1 is
    # replaced by 16, as drafter_step.cc replaces the mask id.
    return vocab - 1


def make_batch(args, device, torch):
    """The packed batch (see the module docstring). Returns a dict of tensors on `device`:
    input_ids [T] long, loss_mask [T] float32, document_ids [T] long, position_ids [T] long
    (restarting at 0 in each document), features [T, K*H] bf16, doc_lengths (list)."""
    gen = torch.Generator().manual_seed(args.seed)
    t = args.tokens
    vocab = min(args.vocab, 151000)
    mask_id = mask_token_id(args.vocab)
    ids, mask, doc_ids, pos, lengths = [], [], [], [], []
    filled = 0
    while filled < t:
        n = int(torch.randint(args.doc_min, args.doc_max + 1, (1,), generator=gen))
        take = min(n, t - filled)
        d = len(lengths)
        answer = False
        i = 0
        while i < take:
            run = 16 + int(torch.randint(0, 256, (1,), generator=gen))
            k = min(run, take - i)
            seg = torch.randint(16, vocab, (k,), generator=gen)
            seg[seg == mask_id] = 16
            ids.append(seg)
            mask.append(torch.full((k,), 1.0 if answer else 0.0))
            i += k
            answer = not answer
        doc_ids.append(torch.full((take,), d, dtype=torch.long))
        pos.append(torch.arange(take, dtype=torch.long))
        lengths.append(take)
        filled += take
    gen_f = torch.Generator().manual_seed(args.seed + 1)
    k_h = args.num_target_layers * args.hidden
    features = torch.randn(t, k_h, generator=gen_f).to(torch.bfloat16)
    last = torch.randn(t, args.hidden, generator=gen_f).to(torch.bfloat16)
    out = {
        "input_ids": torch.cat(ids).to(device),
        "loss_mask": torch.cat(mask).to(device),
        "document_ids": torch.cat(doc_ids).to(device),
        "position_ids": torch.cat(pos).to(device),
        "features": features.to(device),
        # The target's last hidden state (speculators derives its labels from it).
        "last_hidden": last.to(device),
    }
    out["doc_lengths"] = lengths
    return out


def sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_steps(torch, device, step_fn, warmup: int, steps: int):
    """step_fn() runs one full training step and returns the loss (a tensor or a float).
    Returns (ms of the timed steps, losses of every step)."""
    ms, losses = [], []
    for i in range(warmup + steps):
        sync(torch, device)
        t0 = time.perf_counter()
        loss = step_fn()
        sync(torch, device)
        elapsed = (time.perf_counter() - t0) * 1e3
        loss = float(loss)
        if not math.isfinite(loss):
            raise SystemExit(f"step {i}: non-finite loss {loss}")
        losses.append(loss)
        if i >= warmup:
            ms.append(elapsed)
        print(f"step {i}: {elapsed:.1f} ms, loss {loss:.6f}", file=sys.stderr, flush=True)
    return ms, losses


def report(torch, device, args, impl: str, ms, losses, anchors: int, setup_s: float,
           notes: str, extra=None):
    srt = sorted(ms)
    med = srt[len(srt) // 2]  # the upper median, as drafter_step.cc and drafter_step_ref.py
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    out = {
        "impl": impl, "tokens": args.tokens, "anchors": anchors,
        "steps_timed": len(ms), "ms_median": round(med, 3), "ms_min": round(srt[0], 3),
        "ms_max": round(srt[-1], 3), "steps_per_s": 1e3 / med,
        "ctx_tok_per_s": args.tokens * 1e3 / med, "peak_bytes": peak,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "device": (torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"),
        "torch": torch.__version__, "setup_s": round(setup_s, 1),
        "geometry": {k: getattr(args, k) for k in (
            "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "layers",
            "block_size", "num_target_layers")},
        "first_loss": losses[0], "losses": losses, "notes": notes,
    }
    if extra:
        out.update(extra)
    line = json.dumps(out)
    print(line, flush=True)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return out
