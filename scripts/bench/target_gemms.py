"""The Qwen3-8B target forward's projections as cuBLAS runs them, in PyTorch on one GPU: the fused
qkv and gate_up products TargetModel uses against the split q/k/v and gate/up products HF runs,
o_proj and down_proj, bf16, 8192 rows. Per product: ms (CUDA events, mean of 30 after 3), TFLOP/s,
and ms per forward (x 34 layers). Issue 28 D3 asks why our projections measured 156 ms against
HF's 137 (docs/benchmarks.md, "Throughput and memory"): this times the same shapes alone, with the
same library LibTorch calls. Usage: python3 scripts/bench/target_gemms.py [--rows 8192]
[--json FILE]"""
import argparse
import json

import torch

from fp8_gemm import timed  # CUDA events, mean of 30 after 3 warm-up calls


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--layers", type=int, default=34)
    p.add_argument("--json")
    args = p.parse_args()
    torch.manual_seed(0)
    dev, dt, m = torch.device("cuda"), torch.bfloat16, args.rows
    h, d, hq, hkv, inter = 4096, 128, 32, 8, 12288
    # (group, name, K, N): y [M, N] = x [M, K] W^T with W [N, K], as at::linear.
    shapes = [("fused", "qkv", h, (hq + 2 * hkv) * d), ("split", "q", h, hq * d),
              ("split", "k", h, hkv * d), ("split", "v", h, hkv * d), ("both", "o_proj", hq * d, h),
              ("fused", "gate_up", h, 2 * inter), ("split", "gate", h, inter),
              ("split", "up", h, inter), ("both", "down", inter, h)]
    rows, total = [], {"fused": 0.0, "split": 0.0}
    print(f"| group | product | M x K x N | ms | TFLOP/s | ms x {args.layers} layers |")
    print("|---|---|---|---|---|---|")
    for group, name, k, n in shapes:
        x = torch.randn(m, k, device=dev, dtype=dt)
        w = torch.randn(n, k, device=dev, dtype=dt) * k ** -0.5
        ms = timed(lambda: torch.nn.functional.linear(x, w))
        tflops = 2 * m * k * n / ms / 1e9
        rows.append({"group": group, "name": name, "m": m, "k": k, "n": n, "ms": ms,
                     "tflops": tflops})
        for g in ("fused", "split"):
            if group in (g, "both"):
                total[g] += ms * args.layers
        print(f"| {group} | {name} | {m} x {k} x {n} | {ms:.3f} | {tflops:.0f} | "
              f"{ms * args.layers:.1f} |")
    print(f"\nper forward ({args.layers} layers): fused {total['fused']:.1f} ms, "
          f"split {total['split']:.1f} ms; device {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "per_forward_ms": total}, f, indent=1)


if __name__ == "__main__":
    main()
