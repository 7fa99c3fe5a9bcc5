#!/usr/bin/env python3
"""Plots the loss and held-out tau curves of scripts/bench/real_model.sh's run into one PNG.

  plot_real_model.py OUT_DIR PNG [--ref REF_CURVES.jsonl] [--title TEXT]

OUT_DIR/curves.jsonl holds {"step", "loss"} and {"step", "tau"} lines (real_model.sh writes it);
--ref adds the PyTorch reference loop's curve of the same form (scripts/bench/train_ref.py).
Needs matplotlib (pip install matplotlib; not a test dependency).
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    loss, tau = [], []
    for line in open(path):
        if not line.strip():
            continue
        r = json.loads(line)
        if "loss" in r:
            loss.append((r["step"], r["loss"]))
        if "tau" in r:
            tau.append((r["step"], r["tau"]))
    return sorted(loss), sorted(tau)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("png")
    ap.add_argument("--ref")
    ap.add_argument("--title", default="DFlash drafter for SmolLM2-135M-Instruct (block 16)")
    args = ap.parse_args()
    runs = [("dflash", read(os.path.join(args.out_dir, "curves.jsonl")))]
    if args.ref:
        runs.append(("PyTorch reference", read(args.ref)))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, (loss, tau) in runs:
        if loss:
            ax1.plot(*zip(*loss), label=name, linewidth=0.8)
        if tau:
            ax2.plot(*zip(*tau), marker="o", label=name)
    ax1.set_xlabel("optimizer step")
    ax1.set_ylabel("training loss (weighted CE)")
    ax1.set_yscale("log")
    ax1.grid(alpha=0.3)
    ax1.legend()
    ax2.set_xlabel("optimizer step")
    ax2.set_ylabel("held-out tau (tokens per verification)")
    ax2.grid(alpha=0.3)
    ax2.legend()
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
