"""SpecForge 0.2.0 (SGLang's trainer, PyPI `specforge==0.2.0`): its own DFlash training step, timed
beside ours (scripts/bench/drafter_step.cc) at the same geometry and batch shape.

What runs is SpecForge's code, assembled the way its one-GPU `specforge train` run assembles it
(specforge/cli.py `_train`, training/assembly.py, algorithms/model_providers.py, training/trainer.py):
  - draft config: the payload `training/model_loading._generate_draft_config` builds from a target
    config (here the synthetic Qwen3-8B-shaped one of the flags), through DFlash's own
    `populate_dflash_generated_config` and `apply_dflash_overrides` (draft layers = --layers,
    layer_types all full_attention, block_size 16), then `_draft_config_from_dict`;
    dflash_config.target_layer_ids = `build_target_layer_ids(--target-depth, K)` (K =
    --num-target-layers; SpecForge's recipe ties K to the draft layer count: 5 and 5 here);
  - draft model: `AutoDraftModel.from_config(..., torch_dtype=bfloat16)` ->
    `specforge.modeling.draft.dflash.DFlashDraftModel` (Qwen3 DFlash layers, HF Qwen3MLP /
    Qwen3RMSNorm: the default DFlashKernels, model.use_liger_kernel false), random init
    (its post_init), `config._attn_implementation = training.attention_backend`
    (default flex_attention: transformers' flex_attention_forward, which torch.compiles
    flex_attention alone; the rest of the model runs eager);
  - training module: `algorithms.common.dflash_family_model.OnlineDFlashModel` with the
    config defaults (loss_type dflash, num_anchors 512 = --anchors, loss_decay_gamma None,
    objective_chunk_blocks 128, attention_backend flex_attention), .to(bf16) as
    `_build_dflash_family_model` does; the frozen target embed_tokens / lm_head are
    `modeling.target.target_utils.TargetEmbeddingsAndHead` built from the config with random
    N(0, 0.02) weights (SpecForge loads them from the target checkpoint: `from_pretrained`, then
    .to(bf16), eval, requires_grad_(False), which is what is done here without a checkpoint);
  - the step: `training.controller.TrainerCore.train_step` (accumulation 1) over
    `training.strategies.base.DFlashTrainStrategy` and `training.backend.FSDPTrainingBackend`:
    forward + loss (the loss numerator is backpropagated, then the gradients are scaled by
    1 / weight sum), then `specforge.optimizer.BF16Optimizer` (AdamW over fp32 master copies of
    the bf16 parameters, lr 1e-4, weight decay 0, grad clip 0.5, cosine schedule with warmup
    ratio 0.015: the TrainingConfig defaults). All parameters and activations are bf16 (model
    .to(bfloat16); no autocast): SpecForge's default torch_dtype.
  - --wrap fsdp (default on cuda): as `specforge train` on one GPU: `init_distributed` with a
    one-process world (the env `_bootstrap_single_process_env` sets), FSDP1 SHARD_GRAD_OP with
    use_orig_params, MixedPrecision(param_dtype=bf16), one FSDP unit per Qwen3DFlashDecoderLayer,
    the frozen embed/lm_head ignored. --wrap none: no wrapper (the default on cpu).

How our batch maps onto SpecForge's DFlash input (TrainBatch.tensors, what its collator
`dflash_family_data.build_collator` produces: padded [B, S] rows, no packing):
  input_ids [1, T]            the T packed context tokens as ONE row (SpecForge has no packed /
                              multi-document DFlash batch: its mask has no document boundary, so
                              blocks may attend to earlier documents of the row; positions are
                              0..T-1 over the whole row)
  loss_mask [1, T]            our loss mask (prompt 0 / answer 1)
  hidden_states [1, T, K*H]   our features (bf16)
Anchors: OnlineDFlashModel._sample_anchor_positions draws min(num_anchors, candidates) anchors
itself every step, at random among positions t with loss_mask[t] and loss_mask[t+1] (ours:
drawn once by SampleAnchors); --anchors sets num_anchors. The DFlash mask (create_dflash_block_mask:
context kv < anchor, own block bidirectional) is built by create_block_mask (not compiled) inside
every step, as in SpecForge. Labels: the token at anchor+k for block slot k (k >= 1), hard
cross-entropy over the full vocab in chunks of 128 blocks (logits of 2048 rows at a time, each
chunk under activation checkpointing), weights = block valid * label in range * loss_mask, no
decay (loss_decay_gamma None); loss = sum / weight sum.

Prints one JSON line (peer_common.report). Run with the package importable (run_peers.sh puts
the wheels of wheels.sh in a --target dir on PYTHONPATH).
"""

