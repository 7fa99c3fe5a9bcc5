"""Compares the loss curves of scripts/bench/gpu/fp8_step.sh (drafter_step --json, bf16 and fp8 on
the same batch and seed): the relative gap at every 10th step and the largest one, as a markdown
table. Usage: python3 scripts/bench/fp8_losses.py curve_auto.json curve_fp8.json"""
import json
import sys


def main() -> None:
    bf16 = json.load(open(sys.argv[1]))["losses"]
    fp8 = json.load(open(sys.argv[2]))["losses"]
    if len(bf16) != len(fp8):
        sys.exit(f"{len(bf16)} bf16 steps against {len(fp8)} fp8 steps")
    print("| step | bf16 loss | fp8 loss | fp8 / bf16 - 1 |")
    print("|---|---|---|---|")
    worst = 0.0
    for i in range(0, len(bf16), 10):
        gap = fp8[i] / bf16[i] - 1
        worst = max(worst, abs(gap))
        print(f"| {i} | {bf16[i]:.4f} | {fp8[i]:.4f} | {gap * 100:+.2f}% |")
    print(f"\nlargest |gap| at every 10th step: {worst * 100:.2f}% over {len(bf16)} steps")


if __name__ == "__main__":
    main()
