// The drafter's step in speculative decoding, with and without its cache of context keys and
// values (DrafterModel::ForwardCached against Forward over the whole context; docs/method.md,
// "Drafting with a cache"): --batch sequences start from --prompt context rows and each block adds
// --accept rows (the tokens a verification keeps plus its bonus), for --blocks blocks. The whole
// path packs every sequence's context and runs Forward, as speculative decoding did before the
// cache; the cached path hands ForwardCached only the new rows. The same random drafter
// (the target's shape, --layers layers, block --block), features and tokens for both.
//
// Reports one JSON line (and --json FILE): mean ms per block of each path over all blocks (the
// first --warmup blocks excluded), the speed-up, the context rows at the end, and the largest
// relative difference between the two paths' hidden states on the last block (they must agree).
//
// Usage: draft_cache [--target builtin:qwen3-8b-random] [--dtype bfloat16] [--layers 5]
//          [--block 16] [--batch 1] [--prompt 512] [--accept 4] [--blocks 64] [--warmup 4]
//          [--device cuda|cpu] [--json FILE]
// CPU smoke geometry: --target builtin:tiny-qwen3 --dtype float32 --device cpu --layers 1
//   --block 8 --prompt 64 --blocks 8 --warmup 1
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/Device.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/drafter/drafter_model.h"
#include "common/model/builtin_config.h"
#include "common/model/hf_config.h"
#include "nlohmann/json.hpp"
#include "scripts/bench/bench_device.h"
#include "scripts/bench/bench_flags.h"

namespace {

using dflash::bench::Flag;
using dflash::bench::StrFlag;
namespace drafter = dflash::drafter;

// Forward over each sequence's whole context, as speculative decoding packed it before the cache.
at::Tensor WholeContext(const drafter::DrafterModel& m, const std::vector<at::Tensor>& contexts,
                        const std::vector<std::vector<int64_t>>& tokens) {
  absl::StatusOr<at::Tensor> out =
      m.Forward(drafter::DecodingBatch(contexts, tokens, {}, m.config().block_size));
  if (!out.ok()) {
    std::fprintf(stderr, "draft_cache: %s\n", out.status().ToString().c_str());
    std::exit(1);
  }
  return *out;
}

}  // namespace

