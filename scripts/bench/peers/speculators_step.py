"""speculators 0.9.0 (vLLM's trainer, PyPI `speculators==0.9.0`): its own DFlash training step,
timed beside ours (scripts/bench/drafter_step.cc) at the same geometry and batch shape.

What runs is speculators' code, assembled the way `speculators train --speculator-type dflash` on
one GPU assembles it (speculators/train/cli.py `main`, train/trainer.py `Trainer`):
  - the run config: `speculators.train.config.TrainConfig.from_flat` with speculator_type dflash
    and only these set: verifier_name_or_path (below), num_layers = --layers,
    target_layer_ids = K ids (K = --num-target-layers; speculators' default is 3 layers),
    mask_token_id, full_attention_indices / sliding_window (--sliding-window, below),
    optimizer (--optimizer, default adamw as asked; speculators' own default is muon),
    loss_implementation (eager: the fused Triton loss, speculators' default on cuda, fails inside
    its torch.compile with torch 2.11.0; --loss-implementation fused asks for it), block_size
    --block-size, max_anchors --anchors, total_seq_len --tokens; every other field keeps its
    default, resolved by TrainConfig itself: loss_fn ce, per_position_loss_weight dpace
    (D-PACE, alpha 0.5), lr 1e-3, weight_decay 0.01, linear schedule with 1% warmup,
    hidden_states_dtype bfloat16 (autocast compute, fp32 master weights), draft_attn_impl
    simple_flex_attention, no gradient checkpointing, sample_from_anchor false;
  - the draft: `speculators.train.cli.build_draft_model` -> `create_transformer_layer_config` ->
    `DFlashDraftModel.from_training_args` (speculators.models.dflash.core.DFlashDraftModel: Qwen3
    DFlash layers, fc + hidden_norm, norm, and from the verifier: frozen embed_tokens, the frozen
    lm_head (full vocabulary: no draft-vocab pruning, so the draft's lm_head IS the verifier's and
    is not trained), a frozen verifier_lm_head and verifier_norm that make the labels). The
    "verifier" is a directory this script writes: a Qwen3-8B-shaped config.json
    (num_hidden_layers --target-depth) and a model.safetensors holding only
    model.embed_tokens.weight, lm_head.weight (random N(0, 0.02), bf16) and model.norm.weight
    (ones), the three tensors speculators loads from a verifier (`load_verifier_weights`);
  - the step: the body of `Trainer.train_epoch` on one process: model in fp32 on the device,
    `torch.autocast(device, bfloat16)` around `model(**batch, **train_call_kwargs)` (kwargs from
    `DFlashDraftModel.get_trainer_kwargs`), zero_grad, loss.backward(), clip_grad_norm_(1.0),
    every optimizer of `train.optimizers.build_optimizers` steps, every scheduler steps. On CUDA
    the model's forward is torch.compile'd by speculators itself (`conditional_torch_compile`),
    and its flex-attention BlockMask comes from a torch.compile'd create_block_mask, rebuilt every
    step (anchors change every step).

How our batch maps onto speculators' DFlash input (what its CollateFn produces; packed [1, T]):
  input_ids [1, T]                     our packed tokens
  loss_mask [1, T] (long)              our loss mask
  document_ids [1, T]                  the document index of each token (our packing; all >= 0)
  position_ids [1, T]                  restarting at 0 in each document (as its collator does)
  hidden_states [1, T, K*H] bf16       our features
  verifier_last_hidden_states [1, T, H] bf16   random N(0, 1): the target's last hidden state,
                                       from which speculators computes its labels (ours uses the
                                       next tokens; speculators uses argmax of the verifier's
                                       logits at the previous position for loss_fn ce)
Anchors: `select_anchors` draws min(max_anchors, candidates) anchors itself every step, at random
among supervised positions (not in the last block_size positions), sorted; queries attend to
earlier context of their own document (document_ids) plus their own block, bidirectionally
(full-attention layers). --sliding-window N makes every layer a sliding-window layer of N as
speculators' CLI does by default (all layers sliding 2048 unless --full-attention-indices);
the default here, 0, makes every layer full attention (the DFlash recipe and ours).

Prints one JSON line (peer_common.report).
"""

import argparse
import os
import shutil
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc  # noqa: E402

IMPL = "speculators 0.9.0"


def _stub_datasets():
    """speculators/__init__ imports models -> eagle3 -> train/data.py, whose first lines import
    `datasets` (Hugging Face datasets, with pyarrow, pandas, dill, multiprocess...) for the
    offline data loader. The training step never touches it. Where `datasets` is not installed,
    put a stand-in module in sys.modules whose every attribute raises when used."""
    try:
        import datasets  # noqa: F401
        return False
    except ImportError:
        pass

    class _Stub(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)

            def _unavailable(*_a, **_k):
                raise RuntimeError(f"datasets.{name}: not installed (stubbed by {__file__})")
            return _unavailable

    sys.modules["datasets"] = _Stub("datasets")
    return True


