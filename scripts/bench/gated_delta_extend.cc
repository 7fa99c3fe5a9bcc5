// One linear-attention (gated delta rule) layer's prefill for generation, the two forms of
// nn::GatedDeltaNetExtend side by side: the recurrence token by token (what every extension ran
// before 27b6978) and the chunked form from each sequence's held state (what extensions of 32+
// rows run now). Shape: builtin:qwen3.5-27b-random's linear-attention layer (H 5120, 16 key and 48
// value heads of 128, conv kernel 4), random weights; --batch sequences of --tokens new rows
// each, from random held conv rows and states. Prints one JSON line: ms per call of each form
// (median of --runs after one warm-up), their ratio, and the largest relative difference of the
// outputs and of the states (the forms must agree).
//
// Usage: gated_delta_extend [--tokens 2048] [--batch 4] [--runs 3] [--device cuda|cpu]
//          [--dtype bfloat16|float32]
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <c10/core/Device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/nn/gated_delta.h"
#include "nlohmann/json.hpp"
#include "scripts/bench/bench_device.h"
#include "scripts/bench/bench_flags.h"

namespace {

using dflash::bench::Flag;
using dflash::bench::StrFlag;
namespace nn = dflash::nn;

double RelDiff(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kFloat), y = b.to(at::kFloat);
  return (x - y).abs().max().item<double>() / std::max(1e-30, y.abs().max().item<double>());
}

}  // namespace

int main(int argc, char** argv) {
  dflash::bench::RequireKnownFlags(
      argc, argv, {"--tokens", "--batch", "--runs", "--device", "--dtype"}, "gated_delta_extend");
  const int64_t tokens = Flag(argc, argv, "--tokens", 2048), batch = Flag(argc, argv, "--batch", 4);
  const int64_t runs = std::max<int64_t>(1, Flag(argc, argv, "--runs", 3));
  const std::string dtype_name = StrFlag(argc, argv, "--dtype", "bfloat16");
  dflash::bench::RequireOneOf(dtype_name, {"bfloat16", "float32"}, "--dtype", "gated_delta_extend");
  const c10::Device device(StrFlag(argc, argv, "--device", "cuda"));
  if (tokens < 1 || batch < 1) {
    std::fprintf(stderr, "gated_delta_extend: --tokens and --batch must be >= 1\n");
    return 1;
  }
  const c10::ScalarType dtype = dtype_name == "float32" ? at::kFloat : at::kBFloat16;
  at::NoGradGuard no_grad;
  at::manual_seed(1);
  nn::GatedDeltaDims d;
  d.num_k_heads = 16;
  d.num_v_heads = 48;
  d.k_head_dim = 128;
  d.v_head_dim = 128;
  d.conv_kernel = 4;
  const int64_t h = 5120;
  const at::TensorOptions o = at::TensorOptions().dtype(dtype).device(device);
  const at::TensorOptions f32 = o.dtype(at::kFloat);
  nn::GatedDeltaWeights w;
  w.in_proj = at::randn({d.in_proj_rows(), h}, o) * (1.0 / 72);
  w.conv = at::randn({d.conv_dim(), d.conv_kernel}, o) * 0.5;
  w.dt_bias = at::randn({d.num_v_heads}, f32) * 0.5;
  w.a_log = at::rand({d.num_v_heads}, f32) * 2 - 1;
  w.norm = at::rand({d.v_head_dim}, o) + 0.5;
  w.out_proj = at::randn({h, d.value_dim()}, o) * (1.0 / 78);
  const at::Tensor x = at::randn({batch * tokens, h}, o);
  const at::Tensor conv0 = at::randn({batch, d.conv_kernel - 1, d.conv_dim()}, o);
  const at::Tensor state0 =
      at::randn({batch, d.num_v_heads, d.k_head_dim, d.v_head_dim}, f32) * 0.1;
  std::vector<int64_t> sequences, offsets = {0};
  for (int64_t i = 0; i < batch; ++i) {
    sequences.push_back(i);
    offsets.push_back(offsets.back() + tokens);
  }
  // chunked_from: 1 takes the chunked form for any extension, a huge value the recurrence.
  auto run = [&](int64_t chunked_from, at::Tensor* out, at::Tensor* state) {
    std::vector<double> ms;
    for (int64_t r = 0; r <= runs; ++r) {
      at::Tensor conv = conv0.clone();
      *state = state0.clone();
      dflash::bench::Synchronize(device);
      const auto t0 = std::chrono::steady_clock::now();
      *out = nn::GatedDeltaNetExtend(x, w, d, sequences, offsets, &conv, state, chunked_from);
      dflash::bench::Synchronize(device);
      if (r > 0) {
        ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
      }
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  at::Tensor out_rec, state_rec, out_chunk, state_chunk;
  const double recurrent = run(int64_t{1} << 40, &out_rec, &state_rec);
  const double chunked = run(1, &out_chunk, &state_chunk);
  const nlohmann::json j = {{"tokens", tokens},
                            {"batch", batch},
                            {"dtype", dtype_name},
                            {"device", device.str()},
                            {"recurrent_ms", recurrent},
                            {"chunked_ms", chunked},
                            {"speedup", recurrent / chunked},
                            {"max_rel_diff_out", RelDiff(out_chunk, out_rec)},
                            {"max_rel_diff_state", RelDiff(state_chunk, state_rec)}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
