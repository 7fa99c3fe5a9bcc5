"""PyTorch reference TRAINING LOOP of a DFlash drafter, to compare with dflash's trained drafter.

Reads what a dflash run reads and trains the same drafter the same way, step by step, in plain
PyTorch (the step itself is drafter_step_ref.py's ReferenceStep: same drafter, mask, loss weighting):
  - run.yaml (docs/run-spec.md): target.path / layer_ids / dtype, drafter.layers / block_size /
    mask_token_id, data.train / prepared / max_length / long_documents, batching.token_budget /
    max_anchors / grad_accum, optim.*, loss.gamma, seed (auto values resolved as dflash does:
    RunLayerIds, RunMaskTokenId, DefaultGamma);
  - the prepared data file `dflashctl prepare` writes (common/data/prepared.h), read directly;
  - the target, a Hugging Face checkpoint run by transformers (AutoModelForCausalLM; the captured
    layers' outputs taken by forward hooks on the decoder layers, i.e. before the final norm, as
    dflash's TargetModel does; pieces right-padded into one batch with an attention mask).
Per step, as dflash's coordinator + trainer: the epoch plan (PlanEpoch for one pair: seeded
shuffle, pieces, best-fit-decreasing packing in windows of 2048, shuffled micro-batches), the
anchors (SampleAnchors: same valid positions, same SplitMix64 / Lemire draw, same seed hash), the
summed weighted CE numerators over the step's micro-batches divided by their weight sum, the global
grad-norm clip, AdamW (torch.optim.AdamW, fused on CUDA) at LearningRate(step) (linear warmup over
ceil(warmup_ratio * total) steps, then cosine / linear / constant). The drafter starts from dflash's
init (DrafterModel::InitParameters): a CPU torch.Generator seeded with run.yaml's seed draws
N(0, 1) * 0.02 for every projection in parameter order, norms are 1 - the same values as dflash's.
Writes OUT/train.jsonl (one line per step: step, loss, grad_norm, lr, tokens, anchors, ms) and
exports OUT/drafter (config.json + model.safetensors as ExportDrafter writes them; bf16 unless
--export-dtype float32). --dump-init DIR also writes the initial weights (F32) in that format.
"""

import argparse
import json
import math
import os
import struct
import sys
import time
import zlib

import numpy as np
import torch
import yaml
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from drafter_step_ref import ReferenceStep, param_names  # noqa: E402

M64 = (1 << 64) - 1
TAG_EPOCH_SHUFFLE = 0x45504F4348534846
TAG_ANCHORS = 0x414E43484F525331
PACK_WINDOW = 2048  # batching::kDefaultPackWindow
INIT_STD = 0.02  # DrafterOptions::init_std
QWEN3_MASK_TOKEN_ID = 151669  # model::kQwen3MaskTokenId


# ---- common/base/rng.h, bit for bit ----------------------------------------------------------

def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def seed_hash(tag, values):
    h = mix64(tag)
    for v in values:
        h = mix64(h ^ mix64((v + 0x9E3779B97F4A7C15) & M64))
    return h


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & M64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & M64
        return mix64(self.state)

    def below(self, bound):  # Lemire, as SplitMix64::Below
        m = self.next() * bound
        low = m & M64
        if low < bound:
            threshold = ((1 << 64) - bound) % bound
            while low < threshold:
                m = self.next() * bound
                low = m & M64
        return m >> 64


def shuffle(items, rng):  # DeterministicShuffle
    for i in range(len(items) - 1, 0, -1):
        j = rng.below(i + 1)
        items[i], items[j] = items[j], items[i]


# ---- common/batching/packer.cc + plan.cc (one pair: no rebalancing) -------------------------------

