"""Speculative decoding with the reference inference package (dflash==0.1.0 on PyPI), batch 1.

The PyTorch reference of `dflashctl eval` (docs/cli.md#eval): loads a target checkpoint with
transformers and a drafter exported by dflash (`dflashctl export`, config.json + model.safetensors)
UNCHANGED with the package's DFlashDraftModel.from_pretrained, decodes every prompt greedily with
its dflash_generate at the given block size, and again with block size 1 (plain greedy decoding of
the target, the package's own baseline), and prints one JSON object:

  tau_pooled        tokens emitted by verifications / verifications, over every prompt
  tau_prompt_mean   the mean over prompts of each prompt's mean (what `dflash benchmark` prints as
                    "Average Acceptance length"); prompts with no verification are left out
  emitted_histogram verifications by tokens emitted, index 0..block_size (the package's
                    "acceptance length": accepted proposals plus the bonus, cut at a stop token
                    and at the token limit)
  greedy_equal      whether every prompt's tokens equal plain greedy decoding's
  tokens_per_second, baseline_tokens_per_second   decoding only (prefill included, load excluded)
  per_prompt        with --per-step: each prompt's input_ids, tokens, greedy tokens and acceptance
                    lengths

Prompts (JSONL, one per line): {"input_ids": [...]} as they are, or {"messages": [...]} /
{"prompt": "text"}, which the target's chat template turns into tokens (add_generation_prompt,
no special tokens added, as the package's benchmark does). Stop tokens: --stop-token-ids, else the
target's generation_config eos_token_id.

Needs torch and transformers 5 (the GPU machine: torch 2.11 + transformers 5.17) and the package:
put on sys.path from --dflash-path, else from <venv>/oracle-dflash and <venv>/oracle-transformers5
when they exist (scripts/setup.sh installs them there), else the interpreter's own. On a machine
without internet carry the wheel and install it with `pip install --no-deps --target DIR
dflash-0.1.0-py3-none-any.whl`, then give --dflash-path DIR.

Runs on the CPU too (tests/spec/reference_parity_test.py runs it on a tiny model in CI): there the
package's timer, which synchronizes CUDA, is replaced by time.perf_counter; nothing else of the
package is changed.
"""

import argparse
import json
import os
import statistics
import sys
import time


def _add_paths(dflash_path):
    paths = []
    if dflash_path:
        paths.append(dflash_path)
    for name in ("oracle-dflash", "oracle-transformers5"):
        p = os.path.join(sys.prefix, name)
        if os.path.isdir(p):
            paths.append(p)
    for p in reversed(paths):
        sys.path.insert(0, p)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="target checkpoint directory (HF)")
    ap.add_argument("--drafter", required=True, help="drafter exported by dflashctl export")
    ap.add_argument("--prompts", required=True, help="JSONL prompts (see the module docstring)")
    ap.add_argument("--block-size", type=int, default=None, help="default: the drafter's")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--max-prompts", type=int, default=None)
    ap.add_argument("--stop-token-ids", default=None,
                    help="comma-separated ids; 'none' for none; default: generation_config eos")
    ap.add_argument("--device", default=None, help="default: cuda:0 when available, else cpu")
    ap.add_argument("--dtype", default=None, choices=("bfloat16", "float32"),
                    help="target and drafter dtype; default: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--dflash-path", default=None, help="folder holding the dflash package")
    ap.add_argument("--per-step", action="store_true", help="also print every prompt's steps")
    ap.add_argument("--no-baseline", action="store_true", help="skip the block-size-1 decode")
    return ap.parse_args(argv)


def load_prompts(path, tokenizer_dir, limit):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    sys.exit(f"{path}:{n}: not JSON: {e}")
    if limit is not None:
        rows = rows[:limit]
    tokenizer = None
    prompts = []
    for n, row in enumerate(rows, 1):
        if "input_ids" in row:
            prompts.append([int(t) for t in row["input_ids"]])
            continue
        if "messages" in row:
            messages = row["messages"]
        elif "prompt" in row:
            messages = [{"role": "user", "content": row["prompt"]}]
        else:
            sys.exit(f"{path}:{n}: expected input_ids, messages or prompt")
        if tokenizer is None:
            from transformers import AutoTokenizer
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    if not prompts:
        sys.exit(f"{path}: no prompts")
    return prompts


