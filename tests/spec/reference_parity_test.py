"""Parity of our speculative decoding (dflashctl eval's code) with the reference inference package.

1. transformers 5 builds a tiny random Llama target (tied embeddings, like SmolLM2) in --work.
2. spec_parity_tool trains a drafter for it for a few Adam steps on the target's own greedy
   continuations of random prompts (most of those it then decodes: it is often right) and exports
   it through ExportDrafter (bf16, the serving format).
3. scripts/bench/dflash_reference_eval.py loads the export UNCHANGED with dflash==0.1.0's
   DFlashDraftModel.from_pretrained (it fails on any missing or unexpected tensor) and decodes the
   prompts with the package's dflash_generate at batch 1, and with block size 1 (plain greedy).
4. spec_parity_tool decodes the same prompts with spec::SpeculativeGenerate and plain greedy.
5. Both compute the drafter's logits of the first block after each prompt (fp32, the package's
   first step): relative error below 1e-4.

Both sides must emit the same tokens, equal to plain greedy decoding, with the same number of
tokens emitted at every verification, and the same pooled and per-prompt taus and histogram.
The set-up must exercise what differs most easily: accepted proposals, a stop token, and the
shorter last block at the token limit; otherwise the test fails as too weak.

All of it three times: a drafter of full-attention layers; one whose second layer is a
sliding-attention layer with a window of 4 (method.md §2.1: causal inside the block, each slot
seeing only the rows less than 4 positions before its own), exported with layer_types,
sliding_window and use_sliding_window, which the package reads through transformers' Qwen3Config;
and a DFlash2 drafter (method.md §2.2: the full one's weights with convolutions off the identity,
a random candidate selector, an output multiplier and soft-capping), which the package loads as
DFlash2DraftModel: also the selector's greedy proposals of each first block are compared, and
the decoded tokens are the selector's.
"""

import argparse
import json
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BENCH = os.path.join(ROOT, "scripts", "bench", "dflash_reference_eval.py")
for name in ("oracle-transformers5", "oracle-dflash"):
    site = os.path.join(sys.prefix, name)
    if not os.path.isdir(site):
        sys.exit(f"FAIL: {site} is missing: run scripts/setup.sh (it installs transformers 5 and "
                 f"dflash==0.1.0 there)")
    sys.path.insert(0, site)

import torch  # noqa: E402
import transformers  # noqa: E402

VOCAB = 64
BLOCK = 4
MAX_NEW = 23  # not a multiple of what a step emits: the last block is shorter


def build_target(path):
    torch.manual_seed(7)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=1,
        eos_token_id=2,
        # Larger weights than the default 0.02, where the tied embedding dominates and greedy
        # decoding repeats the prompt's last token forever: runs of a token mixed with varied text.
        initializer_range=0.15)
    transformers.LlamaForCausalLM(config).save_pretrained(path)


def reference_logits(target_dir, drafter_dir, prompts_path):
    """The package's drafter logits of slots 1..B-1 of the first block after each prompt (fp32),
    as dflash_generate's first step computes them, its anchor tokens and (DFlash2) the selector's
    greedy proposals."""
    import dflash.model as dm  # noqa: E402  (the package, on the path set above)
    target = transformers.LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    with open(os.path.join(drafter_dir, "config.json")) as f:
        dflash2 = "DFlash2DraftModel" in json.load(f)["architectures"]
    cls = dm.DFlash2DraftModel if dflash2 else dm.DFlashDraftModel
    draft = cls.from_pretrained(drafter_dir, dtype=torch.float32).eval()
    out, anchors, proposals = [], [], []
    with open(prompts_path) as f, torch.no_grad():
        for line in f:
            ids = json.loads(line)["input_ids"]
            x = torch.tensor([ids])
            o = target(x, output_hidden_states=True)
            g = int(o.logits[0, -1].argmax())
            hidden = dm.extract_context_feature(o.hidden_states, draft.target_layer_ids)
            block = torch.tensor([[g] + [draft.mask_token_id] * (draft.block_size - 1)])
            noise = dm._raw_input_embeddings(target, block)
            pos = torch.arange(len(ids) + draft.block_size).unsqueeze(0)
            h = draft(target_hidden=hidden, noise_embedding=noise, position_ids=pos)
            out.append(draft.compute_logits(h[:, 1:, :], dm._output_head(target))[0].double())
            anchors.append(g)
            if dflash2:
                path, _, _ = draft.propose(h[:, 1:, :], block[:, 0], dm._output_head(target), 0.0)
                proposals.append(path[0].tolist())
    return out, anchors, proposals


