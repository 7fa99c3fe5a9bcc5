// Speculative decoding end to end, with and without the drafter's cache of context keys and
// values (SpecDecodeOptions::drafter_kv_cache; docs/method.md, "Drafting with a cache"): a built-in
// target loaded whole (as `dflashctl eval` loads it) and a random drafter of the target's shape
// decode --batch prompts of --prompt tokens for --new tokens each, greedily, once with the cache
// and once without, alternating --rounds times after one short warm-up decode each.
//
// The drafter is untrained, so the target accepts few proposals and a verification emits about
// one token: the figure is decoding's cost per verification (the target's forward over a block,
// the drafter's forward, the bookkeeping), the case where the drafter's share is largest. Both
// settings must emit the same tokens (greedy decoding is lossless either way); the bench refuses
// to report otherwise.
//
// Reports one JSON line (and --json FILE): per setting the median over rounds of new tokens per
// second, of the seconds in the drafter (draft_seconds) and in the verifications, and tau.
//
// Usage: spec_decode [--target builtin:qwen3-8b-random] [--dtype bfloat16] [--layers 5]
//          [--block 16] [--batch 1] [--prompt 512] [--new 128] [--rounds 3] [--device cuda]
//          [--profile 0|1] [--profile-new 16] [--json FILE]
// --profile 1 (CUDA): one more decode with the cache under the kernel profiler
// (kernel_profile.h, with the host's ops), of --profile-new tokens (default 16: a whole decode of
// batch 64 x 128 tokens is some 10^6 profiler events, which Kineto did not process within 200 s
// on an H100): its device time by category, the longest kernels and the longest idle gaps with
// what the host did meanwhile, in the JSON and on stderr.
// CPU smoke geometry: --target builtin:tiny-qwen3 --dtype float32 --device cpu --layers 1
//   --block 4 --batch 2 --prompt 16 --new 8 --rounds 1
#include <ATen/Context.h>
#include <ATen/ops/randint.h>
#include <c10/core/Device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/drafter/drafter_model.h"
#include "common/model/builtin_config.h"
#include "common/nn/builtin_target.h"
#include "common/nn/target_model.h"
#include "common/spec/speculative.h"
#include "nlohmann/json.hpp"
#include "scripts/bench/bench_flags.h"
#include "common/device/kernel_profile.h"

