"""PyTorch FlexAttention on the DFlash mask: the reference that scripts/bench/dflash_attn.cc is
compared with in the same run (scripts/bench/dflash_attn.sh).

Reads the mask written by `dflash_attn --mask-out FILE` (context rows T, anchors n, block B,
document ids, anchors), builds the same mask as method.md §3.3 with a mask_mod, and times forward
and forward+backward of flex_attention compiled with torch.compile and uncompiled, bf16, with the
same shapes (q [1, Hq, n*B, D], k/v [1, Hkv, T + n*B, D], enable_gqa). Prints one table row per
implementation, plus ours from --ours (the JSON of dflash_attn --json) with the speed-up.
"""

import argparse
import json
import math

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


def read_mask(path):
    with open(path) as f:
        t, n, b = (int(x) for x in f.readline().split())
        doc = [int(x) for x in f.readline().split()]
        anchors = [int(x) for x in f.readline().split()]
    assert len(doc) == t and len(anchors) == n
    return t, n, b, doc, anchors


def median_ms(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mask", required=True)
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--ours")
    ap.add_argument("--skip-eager", action="store_true")
    args = ap.parse_args()
    t, n, b, doc, anchors = read_mask(args.mask)
    dev = torch.device("cuda")
    doc_t = torch.tensor(doc, device=dev)
    anc_t = torch.tensor(anchors, device=dev)
    q_len, kv_len = n * b, t + n * b

    def mask_mod(bb, h, q_idx, kv_idx):
        j = q_idx // b
        a = anc_t[j]
        ctx_row = torch.clamp(kv_idx, max=t - 1)
        in_ctx = (kv_idx < t) & (doc_t[ctx_row] == doc_t[a]) & (kv_idx < a)
        in_blk = (kv_idx >= t) & ((kv_idx - t) // b == j)
        return (in_ctx | in_blk) & (a >= 0)

    block_mask = create_block_mask(mask_mod, 1, None, q_len, kv_len, device=dev, _compile=True)
    d = args.head_dim
    q = torch.randn(1, args.hq, q_len, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, args.hkv, kv_len, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, args.hkv, kv_len, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(1, args.hq, q_len, d, device=dev, dtype=torch.bfloat16)
    scale = 1.0 / math.sqrt(d)
    visible = sum(b * (a - doc.index(doc[a]) + b) for a in anchors)
    fwd_tflop = 4.0 * d * args.hq * visible / 1e12
    bwd_tflop = 2.5 * fwd_tflop
    io_gib = (q.nbytes * 2 + k.nbytes * 2 + v.nbytes * 2 + dout.nbytes * 2 + q_len * args.hq * 4) / 2**30

    compiled = torch.compile(flex_attention)
    impls = [("flex compiled", compiled)]
    if not args.skip_eager:
        impls.append(("flex eager", flex_attention))
    rows = []
    for name, fn in impls:
        def fwd():
            with torch.no_grad():
                fn(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)

        def both():
            q.grad = k.grad = v.grad = None
            fn(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True).backward(dout)

        try:
            f_ms = median_ms(fwd, args.iters)
            torch.cuda.synchronize()
            both()
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            t_ms = median_ms(both, args.iters)
            peak = (torch.cuda.max_memory_allocated() - base) / 2**30
            rows.append((name, f_ms, t_ms - f_ms, t_ms, peak))
        except torch.OutOfMemoryError as e:  # eager flex materializes the scores
            print(f"{name}: out of memory ({str(e).splitlines()[0]})")
            q.grad = k.grad = v.grad = None
            torch.cuda.empty_cache()

    print(f"FlexAttention (torch {torch.__version__}), block mask sparsity "
          f"{block_mask.sparsity():.1f}%, same mask and shapes")
    ours = None
    if args.ours:
        with open(args.ours) as f:
            o = json.load(f)
        ours = ("dflash fused", o["fwd_ms"], o["bwd_ms"], o["total_ms"], o["peak_extra_gib"])
        rows.insert(0, ours)
    print(f"| {'implementation':22} | {'fwd ms':>9} | {'bwd ms':>9} | {'fwd+bwd':>9} | "
          f"{'fwd TFLOP/s':>11} | {'bwd TFLOP/s':>11} | {'peak extra GiB':>14} | {'ours faster':>11} |")
    for name, f_ms, b_ms, t_ms, peak in rows:
        speed = f"{t_ms / ours[3]:.2f}x" if ours else "-"
        print(f"| {name:22} | {f_ms:9.3f} | {b_ms:9.3f} | {t_ms:9.3f} | "
              f"{fwd_tflop / f_ms * 1e3:11.1f} | {bwd_tflop / b_ms * 1e3:11.1f} | {peak:14.3f} | {speed:>11} |")
    print(f"memory bound (inputs + outputs + LSE) x 1.1 = {io_gib * 1.1:.3f} GiB")


if __name__ == "__main__":
    main()