def pack_best_fit_decreasing(lengths, budget):
    """PackBestFitDecreasing: items by (length desc, index asc), each into the open bin with the
    least room that fits it (among equal rooms the most recently added), else a new bin."""
    import bisect
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    buckets, caps = {}, []  # room -> bins (LIFO); sorted rooms with a bin
    bin_of, bins = [0] * len(lengths), 0
    for item in order:
        n = lengths[item]
        k = bisect.bisect_left(caps, n)
        if k == len(caps):
            b, room = bins, budget - n
            bins += 1
        else:
            cap = caps[k]
            b = buckets[cap].pop()
            if not buckets[cap]:
                del buckets[cap]
                caps.pop(k)
            room = cap - n
        bin_of[item] = b
        if room > 0:
            if room not in buckets:
                buckets[room] = []
                bisect.insort(caps, room)
            buckets[room].append(b)
    return bin_of, bins


def plan_epoch(lengths, budget, max_length, long_documents, seed, epoch):
    """PlanEpoch with num_pairs 1: a list of micro-batches, each a list of (doc, begin, length)."""
    rng = SplitMix64(seed_hash(TAG_EPOCH_SHUFFLE, [seed & M64, epoch]))
    order = list(range(len(lengths)))
    shuffle(order, rng)
    pieces = []
    for d in order:
        n = int(lengths[d])
        if n == 0:
            continue
        if n <= max_length:
            pieces.append((d, 0, n))
        elif long_documents == "truncate":
            pieces.append((d, 0, max_length))
        else:
            pieces += [(d, b, min(max_length, n - b)) for b in range(0, n, max_length)]
    micro = []
    for w0 in range(0, len(pieces), PACK_WINDOW):
        window = pieces[w0:w0 + PACK_WINDOW]
        bin_of, bins = pack_best_fit_decreasing([p[2] for p in window], budget)
        groups = [[] for _ in range(bins)]
        for p, b in zip(window, bin_of):
            groups[b].append(p)  # within a bin, in window order (the counting sort)
        shuffle(groups, rng)
        micro += groups
    return micro


def sample_anchors(loss_mask, doc_ids, max_anchors, seed, step, micro_in_step):
    """SampleAnchors: valid a has mask[a], mask[a+1] and a+1 in the same piece; a partial
    Fisher-Yates draw of max_anchors of them, sorted."""
    valid = np.nonzero((loss_mask[:-1] != 0) & (loss_mask[1:] != 0) &
                       (doc_ids[:-1] == doc_ids[1:]))[0].tolist()
    k = min(max_anchors, len(valid))
    if k < len(valid):
        rng = SplitMix64(seed_hash(TAG_ANCHORS, [seed & M64, step, 0, micro_in_step]))
        m = len(valid)
        for i in range(k):
            j = i + rng.below(m - i)
            valid[i], valid[j] = valid[j], valid[i]
        valid = sorted(valid[:k])
    return valid


# ---- the prepared data file (common/data/prepared.h) ---------------------------------------------

def read_prepared(path, verify=True):
    with open(path, "rb") as f:
        data = f.read()
    def fail(why):
        raise SystemExit(f"{path}: {why}")
    if len(data) < 8192 + 16 or data[:8] != b"DFLPREP1":
        fail("not a dflash prepared data file (magic DFLPREP1)")
    version, header_bytes, file_bytes = struct.unpack_from("<IIQ", data, 8)
    if version != 1 or header_bytes != 8192:
        fail(f"format version {version} / header {header_bytes} bytes; this reader knows 1 / 8192")
    if file_bytes != len(data):
        fail(f"the header says {file_bytes} bytes, the file has {len(data)} (truncated?)")
    if data[-8:] != b"DFLPEND1":
        fail("no end magic DFLPEND1")
    if verify and zlib.crc32(data[:-16]) != struct.unpack_from("<I", data, len(data) - 16)[0]:
        fail("checksum mismatch")
    vocab = struct.unpack_from("<q", data, 104)[0]
    n_docs, n_tokens = struct.unpack_from("<qq", data, 176)
    sec = [struct.unpack_from("<QQ", data, 200 + 16 * i) for i in range(4)]
    tokens = np.frombuffer(data, np.int32, n_tokens, sec[0][0])
    mask = np.frombuffer(data, np.uint8, n_tokens, sec[1][0])
    offsets = np.frombuffer(data, np.int64, n_docs + 1, sec[2][0])
    if offsets[0] != 0 or offsets[-1] != n_tokens or np.any(np.diff(offsets) < 0):
        fail("doc_offsets do not run from 0 to num_tokens in order")
    return tokens, mask, offsets, vocab