import argparse
import os
import socket
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common as pc  # noqa: E402

IMPL = "specforge 0.2.0"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    pc.add_common_flags(p)
    p.add_argument("--wrap", choices=["auto", "fsdp", "none"], default="auto",
                   help="auto: fsdp on cuda (as `specforge train` on one GPU), none on cpu")
    p.add_argument("--attention-backend", default="auto",
                   choices=["auto", "flex_attention", "sdpa", "eager"],
                   help="training.attention_backend; auto: flex_attention (SpecForge's default) "
                        "on cuda, sdpa on cpu (PyTorch's FlexAttention has no CPU backward)")
    p.add_argument("--objective-chunk-blocks", type=int, default=128,
                   help="training.objective_chunk_blocks (SpecForge default 128)")
    p.add_argument("--lr", type=float, default=1e-4, help="training.learning_rate (default 1e-4)")
    args = pc.parse(p)
    wrap = args.wrap if args.wrap != "auto" else ("fsdp" if args.device == "cuda" else "none")
    if args.attention_backend == "auto":
        args.attention_backend = "flex_attention" if args.device == "cuda" else "sdpa"

    # SpecForge picks its device from SPECFORGE_DEVICE, else CUDA when present.
    os.environ["SPECFORGE_DEVICE"] = args.device
    t_setup = time.perf_counter()
    import torch

    from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel
    from specforge.algorithms.model_providers import (apply_dflash_overrides,
                                                      populate_dflash_generated_config)
    from specforge.modeling.auto import AutoDraftModel
    from specforge.modeling.draft.dflash import build_target_layer_ids
    from specforge.modeling.target.target_utils import TargetEmbeddingsAndHead
    from specforge.optimizer import BF16Optimizer
    from specforge.runtime.contracts import TrainBatch
    from specforge.training.backend import FSDPTrainingBackend, ParallelConfig
    from specforge.training.controller import StepContext, TrainerCore
    from specforge.training.model_loading import _draft_config_from_dict
    from specforge.training.strategies.base import DFlashTrainStrategy
    from transformers import Qwen3Config

    torch.manual_seed(args.seed)
    if wrap == "fsdp":
        # specforge/cli.py _train: _bootstrap_single_process_env, FSDP_SHARDING, init_distributed.
        if "RANK" not in os.environ:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        os.environ["FSDP_SHARDING"] = "SHARD_GRAD_OP"
        from specforge.distributed import init_distributed
        init_distributed(timeout=10, tp_size=1)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dtype = torch.bfloat16

    # --- draft config: training/model_loading._generate_draft_config with a Qwen3-8B-shaped target.
    target_config = types.SimpleNamespace(num_hidden_layers=args.target_depth)
    payload = {
        "vocab_size": args.vocab, "hidden_size": args.hidden,
        "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads,
        "intermediate_size": args.intermediate, "max_position_embeddings": pc.QWEN3_MAX_POSITIONS,
        "rms_norm_eps": pc.QWEN3_RMS_EPS, "hidden_act": "silu", "initializer_range": 0.02,
        "attention_bias": False, "attention_dropout": 0.0, "head_dim": args.head_dim,
        "rope_theta": pc.QWEN3_ROPE_THETA, "bos_token_id": 151643, "eos_token_id": 151645,
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_hidden_layers": 1,
        "tie_word_embeddings": False, "use_cache": True, "pad_token_id": 0,
    }
    populate_dflash_generated_config(payload, target_config, None)
    payload["block_size"] = args.block_size
    draft_config = _draft_config_from_dict(payload)
    # model.draft_num_hidden_layers = --layers (model_loading._apply_draft_overrides, then DFlash's).
    draft_config.num_hidden_layers = args.layers
    apply_dflash_overrides(
        types.SimpleNamespace(model=types.SimpleNamespace(draft_num_hidden_layers=args.layers)),
        draft_config)
    draft_config.dflash_config = {
        **dict(draft_config.dflash_config or {}),
        "target_layer_ids": build_target_layer_ids(args.target_depth, args.num_target_layers),
    }
    assert len(draft_config.dflash_config["target_layer_ids"]) == args.num_target_layers

    # --- draft model: model_providers.build_dflash_draft.
    draft_config._attn_implementation = args.attention_backend
    draft_model = AutoDraftModel.from_config(draft_config, torch_dtype=dtype, dflash_kernels=None)
    draft_model = draft_model.to(device=device, dtype=dtype)

    # --- training module: model_providers._build_dflash_family_model / build_dflash_model.
    mask_id = pc.mask_token_id(args.vocab)
    draft_model.mask_token_id = mask_id
    draft_model.config.dflash_config["mask_token_id"] = mask_id
    target_parts = TargetEmbeddingsAndHead(Qwen3Config(
        vocab_size=args.vocab, hidden_size=args.hidden, pad_token_id=0,
        tie_word_embeddings=False))
    with torch.no_grad():
        target_parts.embed_tokens.weight.normal_(0, 0.02)
        target_parts.lm_head.weight.normal_(0, 0.02)
    target_parts.to(device=device, dtype=dtype)
    target_parts.eval()
    target_parts.requires_grad_(False)
    model = OnlineDFlashModel(
        draft_model=draft_model, target_lm_head=target_parts.lm_head,
        target_embed_tokens=target_parts.embed_tokens, mask_token_id=mask_id,
        block_size=int(draft_model.block_size), attention_backend=args.attention_backend,
        num_anchors=args.anchors, loss_decay_gamma=None,
        objective_chunk_blocks=args.objective_chunk_blocks, loss_type="dflash", dpace_alpha=0.5,
    ).to(device=device, dtype=dtype)

    # --- backend, optimizer, step: training/trainer.py + assembly._ConfiguredOptimizerFactory.
    total_steps = args.warmup + args.steps
    parallel = ParallelConfig.from_distributed(tp_size=1)

    def optimizer_factory(module):
        return BF16Optimizer(module, lr=args.lr, max_grad_norm=0.5, warmup_ratio=0.015,
                             lr_scheduler="cosine", total_steps=total_steps,
                             offload_master=False)

    backend = FSDPTrainingBackend(parallel, optimizer_factory=optimizer_factory)
    wrapped = backend.prepare_model(model, wrap=(wrap == "fsdp"),
                                    optimizer_target=model.draft_model)
    strategy = DFlashTrainStrategy(wrapped)
    core = TrainerCore(strategy, backend, accumulation_steps=1)
    trainable = sum(p.numel() for p in model.draft_model.parameters() if p.requires_grad)

    b = pc.make_batch(args, device, torch)
    batch = TrainBatch(sample_ids=["bench-0"], strategy="dflash", tensors={
        "input_ids": b["input_ids"].unsqueeze(0),
        "loss_mask": b["loss_mask"].unsqueeze(0),
        "hidden_states": b["features"].unsqueeze(0),
    })
    pc.sync(torch, device)
    setup_s = time.perf_counter() - t_setup

    state = {"step": 0, "result": None}

    def step():
        r = core.train_step(batch, StepContext(global_step=state["step"],
                                               total_steps=total_steps))
        assert r.optimizer_stepped
        state["step"] += 1
        state["result"] = r
        return r.loss

    ms, losses = pc.run_steps(torch, device, step, args.warmup, args.steps)
    # The anchors SpecForge drew: min(num_anchors, candidates), the same count every step.
    valid = (b["loss_mask"][:-1] > 0.5) & (b["loss_mask"][1:] > 0.5)
    anchors = min(args.anchors, int(valid.sum()))
    attn_note = {
        "flex_attention": "transformers flex_attention_forward: flex_attention torch.compiled, "
                          "BlockMask by create_block_mask every step, rest eager",
        "sdpa": "transformers sdpa_attention_forward over SpecForge's dense bool DFlash mask "
                "(create_dflash_sdpa_mask), all eager",
        "eager": "eager softmax attention over the dense DFlash mask",
    }[args.attention_backend]
    notes = (
        f"SpecForge's own DFlashDraftModel + OnlineDFlashModel + TrainerCore/FSDPTrainingBackend/"
        f"BF16Optimizer; wrap={wrap}; attention={args.attention_backend} ({attn_note}); "
        f"bf16 params and "
        f"compute, fp32 AdamW masters (lr {args.lr}, wd 0, clip 0.5, cosine); loss: chunked "
        f"({args.objective_chunk_blocks} blocks) checkpointed full-vocab CE on hard labels, no "
        f"decay; batch: the {len(b['doc_lengths'])} packed documents as one unpacked row "
        f"(no document mask), anchors drawn by SpecForge every step; random weights"
    )
    pc.report(torch, device, args, IMPL, ms, losses, anchors, setup_s, notes, extra={
        "trainable_params": trainable, "wrap": wrap, "documents": len(b["doc_lengths"]),
        "grad_norm_last": state["result"].grad_norm,
        "accuracy_last": state["result"].metrics.get("acc"),
    })
    if wrap == "fsdp":
        from specforge.distributed import destroy_distributed
        destroy_distributed()


if __name__ == "__main__":
    main()
