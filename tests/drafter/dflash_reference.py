"""Independent plain-PyTorch reference of the DFlash drafter and its loss (method.md §2-3).

Written from the method description, not from the C++ code: dense [Q, T+Q] attention mask built
element by element with Python loops, float64 arithmetic throughout, torch autograd for every
gradient. The C++ drafter test (drafter_test) runs this script once per build tree and compares
its own fp32 forward, loss and gradients against these files. Layout under --out:

  target/config.json        the tiny Qwen3 target the drafter copies its shapes from
  drafter/config.json       the drafter in the serving format of method.md §7
  drafter/model.safetensors fp32 drafter weights (§7 names)
  frozen.safetensors        embed_tokens [V, H], lm_head [V, H] (untied, fp32)
  batch.safetensors         features [T, K*H] fp32, input_ids [T] int64, positions [T] int64,
                            cu_seqlens [b+1] int32, anchors [n] int64 (-1 = padding block),
                            loss_mask [T] int64; metadata "gamma", "dpace_alpha"
  expected.safetensors      hidden [n*B, H] (after the final norm), weights [n*B],
                            numerator [], denominator [], slot_correct [B], slot_total [B] int64,
                            grad.<param> for every drafter tensor, grad.features [T, K*H]
                            (gradients of the numerator); dpace.weights, dpace.numerator,
                            dpace.denominator, dpace.grad.* the same under D-PACE weighting;
                            dflash2.hidden, dflash2.numerator, dflash2.slot_correct,
                            dflash2.grad.* of the DFlash2 drafter below
  drafter2/config.json, drafter2/model.safetensors
                            a DFlash2 drafter (method.md §2.2): the same weights plus
                            convolutions (random, far from the identity) and a candidate
                            selector; its loss adds the selector's K-way cross-entropy
"""

import argparse
import json
import math
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

HIDDEN = 64
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
INTERMEDIATE = 128
DRAFTER_LAYERS = 2
TARGET_LAYERS = 8
LAYER_IDS = [1, 3, 5]  # K = 3
BLOCK = 4
VOCAB = 256
MASK_ID = 255
EPS = 1e-6
THETA = 10000.0
GAMMA = 3.0
DPACE_ALPHA = 0.5
DOC_LENGTHS = [11, 17, 8]
CONV_KERNEL = 2
CONV_GROUP = 16
SELECTOR_RANK = 8
SELECTOR_TOP_K = 5
SEED = 1234

DTYPE = torch.float64


def target_config():
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": TARGET_LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": 512,
        "rms_norm_eps": EPS,
        "rope_theta": THETA,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }


def drafter_config():
    cfg = target_config()
    cfg.update(
        architectures=["DFlashDraftModel"],
        num_hidden_layers=DRAFTER_LAYERS,
        num_target_layers=TARGET_LAYERS,
        block_size=BLOCK,
        dflash_config={"mask_token_id": MASK_ID, "target_layer_ids": LAYER_IDS},
    )
    return cfg


def drafter2_config():
    cfg = drafter_config()
    cfg["architectures"] = ["DFlash2DraftModel"]
    cfg["dflash_config"].update(conv_kernel_size=CONV_KERNEL, conv_group_size=CONV_GROUP,
                                selector_rank=SELECTOR_RANK, selector_top_k=SELECTOR_TOP_K)
    return cfg


def make_dflash2_weights(gen):
    """The DFlash2 additions (method.md §2.2): per layer two convolutions, base [2, Kc, H] and the
    kernel projection [2 Kc G, H]; the selector's codebooks [V, R] and projection [R, H]."""
    groups = HIDDEN // CONV_GROUP
    w = {}
    for i in range(DRAFTER_LAYERS):
        for conv in ("attention_conv", "mlp_conv"):
            p = f"layers.{i}.{conv}."
            w[p + "base_kernel"] = 0.5 * torch.randn(2, CONV_KERNEL, HIDDEN, generator=gen) + \
                torch.tensor([1.0] + [0.0] * (CONV_KERNEL - 1))[None, :, None]
            w[p + "kernel_projection.weight"] = \
                0.3 * torch.randn(2 * CONV_KERNEL * groups, HIDDEN, generator=gen) / math.sqrt(HIDDEN)
    w["candidate_selector.predecessor_codebook"] = torch.randn(VOCAB, SELECTOR_RANK, generator=gen)
    w["candidate_selector.successor_codebook"] = torch.randn(VOCAB, SELECTOR_RANK, generator=gen)
    w["candidate_selector.hidden_projection.weight"] = \
        torch.randn(SELECTOR_RANK, HIDDEN, generator=gen) / math.sqrt(HIDDEN)
    return w