# ---- run.yaml and the target's config.json -------------------------------------------------------

def auto(v):
    return None if v is None or v == "auto" else v


def read_run(path):
    with open(path) as f:
        y = yaml.safe_load(f) or {}
    base = os.path.dirname(os.path.abspath(path))
    g = lambda sec, key, default: (y.get(sec) or {}).get(key, default)  # noqa: E731
    rel = lambda p: p if os.path.isabs(p) or p.startswith("builtin:") else os.path.join(base, p)  # noqa: E731
    run = dict(
        seed=int(y.get("seed", 0)),
        target_path=rel(g("target", "path", "")), layer_ids=auto(g("target", "layer_ids", None)),
        target_dtype=g("target", "dtype", "bfloat16"),
        layers=int(g("drafter", "layers", 5)), block_size=int(g("drafter", "block_size", 16)),
        mask_token_id=auto(g("drafter", "mask_token_id", None)),
        tokenizer=rel(g("data", "tokenizer", "auto")) if g("data", "tokenizer", "auto") != "auto"
        else "auto",
        train=rel(g("data", "train", "")), prepared=g("data", "prepared", "auto"),
        max_length=int(g("data", "max_length", 4096)),
        long_documents=g("data", "long_documents", "truncate"),
        token_budget=int(g("batching", "token_budget", 8192)),
        max_anchors=int(g("batching", "max_anchors", 512)),
        grad_accum=int(g("batching", "grad_accum", 1)),
        lr=float(g("optim", "lr", 6e-4)), warmup_ratio=float(g("optim", "warmup_ratio", 0.04)),
        schedule=g("optim", "schedule", "cosine"), epochs=float(g("optim", "epochs", 6.0)),
        max_steps=int(g("optim", "max_steps", 0)), clip=float(g("optim", "clip", 1.0)),
        weight_decay=float(g("optim", "weight_decay", 0.0)),
        betas=[float(b) for b in g("optim", "betas", [0.9, 0.999])],
        eps=float(g("optim", "eps", 1e-8)), gamma=auto(g("loss", "gamma", None)),
        pairs=auto(g("placement", "pairs", None)))
    if run["target_path"].startswith("builtin:"):
        raise SystemExit(f"{path}: target.path: {run['target_path']} is built into dflash; the "
                         "reference needs a Hugging Face checkpoint directory")
    if run["pairs"] not in (None, 1):
        raise SystemExit(f"{path}: placement.pairs: {run['pairs']}; the reference trains one pair")
    if run["prepared"] != "auto":
        run["prepared"] = rel(run["prepared"])
    return run


def prepared_path(run):
    """ResolveRunDataPaths: data.train when it is prepared, else data.prepared, else
    data.train with the extension .dfdata."""
    t = run["train"]
    try:
        with open(t, "rb") as f:
            if f.read(8) == b"DFLPREP1":
                return t
    except OSError:
        pass
    if run["prepared"] != "auto":
        return run["prepared"]
    return os.path.splitext(t)[0] + ".dfdata"


