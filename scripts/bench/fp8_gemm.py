"""The raw GEMMs behind drafter.precision: fp8, in PyTorch on one GPU: bf16 x bf16 -> bf16
(at::linear) against torch._scaled_mm e4m3 x e4m3 -> bf16 with rowwise scales, with and without
fast accumulation, at the Qwen3-8B drafter's projection shapes for 8192 query rows (8192 / 512
anchors), and the rowwise quantization of one activation (what fp8_linear.cc adds per GEMM).
Reference timings for docs/benchmarks-training.md ("fp8 projections"): what the hardware gives the
fp8 step at most. Usage: python3 scripts/bench/fp8_gemm.py [--json FILE]"""
import argparse
import json

import torch


def timed(fn, reps=30):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def quantize_rows(t):
    amax = t.abs().amax(dim=1).float().clamp(min=1e-12)
    scale = amax / 448.0
    return (t.float() / scale[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn), scale


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    args = p.parse_args()
    dev = torch.device("cuda")
    rows = []
    # (name, M, K, N): y [M, N] = x [M, K] W^T, W [N, K].
    for name, m, k, n in [("q/o proj", 8192, 4096, 4096), ("k/v proj (ctx + block)", 16384, 4096, 1024),
                          ("gate/up proj", 8192, 4096, 12288), ("down proj", 8192, 12288, 4096),
                          ("weight grad of gate (K = tokens)", 12288, 8192, 4096)]:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        xq, xs = quantize_rows(x)
        wq, ws = quantize_rows(w)
        flop = 2.0 * m * k * n
        bf16 = timed(lambda: torch.nn.functional.linear(x, w))
        r = {"gemm": name, "m": m, "k": k, "n": n, "bf16_ms": bf16}
        for fast in (False, True):
            ms = timed(lambda: torch._scaled_mm(xq, wq.t(), xs[:, None], ws[None, :],
                                                out_dtype=torch.bfloat16, use_fast_accum=fast))
            r["fp8_fast_ms" if fast else "fp8_ms"] = ms
        r["quant_x_ms"] = timed(lambda: quantize_rows(x))
        r["bf16_tflops"] = flop / bf16 / 1e9
        r["fp8_tflops"] = flop / r["fp8_ms"] / 1e9
        r["fp8_fast_tflops"] = flop / r["fp8_fast_ms"] / 1e9
        rows.append(r)
        print(f"{name:34s} bf16 {bf16:6.3f} ms ({r['bf16_tflops']:5.0f} TF/s)  fp8 {r['fp8_ms']:6.3f} "
              f"({r['fp8_tflops']:5.0f})  fp8 fast-accum {r['fp8_fast_ms']:6.3f} "
              f"({r['fp8_fast_tflops']:5.0f})  quantize x (eager) {r['quant_x_ms']:6.3f}")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