def make_weights(gen):
    """Random drafter weights, named as in method.md §7. Projections ~ N(0, 1/fan_in) keep the
    activations O(1); norm weights near 1 but not equal, so that their gradients matter."""

    def proj(out_dim, in_dim):
        return torch.randn(out_dim, in_dim, generator=gen) / math.sqrt(in_dim)

    def norm(dim):
        return 1.0 + 0.1 * torch.randn(dim, generator=gen)

    w = {
        "fc.weight": proj(HIDDEN, len(LAYER_IDS) * HIDDEN),
        "hidden_norm.weight": norm(HIDDEN),
    }
    for i in range(DRAFTER_LAYERS):
        p = f"layers.{i}."
        w[p + "input_layernorm.weight"] = norm(HIDDEN)
        w[p + "self_attn.q_proj.weight"] = proj(HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.k_proj.weight"] = proj(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.v_proj.weight"] = proj(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.o_proj.weight"] = proj(HIDDEN, HEADS * HEAD_DIM)
        w[p + "self_attn.q_norm.weight"] = norm(HEAD_DIM)
        w[p + "self_attn.k_norm.weight"] = norm(HEAD_DIM)
        w[p + "post_attention_layernorm.weight"] = norm(HIDDEN)
        w[p + "mlp.gate_proj.weight"] = proj(INTERMEDIATE, HIDDEN)
        w[p + "mlp.up_proj.weight"] = proj(INTERMEDIATE, HIDDEN)
        w[p + "mlp.down_proj.weight"] = proj(HIDDEN, INTERMEDIATE)
    w["norm.weight"] = norm(HIDDEN)
    return w


def make_batch(gen):
    """Three packed documents. Loss mask: prompt tokens 0, assistant tokens 1, one hole in doc 1,
    doc 2 fully supervised (so its first row can be an anchor with no context at all)."""
    doc, pos, loss_mask = [], [], []
    masks = [
        [0] * 3 + [1] * 8,
        [0] * 5 + [1] * 4 + [0] + [1] * 7,
        [1] * 8,
    ]
    for d, n in enumerate(DOC_LENGTHS):
        doc += [d] * n
        pos += list(range(n))
        loss_mask += masks[d]
    t = len(doc)
    input_ids = torch.randint(0, VOCAB - 1, (t,), generator=gen)  # never the mask id
    features = torch.randn(t, len(LAYER_IDS) * HIDDEN, generator=gen)
    cu = [0]
    for n in DOC_LENGTHS:
        cu.append(cu[-1] + n)

    # method.md §3.1 eligibility: loss_mask[a] and loss_mask[a+1], a+1 in the same document.
    eligible = [
        a
        for a in range(t - 1)
        if loss_mask[a] and loss_mask[a + 1] and doc[a + 1] == doc[a]
    ]
    doc2_start, doc1_second_last, last_second_last = cu[2], cu[2] - 2, t - 2
    forced = {doc2_start, doc1_second_last, last_second_last}
    assert forced <= set(eligible)
    rest = [a for a in eligible if a not in forced]
    picks = torch.randperm(len(rest), generator=gen)[:4].tolist()
    anchors = sorted(forced | {rest[i] for i in picks}) + [-1, -1]  # two padding blocks
    return {
        "doc": doc,
        "pos": pos,
        "loss_mask": loss_mask,
        "input_ids": input_ids,
        "features": features,
        "cu_seqlens": cu,
        "anchors": anchors,
    }


def rms_norm(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def rope(x, positions):
    """NeoX rotate-half RoPE; x [N, heads, D], positions: list of N ints."""
    inv_freq = THETA ** (-torch.arange(0, HEAD_DIM, 2, dtype=DTYPE) / HEAD_DIM)
    angles = torch.tensor(positions, dtype=DTYPE)[:, None] * inv_freq[None, :]
    emb = torch.cat([angles, angles], dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    half = HEAD_DIM // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def block_inputs(batch):
    """method.md §3.2. A padding block: every slot MASK, positions 0..B-1."""
    tokens, positions = [], []
    for a in batch["anchors"]:
        if a < 0:
            tokens += [MASK_ID] * BLOCK
            positions += list(range(BLOCK))
        else:
            tokens += [int(batch["input_ids"][a])] + [MASK_ID] * (BLOCK - 1)
            positions += [batch["pos"][a] + k for k in range(BLOCK)]
    return tokens, positions


def attention_mask(batch):
    """method.md §3.3, element by element: [Q, T + Q] bool."""
    doc, anchors = batch["doc"], batch["anchors"]
    t, n = len(doc), len(anchors)
    mask = torch.zeros(n * BLOCK, t + n * BLOCK, dtype=torch.bool)
    for j, a in enumerate(anchors):
        if a < 0:
            continue  # padding: sees nothing
        for k in range(BLOCK):
            row = j * BLOCK + k
            for c in range(t):
                mask[row, c] = doc[c] == doc[a] and c < a
            for j2 in range(n):
                for k2 in range(BLOCK):
                    mask[row, t + j2 * BLOCK + k2] = j2 == j
    return mask


def attention(q, k, v, mask):
    """q [Q, Hq, D], k/v [T+Q, Hkv, D], mask [Q, T+Q] -> [Q, Hq, D]; rows with nothing visible
    give zeros."""
    group = HEADS // KV_HEADS
    k = k.repeat_interleave(group, dim=1)  # query head h reads kv head h // group
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(HEAD_DIM)
    any_visible = mask.any(dim=-1)[None, :, None]
    scores = scores.masked_fill(~mask[None], float("-inf"))
    scores = torch.where(any_visible, scores, torch.zeros_like(scores))
    probs = torch.softmax(scores, dim=-1) * any_visible
    return torch.einsum("hqk,khd->qhd", probs, v)


def block_conv(x, base, delta):
    """method.md §2.2, slot by slot: x [Q, H] in blocks of BLOCK rows, base [Kc, H], delta
    [Q, Kc, G]; out[k] = sum over taps t <= k, t < Kc of x[k - t] * (base[t] + delta[k, t, g])
    with g the channel's group."""
    rows = []
    for r in range(x.shape[0]):
        k = r % BLOCK
        acc = torch.zeros(HIDDEN, dtype=x.dtype)
        for t in range(min(k + 1, CONV_KERNEL)):
            coef = base[t] + delta[r, t].repeat_interleave(CONV_GROUP)
            acc = acc + x[r - t] * coef
        rows.append(acc)
    return torch.stack(rows)


def conv_in(w, prefix, h):
    """A sublayer's input convolved, and its output side's kernel offsets."""
    groups = HIDDEN // CONV_GROUP
    d = (h @ w[prefix + "kernel_projection.weight"].T).view(-1, 2, CONV_KERNEL, groups)
    return block_conv(h, w[prefix + "base_kernel"][0], d[:, 0]), d[:, 1]


def drafter_forward(w, features, embed, batch, dflash2=False):
    tokens, q_positions = block_inputs(batch)
    mask = attention_mask(batch)
    t = features.shape[0]
    x = embed[torch.tensor(tokens)]  # [Q, H]
    ctx = rms_norm(features @ w["fc.weight"].T, w["hidden_norm.weight"])  # [T, H]
    k_positions = batch["pos"] + q_positions
    for i in range(DRAFTER_LAYERS):
        p = f"layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"])
        if dflash2:
            h, out_delta = conv_in(w, p + "attention_conv.", h)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(-1, HEADS, HEAD_DIM)
        q = rope(rms_norm(q, w[p + "self_attn.q_norm.weight"]), q_positions)
        both = torch.cat([ctx, h], dim=0)
        k = (both @ w[p + "self_attn.k_proj.weight"].T).view(-1, KV_HEADS, HEAD_DIM)
        k = rope(rms_norm(k, w[p + "self_attn.k_norm.weight"]), k_positions)
        v = (both @ w[p + "self_attn.v_proj.weight"].T).view(-1, KV_HEADS, HEAD_DIM)
        assert k.shape[0] == t + x.shape[0]
        a = attention(q, k, v, mask).reshape(x.shape[0], HEADS * HEAD_DIM)
        o = a @ w[p + "self_attn.o_proj.weight"].T
        if dflash2:
            o = block_conv(o, w[p + "attention_conv.base_kernel"][1], out_delta)
        x = x + o
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"])
        if dflash2:
            h, out_delta = conv_in(w, p + "mlp_conv.", h)
        gate = F.silu(h @ w[p + "mlp.gate_proj.weight"].T)
        m = (gate * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
        if dflash2:
            m = block_conv(m, w[p + "mlp_conv.base_kernel"][1], out_delta)
        x = x + m
    return rms_norm(x, w["norm.weight"])


def labels_and_weights(batch):
    """method.md §3.4-3.5."""
    doc, ids, lm = batch["doc"], batch["input_ids"], batch["loss_mask"]
    t = len(doc)
    labels, weights = [], []
    for a in batch["anchors"]:
        for k in range(BLOCK):
            row = a + k
            if a < 0 or k == 0 or row >= t or doc[row] != doc[a]:
                labels.append(0)
                weights.append(0.0)
            else:
                labels.append(int(ids[row]))
                weights.append(lm[row] * math.exp(-(k - 1) / GAMMA))
    return torch.tensor(labels), torch.tensor(weights, dtype=DTYPE)


def dpace_weights(mask, ce):
    """D-PACE slot weights (docs/method.md, "Loss weighting"), slot by slot with Python loops:
    s_k = (1 - alpha) exp(-ce_k) + alpha on supervised slots (1 elsewhere), P_k = s_0 ... s_k, and
    the weight of a supervised slot k is sum over supervised j >= k of P_j."""
    out = []
    for j in range(0, len(mask), BLOCK):
        prefix, p = [], 1.0
        for k in range(BLOCK):
            if mask[j + k]:
                p *= (1.0 - DPACE_ALPHA) * math.exp(-ce[j + k]) + DPACE_ALPHA
            prefix.append(p)
        for k in range(BLOCK):
            out.append(sum(prefix[i] for i in range(k, BLOCK) if mask[j + i]) if mask[j + k] else 0.0)
    return torch.tensor(out, dtype=DTYPE)


def selector_loss(w, hidden, logits, labels, loss_w, batch):
    """method.md §2.2's selector loss, row by row: for each supervised row (slot k of block j),
    the top-K of its logits (the label replacing the K-th when absent), scored by logit plus
    <E_pred[token at slot k-1] * (W h), E_succ[candidate]>; cross-entropy toward the label,
    weighted as the unary loss. Returns the weighted sum and, per row, whether the best candidate
    is the label (and among the top-K)."""
    total = torch.zeros((), dtype=DTYPE)
    correct = []
    ids = batch["input_ids"]
    for r in range(hidden.shape[0]):
        if loss_w[r] <= 0:
            correct.append(False)
            continue
        j, k = divmod(r, BLOCK)
        predecessor = int(ids[batch["anchors"][j] + k - 1])
        top = torch.topk(logits[r].detach(), SELECTOR_TOP_K).indices.tolist()
        label = int(labels[r])
        contains = label in top
        if not contains:
            top[-1] = label
        target = top.index(label)
        context = w["candidate_selector.predecessor_codebook"][predecessor] * \
            (w["candidate_selector.hidden_projection.weight"] @ hidden[r])
        scores = torch.stack([logits[r, c] + (context * w["candidate_selector.successor_codebook"][c]).sum()
                              for c in top])
        total = total + loss_w[r] * (torch.logsumexp(scores, 0) - scores[target])
        correct.append(contains and int(scores.detach().argmax()) == target)
    return total, torch.tensor(correct)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    out = parser.parse_args().out
    os.makedirs(os.path.join(out, "target"), exist_ok=True)
    os.makedirs(os.path.join(out, "drafter"), exist_ok=True)
    gen = torch.Generator().manual_seed(SEED)

    weights = make_weights(gen)
    embed = torch.randn(VOCAB, HIDDEN, generator=gen)
    lm_head = torch.randn(VOCAB, HIDDEN, generator=gen) / math.sqrt(HIDDEN)
    batch = make_batch(gen)

    w64 = {k: v.to(DTYPE).requires_grad_(True) for k, v in weights.items()}
    features = batch["features"].to(DTYPE).requires_grad_(True)
    hidden = drafter_forward(w64, features, embed.to(DTYPE), batch)
    labels, loss_w = labels_and_weights(batch)
    logits = hidden @ lm_head.to(DTYPE).T
    ce = F.cross_entropy(logits, labels, reduction="none")
    numerator = (loss_w * ce).sum()
    # D-PACE: weights from the detached per-slot CE on the decay's support.
    dpace_w = dpace_weights((loss_w > 0).tolist(), ce.detach().tolist())
    dpace_numerator = (dpace_w * ce).sum()
    leaves = [features] + list(w64.values())
    dpace_grads = torch.autograd.grad(dpace_numerator, leaves, retain_graph=True)
    numerator.backward()

    supervised = loss_w > 0
    slots = torch.arange(len(loss_w)) % BLOCK
    correct = (logits.argmax(-1) == labels) & supervised
    expected = {
        "hidden": hidden.detach().float(),
        "weights": loss_w.float(),
        "numerator": numerator.detach().float(),
        "denominator": loss_w.sum().float(),
        "slot_total": torch.bincount(slots[supervised], minlength=BLOCK),
        "slot_correct": torch.bincount(slots[correct], minlength=BLOCK),
        "grad.features": features.grad.float(),
    }
    for name, p in w64.items():
        expected["grad." + name] = p.grad.float()
    expected["dpace.weights"] = dpace_w.float()
    expected["dpace.numerator"] = dpace_numerator.detach().float()
    expected["dpace.denominator"] = dpace_w.sum().float()
    expected["dpace.grad.features"] = dpace_grads[0].float()
    for name, g in zip(w64, dpace_grads[1:]):
        expected["dpace.grad." + name] = g.float()

    # DFlash2: the same weights and batch, with convolutions and a selector.
    extra = make_dflash2_weights(gen)
    w2 = {k: v.to(DTYPE).requires_grad_(True) for k, v in {**weights, **extra}.items()}
    features2 = batch["features"].to(DTYPE).requires_grad_(True)
    hidden2 = drafter_forward(w2, features2, embed.to(DTYPE), batch, dflash2=True)
    logits2 = hidden2 @ lm_head.to(DTYPE).T
    unary2 = (loss_w * F.cross_entropy(logits2, labels, reduction="none")).sum()
    selector2, correct2 = selector_loss(w2, hidden2, logits2, labels, loss_w, batch)
    numerator2 = unary2 + selector2
    numerator2.backward()
    expected["dflash2.hidden"] = hidden2.detach().float()
    expected["dflash2.numerator"] = numerator2.detach().float()
    expected["dflash2.slot_correct"] = torch.bincount(slots[correct2 & supervised],
                                                      minlength=BLOCK)
    expected["dflash2.grad.features"] = features2.grad.float()
    for name, p in w2.items():
        expected["dflash2.grad." + name] = p.grad.float()
    os.makedirs(os.path.join(out, "drafter2"), exist_ok=True)
    with open(os.path.join(out, "drafter2", "config.json"), "w") as f:
        json.dump(drafter2_config(), f, indent=2)
    save_file({**weights, **extra}, os.path.join(out, "drafter2", "model.safetensors"),
              metadata={"format": "pt"})

    with open(os.path.join(out, "target", "config.json"), "w") as f:
        json.dump(target_config(), f, indent=2)
    with open(os.path.join(out, "drafter", "config.json"), "w") as f:
        json.dump(drafter_config(), f, indent=2)
    save_file(weights, os.path.join(out, "drafter", "model.safetensors"), metadata={"format": "pt"})
    save_file({"embed_tokens": embed, "lm_head": lm_head}, os.path.join(out, "frozen.safetensors"))
    save_file(
        {
            "features": batch["features"],
            "input_ids": batch["input_ids"],
            "positions": torch.tensor(batch["pos"]),
            "cu_seqlens": torch.tensor(batch["cu_seqlens"], dtype=torch.int32),
            "anchors": torch.tensor(batch["anchors"]),
            "loss_mask": torch.tensor(batch["loss_mask"]),
        },
        os.path.join(out, "batch.safetensors"),
        metadata={"gamma": repr(GAMMA), "dpace_alpha": repr(DPACE_ALPHA)},
    )
    save_file(expected, os.path.join(out, "expected.safetensors"))
    print(f"numerator {numerator.item():.6f} denominator {loss_w.sum().item():.6f}")


if __name__ == "__main__":
    main()