def target_geometry(target_dir):
    """The fields of the target's config.json the drafter takes (hf_config.cc's reading)."""
    src = os.path.join(target_dir, "config.json")
    with open(src) as f:
        c = json.load(f)
    c = c.get("text_config", c) if "hidden_size" not in c else c
    rp = c.get("rope_parameters") if isinstance(c.get("rope_parameters"), dict) else None
    theta = float((rp or {}).get("rope_theta", c.get("rope_theta", 10000.0)))
    scaling = c.get("rope_scaling") if rp is None else rp
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        raise SystemExit(f"{src}: rope scaling {scaling} is not implemented in the reference")
    if float(c.get("partial_rotary_factor", (rp or {}).get("partial_rotary_factor", 1.0))) != 1.0:
        raise SystemExit(f"{src}: partial_rotary_factor != 1 is not implemented in the reference")
    hq = int(c["num_attention_heads"])
    d = int(c.get("head_dim") or c["hidden_size"] // hq)
    mt = c.get("model_type", "")
    dc = c.get("dflash_config") or {}
    return dict(model_type=mt, hidden_size=int(c["hidden_size"]),
                intermediate_size=int(c["intermediate_size"]), hq=hq,
                hkv=int(c.get("num_key_value_heads") or hq), d=d,
                eps=float(c.get("rms_norm_eps", 1e-6)), rope_theta=theta,
                vocab_size=int(c["vocab_size"]), num_layers=int(c["num_hidden_layers"]),
                max_position_embeddings=int(c.get("max_position_embeddings",
                                                  2048 if mt == "llama" else 32768)),
                mask_token_id=dc.get("mask_token_id"), target_layer_ids=dc.get("target_layer_ids"))


def default_layer_ids(num_layers, k=5):
    """model::DefaultTargetLayerIds: round(1 + i * (L - 4) / (k - 1)), round half to even."""
    if k == 1:
        return [num_layers // 2]
    return [int(round(1.0 + i * (num_layers - 4) / (k - 1))) for i in range(k)]


def mask_token_from_tokenizer(tokenizer_json, vocab_size):
    """model::MaskTokenFromTokenizer (common/model/mask_token.h), rule for rule; None if none."""
    d = os.path.dirname(tokenizer_json)
    load = lambda n: json.load(open(os.path.join(d, n))) if os.path.isfile(os.path.join(d, n)) else {}  # noqa: E731
    tok = json.load(open(tokenizer_json))
    tc = load("tokenizer_config.json")
    vocab = (tok.get("model") or {}).get("vocab")
    added = [a for a in tok.get("added_tokens") or [] if isinstance(a.get("id"), int)]
    count = max([v + 1 for v in vocab.values()] if isinstance(vocab, dict) else
                [len(vocab)] if isinstance(vocab, list) else [0])
    count = max([count] + [a["id"] + 1 for a in added])
    text = lambda v: v if isinstance(v, str) else v.get("content") if isinstance(v, dict) else None  # noqa: E731

    def find(t):
        for a in added:
            if a.get("content") == t:
                return a["id"]
        return vocab.get(t) if isinstance(vocab, dict) else None
    m = find(text(tc["mask_token"])) if text(tc.get("mask_token")) else None
    if m is not None and 0 <= m < vocab_size:
        return m
    if 0 < count < vocab_size:
        return count
    templates = open(os.path.join(d, "chat_template.jinja")).read() if os.path.isfile(
        os.path.join(d, "chat_template.jinja")) else ""
    ct = tc.get("chat_template")
    templates += ct if isinstance(ct, str) else "".join(
        e.get("template", "") for e in ct if isinstance(e, dict)) if isinstance(ct, list) else ""
    framing = {find(text(tc[k])) for k in ("bos_token", "eos_token", "pad_token", "unk_token",
                                          "sep_token", "cls_token") if text(tc.get(k))}

    def ids(obj):
        for k in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "sep_token_id",
                  "cls_token_id"):
            v = obj.get(k)
            framing.update(v if isinstance(v, list) else [v])
        if isinstance(obj.get("text_config"), dict):
            ids(obj["text_config"])
    for f in ("config.json", "generation_config.json"):
        ids(load(f))
    special = sorted((a["id"], a["content"]) for a in added if a.get("special"))
    ok = [(i, t) for i, t in special if 0 <= i < vocab_size and i not in framing and t not in templates]
    reserved = [i for i, t in ok if "reserved" in t.lower() or "unused" in t.lower()]
    return reserved[0] if reserved else ok[0][0] if ok else None


def resolve(run, tg):
    """RunLayerIds, RunMaskTokenId and the loss gamma default (DefaultGamma), as dflash."""
    ids = run["layer_ids"] or tg["target_layer_ids"] or default_layer_ids(tg["num_layers"])
    ids = [int(i) for i in ids]
    if any(i < 0 or i >= tg["num_layers"] for i in ids) or len(set(ids)) != len(ids):
        raise SystemExit(f"target.layer_ids: {ids} for a target of {tg['num_layers']} layers: "
                         "ids must be distinct and inside the target")
    mask = run["mask_token_id"]
    if mask is None:
        mask = tg["mask_token_id"]
    if mask is None:
        tok = run["tokenizer"] if run["tokenizer"] != "auto" else os.path.join(
            run["target_path"], "tokenizer.json")
        if os.path.isfile(tok):
            mask = mask_token_from_tokenizer(tok, tg["vocab_size"])
    if mask is None and tg["model_type"] == "qwen3" and tg["vocab_size"] > QWEN3_MASK_TOKEN_ID:
        mask = QWEN3_MASK_TOKEN_ID
    if mask is None:
        raise SystemExit(f"drafter.mask_token_id: auto knows no mask token for a "
                         f"{tg['model_type']} target; set it")
    gamma = run["gamma"]
    if gamma is None:
        gamma = {16: 7.0, 10: 5.0, 8: 4.0}.get(run["block_size"])
        if gamma is None:
            raise SystemExit(f"loss.gamma: no default for block_size {run['block_size']}; set it")
    return ids, int(mask), float(gamma)


def learning_rate(run, total, step):
    """LearningRate (common/train/trainer.cc)."""
    warmup = math.ceil(run["warmup_ratio"] * total)
    if step < warmup:
        return run["lr"] * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if run["schedule"] == "linear":
        return run["lr"] * (1.0 - progress)
    if run["schedule"] == "constant":
        return run["lr"]
    return run["lr"] * 0.5 * (1.0 + math.cos(math.pi * progress))


# ---- the drafter ---------------------------------------------------------------------------------

def param_shapes(tg, layers, k):
    h, d, inter = tg["hidden_size"], tg["d"], tg["intermediate_size"]
    q, kv = tg["hq"] * d, tg["hkv"] * d
    per = [(h,), (q, h), (kv, h), (kv, h), (h, q), (d,), (d,), (h,), (inter, h), (inter, h),
           (h, inter)]
    shapes = [(h, k * h), (h,)] + per * layers + [(h,)]
    return dict(zip(param_names(layers), shapes))


def init_params(tg, layers, k, seed):
    """DrafterModel::InitParameters: one CPU generator seeded with the run seed; norms 1, every
    other tensor randn * init_std, in parameter order."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in param_shapes(tg, layers, k).items():
        out[name] = (torch.ones(shape) if "norm" in name else
                     torch.randn(shape, generator=gen, dtype=torch.float32) * INIT_STD)
    return out


def export_drafter(params, tg, run, ids, mask, out_dir, dtype):
    """ExportDrafter: config.json (DrafterConfigJson, 2-space indent, trailing newline) and
    model.safetensors with only the drafter's tensors, metadata {"format": "pt"}."""
    os.makedirs(out_dir, exist_ok=True)
    cfg = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "attention_bias": False,
        "attention_dropout": 0.0, "block_size": run["block_size"],
        "dflash_config": {"mask_token_id": mask, "target_layer_ids": ids},
        "head_dim": tg["d"], "hidden_act": "silu", "hidden_size": tg["hidden_size"],
        "intermediate_size": tg["intermediate_size"],
        "layer_types": ["full_attention"] * run["layers"],
        "max_position_embeddings": tg["max_position_embeddings"],
        "num_attention_heads": tg["hq"], "num_hidden_layers": run["layers"],
        "num_key_value_heads": tg["hkv"], "num_target_layers": tg["num_layers"],
        "rms_norm_eps": tg["eps"], "rope_scaling": None, "rope_theta": tg["rope_theta"],
        "tie_word_embeddings": False,
        "torch_dtype": "float32" if dtype == torch.float32 else "bfloat16",
        "use_sliding_window": False, "vocab_size": tg["vocab_size"],
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        f.write(json.dumps(cfg, indent=2) + "\n")
    save_file({n: p.detach().to("cpu", dtype).contiguous() for n, p in params.items()},
              os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})


