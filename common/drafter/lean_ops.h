// Memory-lean differentiable ops of the drafter's layers (docs/memory.md, "drafter activations").
//
// With bf16 compute and fp32 master weights, plain autograd over `linear(x, w.to(bf16))` keeps the
// bf16 copy of every weight from the forward to the backward (2 bytes per parameter: 1.95 GiB for
// a 5-layer Qwen3-8B-shaped drafter), and a SwiGLU MLP keeps four [rows, intermediate] tensors
// (gate, silu(gate), up and their product). These ops keep only what the backward cannot
// recompute cheaply: the inputs and the fp32 master weights (alive anyway); the backward casts the
// weight again (a memory-bound pass, about 1 ms per step at that shape) and recomputes
// silu(gate) * up. The arithmetic is that of the plain autograd graph, op for op: the results
// match it to rounding (tests/drafter/lean_ops_test.cc).
//
// When `dtype` is the weight's own dtype there is no cast to save: CastLinear is plain linear;
// SwiGluMlp still recomputes silu(gate) * up.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <functional>
#include <vector>

namespace dflash::drafter {

// x [..., In] in `dtype`, weight [Out, In] (any floating dtype, usually fp32 master) ->
// x weight^T [..., Out] in `dtype`. Differentiable in x and weight (weight's gradient arrives in
// weight's dtype).
at::Tensor CastLinear(const at::Tensor& x, const at::Tensor& weight, c10::ScalarType dtype);

// x weights[i]^T for every i, as CastLinear each (or with `fp8` as fp8_linear.h's GEMMs), in one
// autograd node: x's gradient is the products' sum, each added by its GEMM into the previous
// (no add passes), and in fp8 x is quantized once (rows forward, columns for the weight
// gradients) instead of once per weight. The outputs' values are CastLinear's / Fp8Linear's.
std::vector<at::Tensor> SharedInputLinear(const at::Tensor& x,
                                          const std::vector<at::Tensor>& weights,
                                          c10::ScalarType dtype, bool fp8);

// down(silu(gate(h)) * up(h)): h [N, H] in `dtype`; gate, up [I, H], down [H, I]. Keeps h and the
// two [N, I] projections for the backward (not silu(gate) or the product); with
// `recompute_projections` only h, and the backward computes the two projections again (two of the
// MLP's three forward GEMMs: 2 [N, I] tensors less kept, for about a third more MLP backward work).
// With `fp8` its six GEMMs are fp8_linear.h's (the same tensors kept), h quantized once for gate
// and up (rows forward, columns for their weight gradients). Otherwise dh = dg gate + du up is one
// GEMM adding into the other's output. On CUDA silu(g) * u and its two gradients run in one pass
// each (common/kernels/swiglu: fp32 arithmetic, one rounding).
at::Tensor SwiGluMlp(const at::Tensor& h, const at::Tensor& gate, const at::Tensor& up,
                     const at::Tensor& down, c10::ScalarType dtype,
                     bool recompute_projections = false, bool fp8 = false);

// DFlash2's candidate logits (docs/method.md §2.2): out[s][k] = <table[index[s][k]], hidden[s]>,
// computed in table's dtype and returned in fp32, `chunk_rows` rows at a time. hidden [S, H],
// table [V, H] (the frozen lm_head: no gradient), index [S, K] int64. Differentiable in hidden; the
// backward gathers each chunk's K table rows again instead of keeping all S x K x H of them (1 GiB
// at 8192 rows, K 16, H 4096 in bf16) from the forward.
at::Tensor GatheredRowLogits(const at::Tensor& hidden, const at::Tensor& table,
                             const at::Tensor& index, int64_t chunk_rows);

// Activation checkpointing: out = fn(inputs), keeping only `inputs` for the backward, which runs
// fn again with recording and back-propagates through it (one more forward of fn per step; fn
// must compute the same values again: no randomness). `weights` are the leaf tensors fn reads by
// capture; their gradients arrive through this op like any other (accumulated by the outer
// backward, post-accumulate hooks included). Without grad mode, plainly fn(inputs).
at::Tensor Checkpoint(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fn,
                      const std::vector<at::Tensor>& inputs,
                      const std::vector<at::Tensor>& weights);

}  // namespace dflash::drafter