int main(int argc, char** argv) {
  dflash::bench::RequireKnownFlags(
      argc, argv,
      {"--target", "--dtype", "--layers", "--block", "--batch", "--prompt", "--accept", "--blocks",
       "--warmup", "--device", "--json"},
      "draft_cache");
  const std::string target = StrFlag(argc, argv, "--target", "builtin:qwen3-8b-random");
  const std::string dtype_name = StrFlag(argc, argv, "--dtype", "bfloat16");
  dflash::bench::RequireOneOf(dtype_name, {"bfloat16", "float16", "float32"}, "--dtype",
                              "draft_cache");
  const int64_t batch = Flag(argc, argv, "--batch", 1), prompt = Flag(argc, argv, "--prompt", 512);
  const int64_t accept = Flag(argc, argv, "--accept", 4), blocks = Flag(argc, argv, "--blocks", 64);
  const int64_t warmup = Flag(argc, argv, "--warmup", 4);
  const c10::Device device(StrFlag(argc, argv, "--device", "cuda"));
  absl::StatusOr<dflash::model::TransformerConfig> tc =
      dflash::model::BuiltinTargetConfig(target.substr(target.find(':') + 1));
  if (!tc.ok()) {
    std::fprintf(stderr, "draft_cache: --target %s: %s\n", target.c_str(),
                 tc.status().ToString().c_str());
    return 1;
  }
  const c10::ScalarType dtype = dtype_name == "float32"   ? at::kFloat
                                : dtype_name == "float16" ? at::kHalf
                                                          : at::kBFloat16;
  drafter::DrafterConfig config;
  config.target = *tc;
  config.num_layers = Flag(argc, argv, "--layers", 5);
  config.block_size = Flag(argc, argv, "--block", 16);
  config.mask_token_id = 1;
  // K = 5 feature layers by the project's default rule (target.layer_ids: auto).
  config.target_layer_ids = dflash::model::DefaultTargetLayerIds(tc->num_hidden_layers, 5);
  drafter::DrafterOptions options;
  options.device = device;
  options.dtype = dtype;  // weights in the compute dtype, as spec::SetInferenceDrafterOptions
  const at::Tensor embed =
      at::randn({tc->vocab_size, tc->hidden_size}, at::TensorOptions().dtype(dtype).device(device));
  absl::StatusOr<std::unique_ptr<drafter::DrafterModel>> made =
      drafter::DrafterModel::Create(config, options, embed, embed);
  if (!made.ok()) {
    std::fprintf(stderr, "draft_cache: %s\n", made.status().ToString().c_str());
    return 1;
  }
  const drafter::DrafterModel& m = **made;
  const int64_t k = config.feature_dim();
  const at::TensorOptions fopts = at::TensorOptions().dtype(dtype).device(device);
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> contexts(batch), added(batch);
  std::vector<std::vector<int64_t>> tokens(batch);
  std::vector<drafter::DrafterKvCache> caches(batch);
  double whole_ms = 0, cached_ms = 0, last_diff = 0;
  for (int64_t block = 0; block < blocks; ++block) {
    for (int64_t j = 0; j < batch; ++j) {
      const int64_t rows = block == 0 ? prompt : accept;
      added[j] = at::randn({rows, k}, fopts);
      contexts[j] = block == 0 ? added[j] : at::cat({contexts[j], added[j]}, 0);
      for (int64_t r = 0; r < rows + (block == 0 ? 1 : 0); ++r)
        tokens[j].push_back(2 + (r * 7 + j) % 1000);
    }
    dflash::bench::Synchronize(device);
    auto t0 = std::chrono::steady_clock::now();
    const at::Tensor whole = WholeContext(m, contexts, tokens);
    dflash::bench::Synchronize(device);
    auto t1 = std::chrono::steady_clock::now();
    std::vector<drafter::CachedBlock> cb(batch);
    for (int64_t j = 0; j < batch; ++j) {
      cb[j].cache = &caches[j];
      // As SpeculativeGenerate reserves: every row the sequence reaches, its anchor and a block.
      caches[j].reserve = prompt + (blocks - 1) * accept + 1 + config.block_size;
      cb[j].new_features = added[j];
      cb[j].anchor_token = tokens[j].back();
    }
    absl::StatusOr<at::Tensor> cached = m.ForwardCached(cb);
    dflash::bench::Synchronize(device);
    auto t2 = std::chrono::steady_clock::now();
    if (!cached.ok()) {
      std::fprintf(stderr, "draft_cache: %s\n", cached.status().ToString().c_str());
      return 1;
    }
    if (block >= warmup) {
      whole_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
      cached_ms += std::chrono::duration<double, std::milli>(t2 - t1).count();
    }
    if (block + 1 == blocks) {
      const at::Tensor a = cached->to(at::kFloat), b = whole.to(at::kFloat);
      last_diff =
          (a - b).abs().max().item<double>() / std::max(1e-30, b.abs().max().item<double>());
    }
  }
  const double timed = static_cast<double>(std::max<int64_t>(1, blocks - warmup));
  nlohmann::json out = {{"target", target},
                        {"dtype", dtype_name},
                        {"layers", config.num_layers},
                        {"block", config.block_size},
                        {"batch", batch},
                        {"prompt", prompt},
                        {"accept", accept},
                        {"blocks", blocks},
                        {"context_rows_at_end", prompt + (blocks - 1) * accept},
                        {"whole_ms_per_block", whole_ms / timed},
                        {"cached_ms_per_block", cached_ms / timed},
                        {"speedup", cached_ms > 0 ? whole_ms / cached_ms : 0.0},
                        {"max_rel_diff_last_block", last_diff},
                        {"device", device.str()}};
  std::printf("%s\n", out.dump().c_str());
  const std::string json_path = StrFlag(argc, argv, "--json");
  if (!json_path.empty()) std::ofstream(json_path) << out.dump() << "\n";
  if (!std::isfinite(last_diff)) {
    std::fprintf(stderr, "draft_cache: the cached hidden states are not finite\n");
    return 1;
  }
  return 0;
}
