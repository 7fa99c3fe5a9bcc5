"""PyTorch reference of one DFlash drafter training step (GPU targets), run in the same
device run as the project's step (scripts/bench/drafter_step.cc; drafter_step.sh runs both).

The same drafter and loss as method.md §2-4, written the way a competent PyTorch user would:
  - fp32 parameters (master weights), bf16 compute by explicit casts of every weight at use, as
    the project's DrafterModel does (`.to(bf16)` of each parameter inside the forward, so the
    gradients arrive in fp32); RMSNorm in fp32 then cast back (HF style), NeoX RoPE with fp32
    angles cast to the compute dtype;
  - attention: FlexAttention with the DFlash BlockMask (method.md §3.3, the mask_mod of
    dflash_attn_flex.py), q [1, Hq, n*B, D], k/v [1, Hkv, T + n*B, D], enable_gqa;
  - loss: only rows with weight > 0 go to the lm_head (as ours); chunked cross-entropy over the
    frozen bf16 lm_head with the gradient computed in the forward, as Liger's fused linear
    cross-entropy does (--loss fused, the default since 2026-12-08): per chunk of rows one logits
    GEMM, softmax - onehot, one dHidden GEMM, the [rows, H] gradient kept for the backward, which
    only scales it (at most one chunk of logits exists at once); --loss recompute is the earlier
    reference, which keeps the per-row logsumexp and recomputes each chunk's logits in the
    backward (three GEMMs per chunk against two); decayed weights exp(-(k-1)/gamma); loss =
    numerator / weight sum, backward;
  - clip_grad_norm_(1.0), torch.optim.AdamW(fused=True), betas 0.9/0.999, eps 1e-8, wd 0,
    constant lr 6e-4 (ours runs the same schedule in this benchmark).
DFlash2 (meta.json kind dflash2, from drafter_step --kind dflash2; method.md §2.2): each layer's
grouped dynamic causal convolutions around its attention and its MLP (as tensor ops over the
blocks' slots), and the selector loss beside the unary one: each supervised row's unary top-K (one
no-grad pass over the lm_head with --loss recompute; read from the fused loss's own chunks of
logits with --loss fused), the label replacing the K-th where absent, scored by
the candidate's logit plus the codebooks' term; its K-way cross-entropy weighted as the unary
loss, times loss.selector_alpha.
--compile full (default): torch.compile (inductor, dynamic=False) of the decoder layer with
flex_attention inside, of the context projection, of the final norm and of the two chunk
functions of the loss; --compile flex: only flex_attention compiled (the issue's minimum);
--compile none: eager (the CPU smoke test; --attention dense there uses a dense masked softmax).
Every batch-dependent tensor (block tokens, rope tables, the BlockMask, labels and weights) is
built inside the timed step, as ours does in AddMicroBatch.

Inputs (written by drafter_step --dump-dir / --export-weights): DIR/meta.json,
DIR/batch.safetensors, WEIGHTS/drafter/model.safetensors (F32, method.md §7 names),
WEIGHTS/frozen.safetensors (embed_tokens, lm_head). Prints one JSON line (the same keys as
drafter_step's) and, with --ours, the cross-check of the first step's loss (same weights, same
batch) and the ratios against the issue's targets.
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

LAYER_NAMES = [
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
]


def rms_norm(x, w, eps):
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return x32.to(dtype) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rope(x, cos, sin):  # x [N, heads, D], cos/sin [N, D]
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def dense_attention(q, k, v, mask, scale):
    """q [1, Hq, Q, D], k/v [1, Hkv, K, D], mask [Q, K] bool; rows seeing nothing give zeros."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    any_visible = mask.any(-1)[:, None]
    probs = torch.softmax(torch.where(any_visible, scores, torch.zeros_like(scores)), -1)
    probs = (probs * any_visible).to(q.dtype)
    return probs @ v


class Attention:
    def __init__(self, kind, compiled):
        self.kind = kind
        self.flex = torch.compile(flex_attention, dynamic=False) if compiled else flex_attention

    def __call__(self, q, k, v, mask, scale):
        if self.kind == "dense":
            return dense_attention(q, k, v, mask, scale)
        return self.flex(q, k, v, block_mask=mask, scale=scale, enable_gqa=True)