# ---- the target ----------------------------------------------------------------------------------

class TargetFeatures:
    """The target's captured layers (decoder layer i's output, before the final norm) for packed
    pieces, concatenated in layer-id order: [T, K*H] in the target dtype."""

    def __init__(self, path, ids, dtype, dev):
        from transformers import AutoModelForCausalLM
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        except TypeError:
            model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype)
        model = model.to(dev).eval()
        self.base = model.model
        self.base.layers = self.base.layers[:max(ids) + 1]  # later layers are never used
        self.embed = self.base.embed_tokens.weight.detach()
        self.lm_head = model.get_output_embeddings().weight.detach()
        self.ids, self.dev, self.captured = ids, dev, {}
        for i in ids:
            self.base.layers[i].register_forward_hook(self._hook(i))

    def _hook(self, i):
        def hook(_module, _inputs, out):
            self.captured[i] = out[0] if isinstance(out, tuple) else out
        return hook

    @torch.no_grad()
    def __call__(self, input_ids, cu):
        lens = (cu[1:] - cu[:-1]).tolist()
        b, n = len(lens), max(lens)
        ids = torch.zeros((b, n), dtype=torch.long)
        att = torch.zeros((b, n), dtype=torch.long)
        for j, (s, ln) in enumerate(zip(cu[:-1].tolist(), lens)):
            ids[j, :ln] = input_ids[s:s + ln]
            att[j, :ln] = 1
        self.captured.clear()
        self.base(input_ids=ids.to(self.dev), attention_mask=att.to(self.dev), use_cache=False)
        keep = att.to(self.dev).view(-1).bool()
        return torch.cat([self.captured[i].reshape(b * n, -1)[keep] for i in self.ids], -1)