def stop_ids(arg, target):
    if arg is not None:
        return [] if arg == "none" else [int(x) for x in arg.split(",") if x]
    eos = target.generation_config.eos_token_id
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


def main(argv=None):
    args = parse_args(argv)
    _add_paths(args.dflash_path)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    try:
        import dflash.model as dm
    except ImportError as e:
        sys.exit(f"cannot import the dflash package ({e}): run scripts/setup.sh or give "
                 f"--dflash-path")
    if int(transformers.__version__.split(".")[0]) < 5:
        sys.exit(f"dflash==0.1.0 needs transformers 5, found {transformers.__version__}")

    device = torch.device(args.device or ("cuda:0" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    if device.type != "cuda":
        dm._cuda_time = time.perf_counter  # the package's timer synchronizes CUDA

    target = AutoModelForCausalLM.from_pretrained(args.target, attn_implementation="sdpa",
                                                  dtype=dtype).to(device).eval()
    # The class the export names: DFlashDraftModel, or DFlash2DraftModel (convolutions and the
    # candidate selector).
    with open(os.path.join(args.drafter, "config.json")) as f:
        architectures = json.load(f).get("architectures", [])
    cls = dm.DFlash2DraftModel if "DFlash2DraftModel" in architectures else dm.DFlashDraftModel
    draft, info = cls.from_pretrained(args.drafter, attn_implementation="sdpa", dtype=dtype,
                                      output_loading_info=True)
    problems = {k: v for k, v in info.items() if v and k != "error_msgs"} if info else {}
    if problems or (info and info.get("error_msgs")):
        sys.exit(f"{args.drafter}: the reference package did not load every tensor: {info}")
    draft = draft.to(device).eval()
    block = args.block_size or draft.block_size
    prompts = load_prompts(args.prompts, args.target, args.max_prompts)
    stops = stop_ids(args.stop_token_ids, target)

    def run(input_ids, bs):
        x = torch.tensor([input_ids], dtype=torch.long, device=device)
        start = time.perf_counter()
        r = dm.dflash_generate(draft, target, x, args.max_new_tokens, stops or None,
                               block_size=bs, return_stats=True)
        seconds = time.perf_counter() - start
        return r.output_ids[0, r.num_input_tokens:].tolist(), r.acceptance_lengths, seconds

    run(prompts[0], block)  # warm-up
    per_prompt, all_steps, prompt_means = [], [], []
    spec_tokens = spec_seconds = base_tokens = base_seconds = 0
    greedy_equal = True
    for p in prompts:
        tokens, steps, seconds = run(p, block)
        spec_tokens += len(tokens)
        spec_seconds += seconds
        all_steps += steps
        if steps:
            prompt_means.append(statistics.mean(steps))
        entry = {"input_ids": p, "tokens": tokens, "acceptance_lengths": steps}
        if not args.no_baseline:
            greedy, _, seconds = run(p, 1)
            base_tokens += len(greedy)
            base_seconds += seconds
            greedy_equal &= greedy == tokens
            entry["greedy"] = greedy
        per_prompt.append(entry)

    out = {
        "target": os.path.abspath(args.target),
        "drafter": os.path.abspath(args.drafter),
        "device": str(device),
        "dtype": str(dtype).replace("torch.", ""),
        "transformers": transformers.__version__,
        "block_size": block,
        "max_new_tokens": args.max_new_tokens,
        "stop_token_ids": stops,
        "prompts": len(prompts),
        "new_tokens": spec_tokens,
        "verifications": len(all_steps),
        "tau_pooled": sum(all_steps) / len(all_steps) if all_steps else 0.0,
        "tau_prompt_mean": float(statistics.mean(prompt_means)) if prompt_means else 0.0,
        "emitted_histogram": [all_steps.count(e) for e in range(block + 1)],
        "greedy_equal": None if args.no_baseline else greedy_equal,
        "tokens_per_second": spec_tokens / spec_seconds if spec_seconds > 0 else 0.0,
        "baseline_tokens_per_second": (base_tokens / base_seconds
                                       if base_seconds > 0 else None),
    }
    if args.per_step:
        out["per_prompt"] = per_prompt
    print(json.dumps(out))


if __name__ == "__main__":
    main()