def run(cmd):
    # One thread each: CI machines are small and shared; the results do not depend on it.
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-4000:]}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    target = os.path.join(args.work, "target")
    build_target(target)
    failed = False
    for variant, extra in (("full", []),
                           ("sliding", ["--sliding_layers", "1", "--sliding_window", "4"]),
                           ("dflash2", ["--dflash2", "2,16,8,6"])):
        failed |= not compare(args, target, variant, extra)
    if failed:
        sys.exit(1)
    print("PASS: logits, tokens and every verification's acceptance equal to dflash==0.1.0, "
          "full and sliding layers, and DFlash2")


def compare(args, target, variant, extra):
    drafter = os.path.join(args.work, "drafter-" + variant)
    prompts = os.path.join(args.work, "prompts.jsonl")
    train_prompts = os.path.join(args.work, "train_prompts.jsonl")
    rng = random.Random(11)
    lines = []
    for _ in range(10):
        ids = [rng.randrange(3, VOCAB - 1) for _ in range(rng.randrange(4, 14))]
        lines.append(json.dumps({"input_ids": ids}) + "\n")
    # The drafter learns the continuations of the first 7 prompts (so that it is often right,
    # also over whole blocks) and of 3 others; it decodes the first 7 and 1 it has not seen.
    with open(train_prompts, "w") as f:
        f.writelines(lines[:7] + lines[8:])
    with open(prompts, "w") as f:
        f.writelines(lines[:8])
    run([args.tool, "export", "--target", target, "--out", drafter, "--layers", "2",
         "--block_size", str(BLOCK), "--layer_ids", "1,3", "--mask_token_id", str(VOCAB - 1),
         "--seed", "3", "--train_prompts", train_prompts, "--train_steps", "30", "--lr", "0.01",
         "--train_tokens", str(MAX_NEW + BLOCK)] + extra)
    # The logits of the first block after each prompt, against the package's (fp32).
    ours = json.loads(run([args.tool, "logits", "--target", target, "--drafter", drafter,
                           "--prompts", prompts]))
    ref_logits, ref_anchors, ref_proposals = reference_logits(target, drafter, prompts)
    if ours["proposals"] != ref_proposals:
        print(f"FAIL ({variant}): the selector's proposals differ: {ours['proposals']}, "
              f"{ref_proposals}")
        return False
    if variant == "dflash2":
        print(f"{variant}: the selector's greedy proposals of {len(ref_proposals)} first blocks "
              f"equal the package's")
    if ours["anchor_tokens"] != ref_anchors:
        print(f"FAIL ({variant}): anchor tokens differ: {ours['anchor_tokens']}, {ref_anchors}")
        return False
    worst = max(float((torch.tensor(o, dtype=torch.float64) - r).abs().max() / r.abs().max())
                for o, r in zip(ours["logits"], ref_logits))
    print(f"{variant}: drafter logits of {len(ref_logits)} first blocks, max relative error "
          f"{worst:.2e} against dflash==0.1.0")
    if not worst < 1e-4:
        print(f"FAIL ({variant}): logits differ from the package's: {worst:.2e} (bound 1e-4)")
        return False
    if variant == "sliding":
        with open(os.path.join(drafter, "config.json")) as f:
            written = json.load(f)
        if written.get("layer_types") != ["full_attention", "sliding_attention"] or \
                written.get("sliding_window") != 4 or written.get("use_sliding_window") is not True:
            print(f"FAIL ({variant}): the export's attention fields: {written.get('layer_types')}, "
                  f"{written.get('sliding_window')}, {written.get('use_sliding_window')}")
            return False

    # A stop token that ends some prompts early: the most frequent token that plain greedy
    # decoding emits after the 4th.
    model = transformers.LlamaForCausalLM.from_pretrained(target).eval()
    counts = {}
    with open(prompts) as f:
        for line in f:
            ids = torch.tensor([json.loads(line)["input_ids"]])
            out = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None,
                                 pad_token_id=0)[0, ids.shape[1]:].tolist()
            for t in out[4:]:
                counts[t] = counts.get(t, 0) + 1
    stop = [max(counts, key=counts.get)]
    mine = json.loads(run([args.tool, "decode", "--target", target, "--drafter", drafter,
                           "--prompts", prompts, "--max_new_tokens", str(MAX_NEW),
                           "--stop", ",".join(map(str, stop))]))
    ref = json.loads(run([sys.executable, BENCH, "--target", target, "--drafter", drafter,
                          "--prompts", prompts, "--max-new-tokens", str(MAX_NEW),
                          "--stop-token-ids", ",".join(map(str, stop)), "--device", "cpu",
                          "--dtype", "float32", "--per-step"]))

    failures = []
    for i, (m, r) in enumerate(zip(mine["prompts"], ref["per_prompt"])):
        if m["tokens"] != r["tokens"]:
            failures.append(f"prompt {i}: tokens differ: ours {m['tokens']}, ref {r['tokens']}")
        if m["tokens"] != m["greedy"]:
            failures.append(f"prompt {i}: ours differs from our plain greedy decoding")
        if r["tokens"] != r["greedy"]:
            failures.append(f"prompt {i}: the reference differs from its plain greedy decoding")
        if m["step_emitted"] != r["acceptance_lengths"]:
            failures.append(f"prompt {i}: per-step acceptance differs: ours {m['step_emitted']}, "
                            f"ref {r['acceptance_lengths']}")
    if len(mine["prompts"]) != len(ref["per_prompt"]):
        failures.append("prompt counts differ")
    for key in ("tau_pooled", "tau_prompt_mean"):
        if abs(mine[key] - ref[key]) > 1e-9:
            failures.append(f"{key}: ours {mine[key]}, ref {ref[key]}")
    for key in ("verifications", "emitted_histogram"):
        if mine[key] != ref[key]:
            failures.append(f"{key}: ours {mine[key]}, ref {ref[key]}")

    # The set-up must test something: proposals accepted, a stop, a shorter last block (the
    # last two with the full layers; the sliding drafter decodes the same prompts).
    steps = [p["step_emitted"] for p in mine["prompts"]]
    if mine["accepted"] == 0:
        failures.append("too weak: no proposal was ever accepted")
    if variant == "full" and not any(p["tokens"] and p["tokens"][-1] in stop for p in mine["prompts"]):
        failures.append("too weak: no prompt ended on the stop token")
    if variant == "full" and not any(len(p["tokens"]) == MAX_NEW and p["tokens"][-1] not in stop and
               sum(s) == MAX_NEW - 1 and s[-1] < BLOCK for p, s in zip(mine["prompts"], steps)):
        failures.append("too weak: no prompt reached the token limit in a shorter last block")

    summary = {k: mine[k] for k in ("verifications", "accepted", "tau", "tau_pooled",
                                    "tau_prompt_mean", "emitted_histogram")}
    print(json.dumps({"variant": variant, "ours": summary, "stop": stop,
                      "ref": {k: ref[k] for k in ("tau_pooled", "tau_prompt_mean",
                                                  "emitted_histogram", "greedy_equal")}}))
    if failures:
        print(f"FAIL ({variant}):\n  " + "\n  ".join(failures))
        return False
    return True


if __name__ == "__main__":
    main()