def pad_static(input_ids, loss_mask, lens, anchors, features, token_budget, max_anchors):
    """A micro-batch padded to token_budget tokens and max_anchors blocks without changing its
    loss or gradients: the padding tokens are a piece of their own (no real block attends to
    another piece's context), with no loss and zero features; the padding blocks have anchor -1
    (they attend to nothing and weigh 0)."""
    t = input_ids.shape[0]
    pad = token_budget - t
    if pad < 0 or len(anchors) > max_anchors:
        sys.exit(f"a micro-batch of {t} tokens and {len(anchors)} anchors exceeds the budget "
                 f"({token_budget} tokens, {max_anchors} anchors)")
    if pad > 0:
        input_ids = torch.cat([input_ids, torch.zeros(pad, dtype=input_ids.dtype)])
        loss_mask = np.concatenate([loss_mask, np.zeros(pad, loss_mask.dtype)])
        features = torch.cat([features, features.new_zeros(pad, features.shape[1])])
        lens = list(lens) + [pad]
    anchors = list(anchors) + [-1] * (max_anchors - len(anchors))
    return input_ids, loss_mask, lens, anchors, features


# ---- the loop ------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_yaml")
    ap.add_argument("--data", help="the prepared file (default: as dflash resolves run.yaml's data)")
    ap.add_argument("--target", help="HF checkpoint dir (default: run.yaml's target.path)")
    ap.add_argument("--out", required=True, help="writes OUT/train.jsonl and OUT/drafter")
    ap.add_argument("--steps", type=int, default=0,
                    help="total steps (the schedule's length, as optim.max_steps); default "
                         "run.yaml's max_steps, else ceil(epochs * steps of epoch 0)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--compile", choices=["none", "full"], default="none")
    ap.add_argument("--attention", choices=["flex", "dense"],
                    help="default flex on cuda, dense on cpu (FlexAttention has no CPU backward)")
    ap.add_argument("--chunk-rows", type=int, default=1024)
    ap.add_argument("--static-shapes", action="store_true",
                    help="pad every micro-batch to batching.token_budget tokens (a padding piece of "
                         "its own, no loss, zero features) and batching.max_anchors blocks "
                         "(anchor -1), and take the loss over every row (weight 0 where there is "
                         "none): the same arithmetic in shapes that never change, so that "
                         "--compile full compiles once (on the GPU)")
    ap.add_argument("--export-dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--dump-init", help="also export the initial drafter (F32) to this dir")
    ap.add_argument("--dump-last-batch", help="write the last micro-batch (tensors, loss of the "
                    "exported weights on it) to this dir, for a cross-check against dflash")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"

    run = read_run(args.run_yaml)
    target_dir = args.target or run["target_path"]
    tg = target_geometry(target_dir)
    ids, mask_id, gamma = resolve(run, tg)
    data_path = args.data or prepared_path(run)
    tokens, loss_mask, offsets, vocab = read_prepared(data_path)
    if vocab != tg["vocab_size"]:
        print(f"note: {data_path} was prepared for vocab {vocab}, the target has "
              f"{tg['vocab_size']}", file=sys.stderr)
    lengths = np.diff(offsets)
    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[
        run["target_dtype"]]
    if not cuda:
        tdt = torch.float32
    # DrafterOptions: fp32 master weights; compute in the target dtype unless it is float32.
    cdt = tdt

    def plan(epoch):
        return plan_epoch(lengths, run["token_budget"], run["max_length"], run["long_documents"],
                          run["seed"], epoch)

    ga = run["grad_accum"]
    epoch, mbs = 0, plan(0)
    steps_per_epoch = math.ceil(len(mbs) / ga)
    total = args.steps or run["max_steps"] or math.ceil(run["epochs"] * steps_per_epoch)

    target = TargetFeatures(target_dir, ids, tdt, dev)
    k = len(ids)
    init = init_params(tg, run["layers"], k, run["seed"])
    if args.dump_init:
        export_drafter(init, tg, run, ids, mask_id, args.dump_init, torch.float32)
    params = {n: torch.nn.Parameter(t.to(dev)) for n, t in init.items()}
    plist = list(params.values())
    opt = torch.optim.AdamW(plist, lr=run["lr"], betas=tuple(run["betas"]), eps=run["eps"],
                            weight_decay=run["weight_decay"], fused=cuda)
    geo = dict(hq=tg["hq"], hkv=tg["hkv"], d=tg["d"], eps=tg["eps"], block_size=run["block_size"],
               num_layers=run["layers"], gamma=gamma, mask_token_id=mask_id,
               rope_theta=tg["rope_theta"], dtype=cdt)
    use_flex = (args.attention or ("flex" if cuda else "dense")) == "flex"
    ref = ReferenceStep(geo, params, target.embed, target.lm_head, dev, use_flex, args.chunk_rows,
                        all_rows=args.static_shapes)
    fns = ref.build(args.compile)

    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "train.jsonl"), "w")
    print(json.dumps({"run": os.path.abspath(args.run_yaml), "data": data_path,
                      "documents": len(lengths), "micro_batches_per_epoch": len(mbs),
                      "total_steps": total, "target_layer_ids": ids, "mask_token_id": mask_id,
                      "gamma": gamma, "device": args.device, "compile": args.compile,
                      "attention": "flex" if use_flex else "dense",
                      "static_shapes": args.static_shapes}), file=sys.stderr)
    pos_in_epoch, last = 0, None
    for step in range(total):
        t0 = time.perf_counter()
        if pos_in_epoch >= len(mbs):
            epoch, pos_in_epoch = epoch + 1, 0
            mbs = plan(epoch)
        step_mbs = mbs[pos_in_epoch:pos_in_epoch + ga]
        pos_in_epoch += len(step_mbs)
        num_total, w_total, n_tok, n_anchor = 0.0, 0.0, 0, 0
        for i, pieces in enumerate(step_mbs):
            ids_l, mask_l, docs_l = [], [], []
            for j, (d, b, n) in enumerate(pieces):
                s = int(offsets[d]) + b
                ids_l.append(tokens[s:s + n])
                mask_l.append(loss_mask[s:s + n])
                docs_l.append(np.full(n, j, np.int32))
            ids_np, mask_np, doc_np = (np.concatenate(x) for x in (ids_l, mask_l, docs_l))
            lens = [p[2] for p in pieces]
            anchors = sample_anchors(mask_np, doc_np, run["max_anchors"], run["seed"], step, i)
            input_ids = torch.from_numpy(ids_np.astype(np.int64))
            cu = torch.tensor([0] + np.cumsum(lens).tolist(), dtype=torch.int32)
            features = target(input_ids, cu.long())
            real_tokens, real_anchors = len(ids_np), len(anchors)
            if args.static_shapes:
                (input_ids, mask_np, lens, anchors, features) = pad_static(
                    input_ids, mask_np, lens, anchors, features, run["token_budget"],
                    run["max_anchors"])
                cu = torch.tensor([0] + np.cumsum(lens).tolist(), dtype=torch.int32)
            positions = torch.cat([torch.arange(n) for n in lens])
            batch = {
                "input_ids": input_ids.to(dev), "positions": positions.to(dev),
                "cu_seqlens": cu.to(dev), "loss_mask": torch.from_numpy(mask_np.astype(np.int64)).to(dev),
                "anchors": torch.tensor(anchors or [-1], dtype=torch.long, device=dev),
                "features": features,
            }
            num, wsum = ref.numerator(batch, fns)
            if wsum.item() > 0 and torch.isfinite(num):
                num.backward()
            num_total += num.item()
            w_total += wsum.item()
            n_tok += real_tokens
            n_anchor += real_anchors
            last = batch
        lr = learning_rate(run, total, step)
        rec = {"step": step, "loss": num_total / w_total if w_total > 0 else 0.0, "lr": lr,
               "tokens": n_tok, "anchors": n_anchor, "micro_batches": len(step_mbs),
               "epoch": epoch}
        if w_total > 0 and math.isfinite(num_total):
            for p in plist:
                if p.grad is not None:
                    p.grad.div_(w_total)
            gn = torch.nn.utils.clip_grad_norm_(plist, run["clip"] if run["clip"] > 0 else math.inf)
            rec["grad_norm"] = gn.item()
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
        else:
            rec["skipped"] = True
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        rec["ms"] = round((time.perf_counter() - t0) * 1e3, 2)
        log.write(json.dumps(rec) + "\n")
        log.flush()
        if step % 10 == 0 or step == total - 1:
            print(f"step {step}/{total} loss {rec['loss']:.4f} lr {lr:.3g} {rec['ms']:.0f} ms",
                  file=sys.stderr)
    log.close()
    export_dtype = torch.float32 if args.export_dtype == "float32" else torch.bfloat16
    export_drafter(params, tg, run, ids, mask_id, os.path.join(args.out, "drafter"), export_dtype)
    if args.dump_last_batch:
        dump_batch(ref, fns, params, last, export_dtype, args.dump_last_batch)
    print(f"exported {os.path.join(args.out, 'drafter')}", file=sys.stderr)


@torch.no_grad()
def dump_batch(ref, fns, params, batch, export_dtype, out_dir):
    """The last micro-batch and the loss of the exported (rounded) weights on it."""
    for p in params.values():
        p.copy_(p.to(export_dtype).float())
    num, wsum = ref.numerator(batch, fns)
    os.makedirs(out_dir, exist_ok=True)
    save_file({n: t.detach().cpu().contiguous() for n, t in batch.items()},
              os.path.join(out_dir, "batch.safetensors"))
    with open(os.path.join(out_dir, "loss.json"), "w") as f:
        json.dump({"numerator": num.item(), "denominator": wsum.item(),
                   "loss": num.item() / wsum.item()}, f)


if __name__ == "__main__":
    main()