def write_verifier(path, args, torch):
    """A Qwen3-8B-shaped verifier directory: config.json + the three tensors speculators reads."""
    from safetensors.torch import save_file
    from transformers import Qwen3Config

    cfg = Qwen3Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.target_depth, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.head_dim, hidden_act="silu",
        max_position_embeddings=pc.QWEN3_MAX_POSITIONS, rms_norm_eps=pc.QWEN3_RMS_EPS,
        rope_parameters={"rope_type": "default", "rope_theta": pc.QWEN3_ROPE_THETA},
        tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645)
    cfg.architectures = ["Qwen3ForCausalLM"]
    cfg.save_pretrained(path)
    g = torch.Generator().manual_seed(args.seed + 2)
    tensors = {
        "model.embed_tokens.weight":
            (torch.randn(args.vocab, args.hidden, generator=g) * 0.02).to(torch.bfloat16),
        "lm_head.weight":
            (torch.randn(args.vocab, args.hidden, generator=g) * 0.02).to(torch.bfloat16),
        "model.norm.weight": torch.ones(args.hidden, dtype=torch.bfloat16),
    }
    save_file(tensors, os.path.join(path, "model.safetensors"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    pc.add_common_flags(p)
    p.add_argument("--sliding-window", type=int, default=0,
                   help="0: every layer full attention (default); N: every layer sliding "
                        "window N (speculators' CLI default: 2048 on all layers)")
    p.add_argument("--optimizer", choices=["adamw", "muon"], default="adamw",
                   help="speculators' default is muon; adamw as the comparison asks")
    p.add_argument("--loss-implementation", choices=["auto", "fused", "eager"], default="auto",
                   help="auto: eager (on cuda speculators' default is its fused Triton loss, "
                        "which fails inside its own torch.compile with torch 2.11.0: dynamo "
                        "'ListVariable(length=21) is already tracked for mutation', one H100, "
                        "2026-12-07; eager is compiled with the rest of the forward)")
    p.add_argument("--attn-impl", choices=["auto", "simple_flex_attention", "sdpa", "eager"],
                   default="auto",
                   help="draft_attn_impl; auto: simple_flex_attention (speculators' default) on "
                        "cuda, sdpa on cpu (PyTorch's FlexAttention has no CPU backward)")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--work-dir", default="",
                   help="where the verifier directory is written (default: a temp dir)")
    args = pc.parse(p)
    loss_impl = args.loss_implementation
    if args.attn_impl == "auto":
        args.attn_impl = "simple_flex_attention" if args.device == "cuda" else "sdpa"
    if loss_impl == "auto":
        loss_impl = "eager"

    t_setup = time.perf_counter()
    stubbed = _stub_datasets()
    import torch

    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    work = args.work_dir or tempfile.mkdtemp(prefix="speculators_step_")
    try:
        run(args, torch, device, work, loss_impl, stubbed, t_setup)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)