namespace {

using dflash::bench::Flag;
using dflash::bench::StrFlag;
namespace drafter = dflash::drafter;
namespace spec = dflash::spec;

[[noreturn]] void Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "spec_decode: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

struct Timed {
  spec::SpecDecodeResult result;
  double seconds = 0;
};

Timed Decode(const dflash::nn::TargetModel& target, const drafter::DrafterModel& draft,
             const std::vector<std::vector<int64_t>>& prompts, int64_t new_tokens, bool cache) {
  spec::SpecDecodeOptions options;
  options.max_new_tokens = new_tokens;
  options.drafter_kv_cache = cache;
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<spec::SpecDecodeResult> r =
      spec::SpeculativeGenerate(target, draft, prompts, options);
  const auto t1 = std::chrono::steady_clock::now();
  if (!r.ok()) Fail(cache ? "decode with the cache" : "decode without the cache", r.status());
  return {std::move(*r), std::chrono::duration<double>(t1 - t0).count()};
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int64_t NewTokens(const spec::SpecDecodeResult& r) {
  int64_t n = 0;
  for (const std::vector<int64_t>& t : r.tokens) n += static_cast<int64_t>(t.size());
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  dflash::bench::RequireKnownFlags(
      argc, argv,
      {"--target", "--dtype", "--layers", "--block", "--batch", "--prompt", "--new", "--rounds",
       "--device", "--profile", "--profile-new", "--json"},
      "spec_decode");
  const std::string target_name = StrFlag(argc, argv, "--target", "builtin:qwen3-8b-random");
  const std::string dtype_name = StrFlag(argc, argv, "--dtype", "bfloat16");
  dflash::bench::RequireOneOf(dtype_name, {"bfloat16", "float16", "float32"}, "--dtype",
                              "spec_decode");
  const int64_t batch = Flag(argc, argv, "--batch", 1), prompt = Flag(argc, argv, "--prompt", 512);
  const int64_t new_tokens = Flag(argc, argv, "--new", 128);
  const int64_t rounds = std::max<int64_t>(1, Flag(argc, argv, "--rounds", 3));
  const int64_t profile_new = Flag(argc, argv, "--profile-new", 16);
  if (profile_new < 1) Fail("--profile-new", absl::InvalidArgumentError("must be >= 1"));
  const c10::Device device(StrFlag(argc, argv, "--device", "cuda"));
  if (target_name.rfind("builtin:", 0) != 0) {
    std::fprintf(stderr, "spec_decode: --target %s: only builtin:NAME targets\n",
                 target_name.c_str());
    return 1;
  }
  const std::string name = target_name.substr(8);
  dflash::nn::TargetModelOptions topts;
  topts.full = true;  // every layer and the final norm: the target generates
  topts.device = device;
  topts.dtype = dtype_name == "float32"   ? at::kFloat
                : dtype_name == "float16" ? at::kHalf
                                          : at::kBFloat16;
  absl::StatusOr<std::unique_ptr<dflash::nn::TargetModel>> target =
      dflash::nn::BuiltinTarget(name, topts);
  if (!target.ok()) Fail("--target " + target_name, target.status());
  const dflash::model::TransformerConfig& tc = (*target)->config();
  drafter::DrafterConfig config;
  config.target = tc;
  config.num_layers = Flag(argc, argv, "--layers", 5);
  config.block_size = Flag(argc, argv, "--block", 16);
  config.mask_token_id = 1;
  config.target_layer_ids = (*target)->layer_ids();
  drafter::DrafterOptions dopts;  // as dflashctl eval loads a drafter
  dflash::spec::SetInferenceDrafterOptions(**target, &dopts);
  absl::StatusOr<std::unique_ptr<drafter::DrafterModel>> draft =
      drafter::DrafterModel::Create(config, dopts, (*target)->embed_tokens(), (*target)->lm_head());
  if (!draft.ok()) Fail("drafter", draft.status());

  // Prompts of random ids (a fixed seed), away from the special ids at the vocabulary's ends.
  at::manual_seed(7);
  std::vector<std::vector<int64_t>> prompts(batch);
  for (int64_t j = 0; j < batch; ++j) {
    const at::Tensor ids = at::randint(2, std::min<int64_t>(tc.vocab_size, 100000), {prompt});
    prompts[j].assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + prompt);
  }
  Decode(**target, **draft, prompts, 8, true);  // warm-up: kernels, allocator, caches
  Decode(**target, **draft, prompts, 8, false);
  std::vector<double> tps[2], draft_s[2], verify_s[2];
  double tau[2] = {0, 0};
  std::vector<std::vector<int64_t>> first;
  for (int64_t r = 0; r < rounds; ++r) {
    for (int c = 0; c < 2; ++c) {  // alternating: 0 with the cache, 1 without
      const Timed t = Decode(**target, **draft, prompts, new_tokens, c == 0);
      if (first.empty()) first = t.result.tokens;
      if (t.result.tokens != first) {
        std::fprintf(stderr, "spec_decode: the two settings emitted different tokens\n");
        return 1;
      }
      tps[c].push_back(static_cast<double>(NewTokens(t.result)) / t.seconds);
      draft_s[c].push_back(t.result.draft_seconds);
      verify_s[c].push_back(t.result.verify_seconds);
      tau[c] = t.result.stats.tau_pooled();
    }
  }
  auto side = [&](int c) {
    return nlohmann::json{{"tokens_per_s", Median(tps[c])},
                          {"draft_seconds", Median(draft_s[c])},
                          {"verify_seconds", Median(verify_s[c])},
                          {"tau", tau[c]}};
  };
  std::string profile = "null";
  if (Flag(argc, argv, "--profile", 0) == 1 && device.is_cuda()) {
    absl::StatusOr<dflash::device::KernelProfile> p = dflash::device::ProfileKernels(
        [&] { Decode(**target, **draft, prompts, profile_new, true); }, /*host_ops=*/true);
    if (!p.ok()) Fail("--profile", p.status());
    std::fprintf(stderr, "%s\n",
                 dflash::device::ProfileTable("decode with the cache", *p, 15).c_str());
    profile = dflash::device::ProfileJson(*p, 15);
  }
  nlohmann::json out = {{"target", target_name},
                        {"dtype", dtype_name},
                        {"layers", config.num_layers},
                        {"block", config.block_size},
                        {"batch", batch},
                        {"prompt", prompt},
                        {"new", new_tokens},
                        {"rounds", rounds},
                        {"cache", side(0)},
                        {"no_cache", side(1)},
                        {"speedup", Median(tps[1]) > 0 ? Median(tps[0]) / Median(tps[1]) : 0.0},
                        {"profile_new", profile_new},
                        {"device", device.str()}};
  out["profile"] = nlohmann::json::parse(profile);
  std::printf("%s\n", out.dump().c_str());
  const std::string json_path = StrFlag(argc, argv, "--json");
  if (!json_path.empty()) std::ofstream(json_path) << out.dump() << "\n";
  return 0;
}