def block_conv(x, delta, base, block, group):
    """DFlash2's grouped dynamic causal convolution over each block's slots (method.md §2.2):
    x [Q, H], delta [Q, Kc, G], base [Kc, H]; out[k] = sum over taps t <= k, t < Kc of
    x[k - t] * (base[t] + delta[k, t, g]) with g the channel's group."""
    q, h = x.shape
    kernel, groups = base.shape[0], h // group
    xb = x.view(q // block, block, groups, group)
    db = delta.reshape(q // block, block, kernel, groups)
    out = None
    for t in range(kernel):
        shifted = xb if t == 0 else F.pad(xb[:, :block - t], (0, 0, 0, 0, t, 0))
        coef = base[t].to(x.dtype).view(1, 1, groups, group) + db[:, :, t, :, None]
        out = shifted * coef if out is None else out + shifted * coef
    return out.reshape(q, h)


def conv_in(h, base, proj, block, group):
    """A sublayer's input convolved (base[0], the projection's first half) and its output side's
    kernel offsets."""
    kernel, groups = base.shape[1], h.shape[1] // group
    delta = (h @ proj.t()).view(h.shape[0], 2, kernel, groups)
    return block_conv(h, delta[:, 0], base[0], block, group), delta[:, 1]


def make_layer(cfg, attention):
    hq, hkv, d, eps = cfg["hq"], cfg["hkv"], cfg["d"], cfg["eps"]
    block, group = cfg.get("block"), cfg.get("conv_group")
    scale = d ** -0.5

    def layer(x, ctx, w, q_cos, q_sin, k_cos, k_sin, mask, conv=()):
        """conv (DFlash2): the attention's and the MLP's base kernels and projections."""
        dt = x.dtype
        (in_norm, q_proj, k_proj, v_proj, o_proj, q_norm, k_norm, post_norm, gate, up,
         down) = [p.to(dt) for p in w]
        conv = [p.to(dt) for p in conv]
        q_rows, kv_rows = x.shape[0], ctx.shape[0] + x.shape[0]
        h = rms_norm(x, in_norm, eps)
        if conv:
            h, out_delta = conv_in(h, conv[0], conv[1], block, group)
        q = rms_norm((h @ q_proj.t()).view(q_rows, hq, d), q_norm, eps)
        q = rope(q, q_cos, q_sin)
        kv_in = torch.cat([ctx, h], 0)
        k = rms_norm((kv_in @ k_proj.t()).view(kv_rows, hkv, d), k_norm, eps)
        k = rope(k, k_cos, k_sin)
        v = (kv_in @ v_proj.t()).view(kv_rows, hkv, d)
        a = attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                      mask, scale)
        a = a[0].transpose(0, 1).reshape(q_rows, hq * d)
        o = a @ o_proj.t()
        if conv:
            o = block_conv(o, out_delta, conv[0][1], block, group)
        y = x + o
        h = rms_norm(y, post_norm, eps)
        if conv:
            h, out_delta = conv_in(h, conv[2], conv[3], block, group)
        m = (F.silu(h @ gate.t()) * (h @ up.t())) @ down.t()
        if conv:
            m = block_conv(m, out_delta, conv[2][1], block, group)
        return y + m

    return layer


def make_ctx(eps):
    def ctx_fn(features, fc, hidden_norm, dt):
        return rms_norm(features.to(dt) @ fc.to(dt).t(), hidden_norm.to(dt), eps)

    return ctx_fn


def ce_chunk_forward(h, lm_head, labels, w):
    logits = (h.to(lm_head.dtype) @ lm_head.t()).float()
    lse = torch.logsumexp(logits, -1)
    target = logits.gather(1, labels[:, None]).squeeze(1)
    return ((lse - target) * w).sum(), lse


def ce_chunk_backward(h, lm_head, labels, lse, scale):
    logits = (h.to(lm_head.dtype) @ lm_head.t()).float()
    p = torch.exp(logits - lse[:, None])
    onehot = torch.arange(p.shape[1], device=p.device)[None, :] == labels[:, None]
    g = ((p - onehot.float()) * scale[:, None]).to(lm_head.dtype)
    return (g @ lm_head).to(h.dtype)


class ChunkedCE(torch.autograd.Function):
    """sum_i w_i CE(h_i lm_head^T, label_i), one chunk of logits at a time, recomputed in the
    backward (only the logsumexp per row is kept)."""

    fwd = staticmethod(ce_chunk_forward)
    bwd = staticmethod(ce_chunk_backward)

    @staticmethod
    def forward(ctx, hidden, lm_head, labels, weights, chunk):
        num = torch.zeros((), device=hidden.device, dtype=torch.float32)
        lse = torch.empty(hidden.shape[0], device=hidden.device, dtype=torch.float32)
        for s in range(0, hidden.shape[0], chunk):
            n, l = ChunkedCE.fwd(hidden[s:s + chunk], lm_head, labels[s:s + chunk],
                                 weights[s:s + chunk])
            num = num + n
            lse[s:s + chunk] = l
        ctx.save_for_backward(hidden, lm_head, labels, weights, lse)
        ctx.chunk = chunk
        return num

    @staticmethod
    def backward(ctx, g):
        hidden, lm_head, labels, weights, lse = ctx.saved_tensors
        scale = weights * g.float()
        grad = torch.empty_like(hidden)
        c = ctx.chunk
        for s in range(0, hidden.shape[0], c):
            grad[s:s + c] = ChunkedCE.bwd(hidden[s:s + c], lm_head, labels[s:s + c], lse[s:s + c],
                                          scale[s:s + c])
        return grad, None, None, None, None


def ce_rows_chunk(h, lm_head, labels, top_k: int):
    """One chunk of the fused loss: each row's cross-entropy, its gradient in h at weight 1
    ((softmax - onehot) lm_head, in h's dtype) and, for DFlash2's selector, the row's top-k
    (top_k 0: none)."""
    logits = (h.to(lm_head.dtype) @ lm_head.t()).float()
    lse = torch.logsumexp(logits, -1)
    ce = lse - logits.gather(1, labels[:, None]).squeeze(1)
    cand = torch.topk(logits, top_k, -1).indices if top_k else None
    onehot = torch.arange(logits.shape[1], device=logits.device)[None, :] == labels[:, None]
    g = (torch.exp(logits - lse[:, None]) - onehot.float()).to(lm_head.dtype)
    return ce, (g @ lm_head).to(h.dtype), cand


class FusedRowsCE(torch.autograd.Function):
    """CE(h_i lm_head^T, label_i) for every row i, differentiable in hidden, with the gradient
    computed in the forward one chunk at a time (Liger's fused linear cross-entropy): two GEMMs
    per chunk; the backward scales the kept [rows, H] gradient by each row's incoming weight.
    Returns (ce [rows] fp32, top-k [rows, top_k] int64, empty for top_k 0; no gradient)."""

    fn = staticmethod(ce_rows_chunk)

    @staticmethod
    def forward(ctx, hidden, lm_head, labels, chunk, top_k):
        rows = hidden.shape[0]
        ce = torch.empty(rows, device=hidden.device, dtype=torch.float32)
        dh = torch.empty_like(hidden)
        cand = torch.empty((rows, top_k), device=hidden.device, dtype=torch.long)
        for s in range(0, rows, chunk):
            c, d, k = FusedRowsCE.fn(hidden[s:s + chunk], lm_head, labels[s:s + chunk], top_k)
            ce[s:s + chunk] = c
            dh[s:s + chunk] = d
            if top_k:
                cand[s:s + chunk] = k
        ctx.save_for_backward(dh)
        ctx.mark_non_differentiable(cand)
        return ce, cand

    @staticmethod
    def backward(ctx, g_ce, g_cand):
        (dh,) = ctx.saved_tensors
        return (dh.float() * g_ce.float()[:, None]).to(dh.dtype), None, None, None, None


CONV_NAMES = ["attention_conv.base_kernel", "attention_conv.kernel_projection.weight",
              "mlp_conv.base_kernel", "mlp_conv.kernel_projection.weight"]
SELECTOR_NAMES = ["candidate_selector.predecessor_codebook",
                  "candidate_selector.successor_codebook",
                  "candidate_selector.hidden_projection.weight"]


def param_names(num_layers, dflash2=False):
    """The drafter's parameters (method.md §7 names; DFlash2's convolutions and selector, §2.2)."""
    layer_names = LAYER_NAMES + (CONV_NAMES if dflash2 else [])
    return (["fc.weight", "hidden_norm.weight"] +
            [f"layers.{i}.{n}" for i in range(num_layers) for n in layer_names] + ["norm.weight"] +
            (SELECTOR_NAMES if dflash2 else []))


def selector_numerator(hidden, lm_head, labels, predecessors, weights, sel, top_k, chunk,
                       cand=None):
    """DFlash2's selector loss (method.md §2.2) on the supervised rows: each row's unary top-K
    (no gradient; `cand` when the loss's pass gave it, else one more chunked pass; the label
    replacing the K-th where absent), scored by its logit (differentiable in hidden) plus
    <E_pred[predecessor] * (W h), E_succ[candidate]>; the K-way cross-entropy toward the label,
    weighted as the unary loss."""
    if cand is None:
        with torch.no_grad():
            cand = torch.cat([
                torch.topk((hidden[s:s + chunk].to(lm_head.dtype) @ lm_head.t()).float(), top_k,
                           -1).indices for s in range(0, hidden.shape[0], chunk)])
    cand = cand.clone()
    match = cand == labels[:, None]
    contains = match.any(1)
    cand[:, -1] = torch.where(contains, cand[:, -1], labels)
    target = torch.where(contains, match.long().argmax(1), torch.full_like(labels, top_k - 1))
    unary = torch.einsum("rh,rkh->rk", hidden.to(lm_head.dtype), lm_head[cand]).float()
    pred_book, succ_book, proj = sel
    projected = (hidden @ proj.to(hidden.dtype).t()).float()
    context = pred_book[predecessors].float() * projected
    scores = unary + (succ_book[cand].float() * context[:, None, :]).sum(-1)
    ce = torch.logsumexp(scores, 1) - scores.gather(1, target[:, None]).squeeze(1)
    return (ce * weights).sum()


def dpace_weights(hidden, lm_head, labels, decay_weights, block, alpha, chunk, row_ce=None):
    """D-PACE's slot weights (method.md, "Loss weighting"; arXiv 2605.18810) in place of the decay:
    over the supervised slots m (decay weight > 0) of each block, c_k = exp(-CE_k) (no gradient),
    s_k = alpha + (1 - alpha) c_k, P_k = prod_{j <= k} s_j (s = 1 where m = 0), and
    w_k = m_k * sum_{j >= k} m_j P_j. `row_ce`: the supervised rows' CE in row order when the
    loss's own pass gave it; else one more chunked no-grad pass over the lm_head."""
    m = (decay_weights > 0).float()
    rows = torch.nonzero(m > 0).squeeze(1)
    ce = torch.zeros_like(m)
    if row_ce is not None:
        ce[rows] = row_ce.detach()
    else:
        with torch.no_grad():
            for s in range(0, rows.shape[0], chunk):
                r = rows[s:s + chunk]
                logits = (hidden[r].to(lm_head.dtype) @ lm_head.t()).float()
                ce[r] = (torch.logsumexp(logits, -1) -
                         logits.gather(1, labels[r][:, None]).squeeze(1))
    m, ce = m.view(-1, block), ce.view(-1, block)
    smooth = torch.where(m > 0, alpha + (1 - alpha) * torch.exp(-ce), torch.ones_like(m))
    suffix = (torch.cumprod(smooth, 1) * m).flip(1).cumsum(1).flip(1)
    return (suffix * m).view(-1)


class ReferenceStep:
    """The drafter's forward and weighted loss on one packed micro-batch (method.md §3.1-3.5).
    geo: hq, hkv, d, eps, block_size, num_layers, gamma, mask_token_id, rope_theta, dtype (the
    compute dtype); params: name -> fp32 Parameter (param_names order); embed / lm_head: the frozen
    target tensors. A batch is a dict of tensors on `dev`: input_ids, positions, cu_seqlens,
    anchors (-1 = padding block), loss_mask, features."""

    def __init__(self, geo, params, embed, lm_head, dev, use_flex, chunk_rows, all_rows=False,
                 loss="fused"):
        self.cfg = dict(hq=geo["hq"], hkv=geo["hkv"], d=geo["d"], eps=geo["eps"],
                        block=geo["block_size"], conv_group=geo.get("conv_group_size"))
        self.dflash2 = geo.get("kind") == "dflash2"
        self.top_k, self.selector_alpha = geo.get("selector_top_k"), geo.get("selector_alpha")
        self.dpace_alpha = geo.get("dpace_alpha") if geo.get("weighting") == "dpace" else None
        self.B, self.L, self.gamma = geo["block_size"], geo["num_layers"], geo["gamma"]
        self.mask_id, self.cdt = geo["mask_token_id"], geo["dtype"]
        self.params, self.embed, self.lm_head = params, embed, lm_head
        self.layer_w = [tuple(params[f"layers.{i}.{n}"] for n in LAYER_NAMES)
                        for i in range(self.L)]
        self.conv_w = [tuple(params[f"layers.{i}.{n}"] for n in CONV_NAMES) if self.dflash2 else ()
                       for i in range(self.L)]
        self.selector_w = tuple(params[n] for n in SELECTOR_NAMES) if self.dflash2 else ()
        self.dev, self.use_flex, self.chunk_rows = dev, use_flex, chunk_rows
        # all_rows: the loss over every block row (weight 0 where there is none) rather than only
        # the weighted ones: the same sum, in a shape that does not change between batches.
        self.all_rows = all_rows
        self.loss = loss  # "fused" (gradient in the forward) or "recompute" (module docstring)
        d = geo["d"]
        self.inv_freq = geo["rope_theta"] ** (
            -torch.arange(0, d, 2, dtype=torch.float32, device=dev) / d)

    def build(self, mode):
        """The step's functions: eager ("none"), flex_attention compiled ("flex") or every piece
        compiled ("full")."""
        attention = Attention("flex" if self.use_flex else "dense", compiled=(mode == "flex"))
        layer = make_layer(self.cfg, attention)
        ctx_fn = make_ctx(self.cfg["eps"])
        eps = self.cfg["eps"]
        norm_fn = lambda x, wn: rms_norm(x, wn.to(x.dtype), eps)  # noqa: E731
        fwd, bwd, rows_fn = ce_chunk_forward, ce_chunk_backward, ce_rows_chunk
        if mode == "full":
            layer = torch.compile(layer, dynamic=False)
            ctx_fn = torch.compile(ctx_fn, dynamic=False)
            norm_fn = torch.compile(norm_fn, dynamic=False)
            fwd = torch.compile(fwd, dynamic=False)
            bwd = torch.compile(bwd, dynamic=False)
            rows_fn = torch.compile(rows_fn, dynamic=False)
        return layer, ctx_fn, norm_fn, fwd, bwd, rows_fn

    def rope_tables(self, pos):
        ang = pos.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat([ang, ang], -1)
        return emb.cos().to(self.cdt), emb.sin().to(self.cdt)

    def prepare(self, batch):
        """Everything the step derives from the batch (method.md §3.1-3.5)."""
        B, mask_id, gamma, dev = self.B, self.mask_id, self.gamma, self.dev
        ids, pos, anchors = batch["input_ids"], batch["positions"], batch["anchors"]
        t, n = ids.shape[0], anchors.shape[0]
        cu = batch["cu_seqlens"].long()
        doc = torch.repeat_interleave(torch.arange(cu.shape[0] - 1, device=dev), cu[1:] - cu[:-1],
                                      output_size=t)
        valid = anchors >= 0
        a = anchors.clamp_min(0)
        k = torch.arange(B, device=dev)
        slot0 = torch.where(valid, ids[a], torch.full_like(a, mask_id))
        tokens = torch.cat([slot0[:, None], torch.full((n, B - 1), mask_id, device=dev)], 1).view(-1)
        base = torch.where(valid, pos[a], torch.zeros_like(a))
        q_cos, q_sin = self.rope_tables((base[:, None] + k[None, :]).view(-1))
        c_cos, c_sin = self.rope_tables(pos)
        k_cos, k_sin = torch.cat([c_cos, q_cos]), torch.cat([c_sin, q_sin])
        row = a[:, None] + k[None, :]
        at = row.clamp_max(t - 1).view(-1)
        labels = ids[at]
        same = (doc[at].view(n, B) == doc[a][:, None]) & (row < t) & valid[:, None]
        decay = torch.exp(-(k.float() - 1) / gamma) * (k >= 1).float()
        weights = (decay[None, :] * same.float() * (batch["loss_mask"][at].view(n, B) != 0).float()
                   ).view(-1)
        q_len, kv_len = n * B, t + n * B
        doc_a = doc[a]

        def mask_mod(b, h, q_idx, kv_idx):
            j = q_idx // B
            anchor = anchors[j]
            ctx_row = torch.clamp(kv_idx, max=t - 1)
            in_ctx = (kv_idx < t) & (doc[ctx_row] == doc_a[j]) & (kv_idx < anchor)
            in_blk = (kv_idx >= t) & ((kv_idx - t) // B == j)
            return (in_ctx | in_blk) & (anchor >= 0)

        if self.use_flex:
            mask = create_block_mask(mask_mod, 1, None, q_len, kv_len, device=dev,
                                     _compile=dev.type == "cuda")
        else:
            qi = torch.arange(q_len, device=dev)[:, None]
            ki = torch.arange(kv_len, device=dev)[None, :]
            mask = mask_mod(None, None, qi, ki)
        # DFlash2's selector: slot k's predecessor is the true token at slot k - 1.
        predecessors = ids[(row - 1).clamp(0, t - 1).view(-1)]
        return tokens, q_cos, q_sin, k_cos, k_sin, mask, labels, weights, predecessors

    def numerator(self, batch, fns):
        """(sum_i w_i CE_i, differentiable; sum_i w_i) of one micro-batch (the trainer's
        DrafterLoss numerator and denominator)."""
        layer, ctx_fn, norm_fn, fwd, bwd, rows_fn = fns
        ChunkedCE.fwd, ChunkedCE.bwd = staticmethod(fwd), staticmethod(bwd)
        FusedRowsCE.fn = staticmethod(rows_fn)
        (tokens, q_cos, q_sin, k_cos, k_sin, mask, labels, weights,
         predecessors) = self.prepare(batch)
        x = self.embed[tokens].to(self.cdt)
        ctx = ctx_fn(batch["features"], self.params["fc.weight"],
                     self.params["hidden_norm.weight"], self.cdt)
        for i in range(self.L):
            x = layer(x, ctx, self.layer_w[i], q_cos, q_sin, k_cos, k_sin, mask, self.conv_w[i])
        hidden = norm_fn(x, self.params["norm.weight"])
        if self.loss == "fused":
            # D-PACE's weights live where the decay's do, so the rows are known before the CE.
            rows = (torch.arange(weights.shape[0], device=weights.device) if self.all_rows
                    else torch.nonzero(weights > 0).squeeze(1))
            ce, cand = FusedRowsCE.apply(hidden[rows], self.lm_head, labels[rows],
                                         self.chunk_rows, self.top_k if self.dflash2 else 0)
            if self.dpace_alpha is not None:
                sup = weights[rows] > 0  # all_rows: the CE of the unsupervised rows is not used
                weights = dpace_weights(hidden, self.lm_head, labels, weights, self.B,
                                        self.dpace_alpha, self.chunk_rows, row_ce=ce[sup])
            num = (ce * weights[rows]).sum()
            if self.dflash2:
                sup = torch.nonzero(weights[rows] > 0).squeeze(1)
                r = rows[sup]
                num = num + self.selector_alpha * selector_numerator(
                    hidden[r], self.lm_head, labels[r], predecessors[r], weights[r],
                    self.selector_w, self.top_k, self.chunk_rows, cand=cand[sup])
            return num, weights.sum()
        if self.dpace_alpha is not None:
            weights = dpace_weights(hidden, self.lm_head, labels, weights, self.B, self.dpace_alpha,
                                    max(1, self.chunk_rows // 2))
        if self.all_rows:
            num = ChunkedCE.apply(hidden, self.lm_head, labels, weights, self.chunk_rows)
        else:
            rows = torch.nonzero(weights > 0).squeeze(1)
            num = ChunkedCE.apply(hidden[rows], self.lm_head, labels[rows], weights[rows],
                                  self.chunk_rows)
        if self.dflash2:
            rows = torch.nonzero(weights > 0).squeeze(1)
            num = num + self.selector_alpha * selector_numerator(
                hidden[rows], self.lm_head, labels[rows], predecessors[rows], weights[rows],
                self.selector_w, self.top_k, self.chunk_rows)
        return num, weights.sum()


def kernel_category(name):
    """common/device/kernel_profile.cc's KernelCategory, the same rules."""
    s = name.lower()
    has = lambda *parts: any(p in s for p in parts)  # noqa: E731
    if has("memcpy", "memset"):
        return "copy"
    if has("fusedce", "cross_entropy", "log_softmax", "logsumexp"):
        return "loss"
    if has("attn", "flash_", "flashattn", "triton_tem"):
        return "attention"
    if has("gemm", "nvjet", "cutlass", "xmma", "cublas", "splitk"):
        return "gemm"
    if has("adam", "multi_tensor", "foreach"):
        return "optimizer"
    return "elementwise/other"


def profile_kernels(work, top=40):
    """Device time of the kernels, memcpys and memsets `work` launches (as ProfileKernels)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as p:
        t0 = time.perf_counter()
        work()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3
    by_name, cats, spans = {}, {}, []
    for e in p.profiler.kineto_results.events():
        if e.device_type() != DeviceType.CUDA or e.is_user_annotation() or e.name().endswith(" Sync"):
            continue
        ms = e.duration_ns() / 1e6
        c, t = by_name.get(e.name(), (0, 0.0))
        by_name[e.name()] = (c + 1, t + ms)
        cats[kernel_category(e.name())] = cats.get(kernel_category(e.name()), 0.0) + ms
        spans.append((e.start_ns(), e.end_ns()))
    spans.sort()
    busy, (b, en) = 0, spans[0]
    for s0, e0 in spans:
        if s0 > en:
            busy, b, en = busy + en - b, s0, e0
        else:
            en = max(en, e0)
    busy += en - b
    kernel_ms = sum(cats.values())
    kernels = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    out = {"wall_ms": wall, "busy_ms": busy / 1e6, "kernel_ms": kernel_ms,
           "launches": len(spans), "category_ms": cats,
           "top": [{"name": n[:160], "count": c, "ms": t} for n, (c, t) in kernels]}
    lines = [f"reference step: wall {wall:.2f} ms, device busy {busy / 1e6:.2f} ms, kernels "
             f"{kernel_ms:.2f} ms in {len(spans)} launches", "| category | ms | share of kernel time |",
             "|---|---|---|"]
    lines += [f"| {c} | {t:.2f} | {100 * t / kernel_ms:.1f}% |" for c, t in sorted(cats.items())]
    lines += ["| kernel | launches | ms |", "|---|---|---|"]
    lines += [f"| {n[:110]} | {c} | {t:.2f} |" for n, (c, t) in kernels]
    print("\n".join(lines), file=sys.stderr)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump-dir", required=True, help="drafter_step --dump-dir")
    ap.add_argument("--weights", required=True, help="drafter_step --export-weights")
    ap.add_argument("--ours", help="drafter_step --json of the same geometry")
    ap.add_argument("--json", help="write this process's JSON line here")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--chunk-rows", type=int, default=1024)
    ap.add_argument("--compile", choices=["full", "flex", "none"], default="full")
    ap.add_argument("--loss", choices=["fused", "recompute"], default="fused",
                    help="fused: the CE's gradient computed in the forward (two GEMMs per chunk); "
                         "recompute: logits recomputed in the backward (three), the reference "
                         "before 2026-12-08")
    ap.add_argument("--attention", choices=["flex", "dense"], default="flex")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--profile", type=int, default=0,
                    help="1: profile one more step's device kernels by category (as drafter_step "
                         "--profile 1), a table on stderr and \"profile\" in the JSON")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    t_setup = time.perf_counter()

    with open(os.path.join(args.dump_dir, "meta.json")) as f:
        meta = json.load(f)
    cdt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[
        meta["dtype"]]
    geo = dict(hq=meta["num_attention_heads"], hkv=meta["num_key_value_heads"],
               d=meta["head_dim"], eps=meta["rms_norm_eps"], block_size=meta["block_size"],
               num_layers=meta["num_layers"], gamma=meta["gamma"],
               mask_token_id=meta["mask_token_id"], rope_theta=meta["rope_theta"], dtype=cdt,
               kind=meta.get("kind", "dflash"), conv_group_size=meta.get("conv_group_size"),
               selector_top_k=meta.get("selector_top_k"),
               selector_alpha=meta.get("selector_alpha", 1.0),
               weighting=meta.get("weighting", "decay"), dpace_alpha=meta.get("dpace_alpha", 0.5))

    batch = {k: v.to(dev) for k, v in load_file(os.path.join(args.dump_dir, "batch.safetensors")).items()}
    frozen = load_file(os.path.join(args.weights, "frozen.safetensors"))
    embed = frozen["embed_tokens"].to(dev)
    lm_head = frozen["lm_head"].to(dev)
    del frozen
    w = load_file(os.path.join(args.weights, "drafter", "model.safetensors"))
    params = {n: torch.nn.Parameter(w[n].to(dev, torch.float32))
              for n in param_names(geo["num_layers"], geo["kind"] == "dflash2")}
    del w
    plist = list(params.values())
    opt = torch.optim.AdamW(plist, lr=meta["lr"], betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                            fused=cuda)
    clip = meta["clip_norm"]

    compile_mode = args.compile
    ref = ReferenceStep(geo, params, embed, lm_head, dev, args.attention == "flex",
                        args.chunk_rows, loss=args.loss)
    build = ref.build

    def step(fns):
        # Every batch-dependent tensor is built inside the timed step (ReferenceStep.prepare).
        num, wsum = ref.numerator(batch, fns)
        loss = num / wsum
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(plist, clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach(), gn

    fns = build(compile_mode)
    note = ""
    losses, ms, gn0 = [], [], None
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        try:
            loss, gn = step(fns)
        except Exception as e:  # noqa: BLE001  a compile failure: say so, fall back
            if i > 0 or compile_mode == "none":
                raise
            note = f"--compile {compile_mode} failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); fell back to --compile flex"
            print(note, file=sys.stderr)
            compile_mode = "flex"
            opt.zero_grad(set_to_none=True)
            fns = build(compile_mode)
            loss, gn = step(fns)
        if cuda:
            torch.cuda.synchronize()
        elapsed = (time.perf_counter() - t0) * 1e3
        losses.append(loss.item())
        if i == 0:
            gn0 = gn.item()
        if i >= args.warmup:
            ms.append(elapsed)
    srt = sorted(ms)
    med = srt[len(srt) // 2]
    # The same number of steps back to back, one synchronization at the end: what a run's steps
    # take (drafter_step's ms_pipelined, where its optimizer step overlaps the next forward).
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step(fns)
    if cuda:
        torch.cuda.synchronize()
    pipelined = (time.perf_counter() - t0) * 1e3 / args.steps
    t = batch["input_ids"].shape[0]
    n_elem = sum(p.numel() for p in plist)
    train_static = n_elem * 16
    frozen_b = embed.nbytes + (0 if lm_head.data_ptr() == embed.data_ptr() else lm_head.nbytes)
    peak = torch.cuda.max_memory_allocated(dev) if cuda else 0
    # After the peak was read: one more step, profiled.
    prof = profile_kernels(lambda: step(fns)) if args.profile and cuda else None
    out = {
        "impl": f"pytorch{' dflash2' if geo['kind'] == 'dflash2' else ''}"
        f"{' dpace' if geo['weighting'] == 'dpace' else ''} ({compile_mode}, {args.loss} loss)", "tokens": t, "anchors": batch["anchors"].shape[0],
        "documents": batch["cu_seqlens"].shape[0] - 1, "steps_timed": len(ms),
        "ms_median": round(med, 3), "ms_min": round(srt[0], 3), "ms_max": round(srt[-1], 3),
        "ms_pipelined": round(pipelined, 3), "steps_per_s": 1e3 / med, "ctx_tok_per_s": t * 1e3 / med, "peak_bytes": peak,
        "param_elems": n_elem, "train_static_bytes": train_static, "frozen_bytes": frozen_b,
        "static_bytes": train_static + frozen_b, "beyond_bytes": peak - train_static - frozen_b,
        "chunk_rows": args.chunk_rows, "loss": args.loss, "torch": torch.__version__,
        "setup_s": round(time.perf_counter() - t_setup - (sum(ms) + pipelined * args.steps) / 1e3, 1),
        "grad_norm0": gn0,
        "first_loss": losses[0], "losses": losses, "note": note,
    }
    if prof is not None:
        out["profile"] = {"step": prof}
    line = json.dumps(out)
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    if args.ours:
        with open(args.ours) as f:
            ours = json.load(f)
        rel = abs(ours["first_loss"] - out["first_loss"]) / max(abs(out["first_loss"]), 1e-12)
        # The gradient norm too: a loss normalized by its weights' sum can agree across weightings
        # (decay against D-PACE: 1.7e-3 apart on the CPU smoke geometry) where the gradients do
        # not (0.067 against 0.105).
        rel_g = abs(ours["grad_norm0"] - gn0) / max(abs(gn0), 1e-12)
        print(f"cross-check first-step loss: ours {ours['first_loss']:.6f} reference "
              f"{out['first_loss']:.6f} rel diff {rel:.2e} ({'OK' if rel <= 2e-2 else 'MISMATCH'}); "
              f"grad norm ours {ours['grad_norm0']:.5g} reference {gn0:.5g} rel diff {rel_g:.2e} "
              f"({'OK' if rel_g <= 2e-2 else 'MISMATCH'})")
        if cuda:
            print(f"ratios: tok/s {ours['ctx_tok_per_s'] / out['ctx_tok_per_s']:.2f}x (target >= 1.5), "
                  f"peak {ours['peak_bytes'] / peak:.2f} (target <= 0.8), beyond "
                  f"{ours['beyond_bytes'] / out['beyond_bytes']:.2f} (target <= 0.5)")


if __name__ == "__main__":
    main()