def run(args, torch, device, work, loss_impl, stubbed, t_setup):
    from speculators.model import SpeculatorModel
    from speculators.train.cli import build_draft_model, parse_vocab_mappings, set_seed
    from speculators.train.config import TrainConfig
    from speculators.train.optimizers import build_optimizers
    from speculators.train.trainer import TrainerConfig, _resolve_scheduler_steps
    from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

    verifier_dir = os.path.join(work, "verifier")
    os.makedirs(verifier_dir, exist_ok=True)
    write_verifier(verifier_dir, args, torch)

    k_ids = pc.target_layer_ids(args.num_target_layers, args.target_depth)
    flat = {
        "speculator_type": "dflash",
        "seed": args.seed,
        "verifier_name_or_path": verifier_dir,
        "num_layers": args.layers,
        "target_layer_ids": k_ids,
        "mask_token_id": pc.mask_token_id(args.vocab),
        "block_size": args.block_size,
        "max_anchors": args.anchors,
        "total_seq_len": args.tokens,
        "optimizer": args.optimizer,
        "loss_implementation": loss_impl,
        "draft_attn_impl": args.attn_impl,
        "gradient_checkpointing": args.gradient_checkpointing,
        "data_path": os.path.join(work, "no-data"),
        "save_path": os.path.join(work, "checkpoints"),
        "max_steps": args.warmup + args.steps,
    }
    if args.sliding_window > 0:
        flat["sliding_window"] = args.sliding_window
        flat["full_attention_indices"] = []
    else:
        flat["full_attention_indices"] = list(range(args.layers))
    cfg = TrainConfig.from_flat(flat)
    a = argparse.Namespace(**cfg.flatten())  # what speculators.train.cli.main hands on
    set_seed(a.seed, a.deterministic_cuda)
    hidden_states_dtype = getattr(torch, a.hidden_states_dtype)

    d2t, t2d, draft_vocab_size = parse_vocab_mappings(a)  # no mappings: the full vocabulary
    model_class = SpeculatorModel.registry[a.speculator_type]
    model = build_draft_model(a, model_class, t2d, d2t, draft_vocab_size)
    train_call_kwargs, _ = model_class.get_trainer_kwargs(**vars(a))
    tcfg = TrainerConfig(
        num_epochs=a.epochs, save_path=a.save_path, lr=a.lr,
        resume_from_checkpoint=False, train_call_kwargs=train_call_kwargs,
        optimizer=a.optimizer, weight_decay=a.weight_decay, muon_lr=a.muon_lr,
        muon_momentum=a.muon_momentum, muon_weight_decay=a.muon_weight_decay,
        muon_ns_steps=a.muon_ns_steps, muon_adjust_lr_fn=a.muon_adjust_lr_fn,
        scheduler_type=a.scheduler_type, scheduler_warmup_steps=a.scheduler_warmup_steps,
        scheduler_warmup_ratio=a.scheduler_warmup_ratio,
        scheduler_total_steps=a.scheduler_total_steps,
        scheduler_num_cosine_cycles=a.scheduler_num_cosine_cycles,
        hidden_states_dtype=hidden_states_dtype, gradient_checkpointing=a.gradient_checkpointing,
        max_steps=a.max_steps)

    # Trainer.setup_model (one process: no DDP / FSDP), Trainer.setup_optimizer.
    SpeculatorModel.verify_training_compatible(model)
    if tcfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.to(device)
    optimizers = build_optimizers(model, tcfg)
    warm, total = _resolve_scheduler_steps(tcfg, args.warmup + args.steps)
    schedulers = []
    for opt in optimizers:
        if tcfg.scheduler_type == "linear":
            schedulers.append(get_linear_schedule_with_warmup(opt, warm, total))
        elif tcfg.scheduler_type == "cosine":
            schedulers.append(get_cosine_schedule_with_warmup(
                opt, warm, total, num_cycles=tcfg.scheduler_num_cosine_cycles))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    shutil.rmtree(verifier_dir, ignore_errors=True)  # loaded; 2.5 GB at the full geometry

    b = pc.make_batch(args, device, torch)
    batch = {
        "input_ids": b["input_ids"].unsqueeze(0),
        "loss_mask": b["loss_mask"].long().unsqueeze(0),
        "document_ids": b["document_ids"].unsqueeze(0),
        "position_ids": b["position_ids"].unsqueeze(0),
        "hidden_states": b["features"].to(hidden_states_dtype).unsqueeze(0),
        "verifier_last_hidden_states": b["last_hidden"].to(hidden_states_dtype).unsqueeze(0),
    }
    valid = b["loss_mask"].bool().clone()
    valid[-args.block_size:] = False  # select_anchors' candidates
    anchors_drawn = min(args.anchors, int(valid.sum()))
    if anchors_drawn == 0:
        raise SystemExit("speculators_step: no supervised token outside the last block: no anchor "
                         "(the loss would be 0); use more --tokens or another --seed")
    model.train()
    pc.sync(torch, device)
    setup_s = time.perf_counter() - t_setup
    last = {}

    def step():
        # Trainer.train_epoch, one iteration (without its logging / checkpointing).
        with torch.autocast(device.type, dtype=tcfg.hidden_states_dtype):
            _draft_tokens, loss, metrics = model(**batch, **(tcfg.train_call_kwargs or {}))
        for opt in optimizers:
            opt.zero_grad()
        loss.backward()
        last["grad_norm"] = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for opt in optimizers:
            opt.step()
        for s in schedulers:
            s.step()
        last["metrics"] = metrics
        return loss.detach()

    ms, losses = pc.run_steps(torch, device, step, args.warmup, args.steps)
    m = last["metrics"]
    eal_blocks = int(m["eal_total"]) if "eal_total" in m else None  # blocks with a supervised slot
    attn = (f"sliding window {args.sliding_window} on every layer" if args.sliding_window > 0
            else "full attention on every layer")
    notes = (
        f"speculators' own DFlashDraftModel (from_training_args via train.cli.build_draft_model, "
        f"TrainConfig defaults) and Trainer.train_epoch's step body; {args.attn_impl} ({attn}; "
        f"document-masked); forward torch.compile'd by speculators when CUDA is present"
        f"{'' if torch.cuda.is_available() else ' (not here: no CUDA)'}; fp32 weights, bf16 "
        f"autocast; optimizer {args.optimizer} (lr {a.lr}, wd {a.weight_decay}, "
        f"{a.scheduler_type} schedule), clip 1.0; loss {a.loss_fn} ({loss_impl}) with "
        f"{a.per_position_loss_weight} position weights on labels = argmax of the frozen "
        f"verifier lm_head over the target's last hidden state (an extra [n*B, V] GEMM, no grad); "
        f"frozen full-vocab lm_head (not trained); anchors drawn by speculators every step; "
        f"random weights" + ("; `datasets` stubbed (not installed)" if stubbed else ""))
    impl = IMPL + (f" (sliding window {args.sliding_window})" if args.sliding_window > 0 else "")
    pc.report(torch, device, args, impl, ms, losses, anchors_drawn, setup_s, notes, extra={
        "trainable_params": trainable, "documents": len(b["doc_lengths"]),
        "grad_norm_last": float(last["grad_norm"]), "eal_total_last": eal_blocks,
        "loss_fn": a.loss_fn, "loss_implementation": loss_impl,
        "per_position_loss_weight": a.per_position_loss_weight, "optimizer": args.optimizer,
        "sliding_window": args.sliding_window,
    })


if __name__ == "__main__":
    main()
