// How far drafter.precision: fp8's gradients are from bf16's, on the CPU's emulation of the fp8
// arithmetic (common/drafter/fp8_linear.h: the same rowwise e4m3 quantization, products of the
// dequantized operands): one forward + loss + backward of the same drafter (Qwen3-8B's shape by
// default, random weights) on the same batch in bf16, in fp8, and in bf16 with the features
// scaled by 1 + --perturb (what rounding noise alone does), then per parameter the gradient's
// norm-relative distance ||g - g_bf16|| / ||g_bf16|| and the norm ratio. The figures of
// docs/benchmarks-training.md, "fp8 projections". CPU only (the GPU's fp8 GEMMs are compared with
// this emulation by drafter_gpu_test).
//
// Usage: fp8_grad_error [--target builtin:qwen3-8b-random] [--layers 2] [--tokens 256]
//          [--anchors 16] [--perturb-ppm 4000] [--seed 3] [--json FILE]
#include <ATen/TensorOperators.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/drafter/drafter_model.h"
#include "common/model/builtin_config.h"
#include "common/model/hf_config.h"
#include "nlohmann/json.hpp"
#include "scripts/bench/bench_flags.h"

namespace {

using dflash::bench::Flag;
using dflash::bench::StrFlag;
namespace drafter = dflash::drafter;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "fp8_grad_error: %s\n", what.c_str());
  std::exit(1);
}

// One forward + loss + backward of a fresh drafter; `visit` sees every parameter's gradient (the
// model and its gradients are freed on return: three sets of a 5-layer drafter's fp32 gradients
// would not fit beside each other in 24 GiB).
double RunAndVisit(const drafter::DrafterConfig& c, bool fp8, uint64_t seed,
                   const drafter::DrafterBatch& batch, const at::Tensor& embed,
                   const at::Tensor& head,
                   const std::function<void(const std::string&, const at::Tensor&)>& visit) {
  drafter::DrafterOptions o;
  o.compute_dtype = at::kBFloat16;
  o.fp8 = fp8;
  o.seed = seed;
  auto model = drafter::DrafterModel::Create(c, o, embed, head);
  if (!model.ok()) Die(model.status().ToString());
  auto hidden = (*model)->Forward(batch);
  if (!hidden.ok()) Die(hidden.status().ToString());
  drafter::LossOptions lo;
  lo.gamma = 7.0;
  auto l = (*model)->Loss(batch, *hidden, lo);
  if (!l.ok()) Die(l.status().ToString());
  l->numerator.backward();
  for (const drafter::NamedParameter& p : (*model)->parameters()) visit(p.name, p.tensor.grad());
  return l->numerator.item<double>() / l->denominator.item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  dflash::bench::RequireKnownFlags(
      argc, argv,
      {"--target", "--layers", "--tokens", "--anchors", "--perturb-ppm", "--seed", "--json"},
      "fp8_grad_error");
  const std::string target = StrFlag(argc, argv, "--target", "builtin:qwen3-8b-random");
  const int64_t layers = Flag(argc, argv, "--layers", 2),
                tokens = Flag(argc, argv, "--tokens", 256);
  const int64_t anchors = Flag(argc, argv, "--anchors", 16);
  const double perturb = static_cast<double>(Flag(argc, argv, "--perturb-ppm", 4000)) * 1e-6;
  const uint64_t seed = static_cast<uint64_t>(Flag(argc, argv, "--seed", 3));
  absl::StatusOr<dflash::model::TransformerConfig> tc =
      dflash::model::BuiltinTargetConfig(target.substr(target.find(':') + 1));
  if (!tc.ok()) Die("--target " + target + ": " + tc.status().ToString());
  const int64_t block = 16;
  if (tokens <= block + 2 || anchors < 1 || layers < 1) {
    Die("--anchors and --layers must be positive and --tokens above the block size + 2");
  }
  drafter::DrafterConfig c;
  c.target = *tc;
  c.num_layers = layers;
  c.block_size = block;
  c.mask_token_id = 1;
  c.target_layer_ids = dflash::model::DefaultTargetLayerIds(tc->num_hidden_layers, 5);
  // Two documents; anchors spread over the first tokens - block of the batch.
  at::manual_seed(static_cast<int64_t>(seed));
  const at::Tensor features = at::randn({tokens, c.feature_dim()}).to(at::kBFloat16);
  const int64_t first = tokens / 3;
  std::vector<int64_t> positions;
  for (int64_t len : {first, tokens - first}) {
    for (int64_t p = 0; p < len; ++p) positions.push_back(p);
  }
  std::vector<int64_t> anchor_list;
  const int64_t span = std::max<int64_t>(1, tokens - block);
  for (int64_t a = 0; a < anchors; ++a) anchor_list.push_back(a * span / anchors);
  const at::Tensor ids =
      at::randint(16, std::min<int64_t>(tc->vocab_size, 150000), {tokens}, at::kLong);
  at::Generator gen = at::detail::createCPUGenerator(seed + 74);
  const at::Tensor embed =
      (at::randn({tc->vocab_size, tc->hidden_size}, gen) * 0.02).to(at::kBFloat16);
  const at::Tensor head =
      (at::randn({tc->vocab_size, tc->hidden_size}, gen) * 0.02).to(at::kBFloat16);
  auto batch_of = [&](const at::Tensor& f) {
    return drafter::DrafterBatch{f,
                                 ids,
                                 at::tensor(positions, at::kLong),
                                 at::tensor(std::vector<int32_t>{0, static_cast<int32_t>(first),
                                                                 static_cast<int32_t>(tokens)},
                                            at::kInt),
                                 at::tensor(anchor_list, at::kLong),
                                 at::ones({tokens}, at::kLong),
                                 at::Tensor()};  // block_lengths: every block whole
  };
  // The bf16 gradients kept; the other two compared parameter by parameter as they come.
  std::map<std::string, at::Tensor> bf16;
  const double loss_bf16 =
      RunAndVisit(c, false, seed, batch_of(features), embed, head,
                  [&](const std::string& n, const at::Tensor& g) { bf16[n] = g.clone(); });
  std::map<std::string, double> fp8_err, fp8_norm, moved_err;
  auto distance = [&](const std::string& n, const at::Tensor& g) {
    return (g.to(at::kDouble) - bf16.at(n).to(at::kDouble)).norm().item<double>() /
           bf16.at(n).to(at::kDouble).norm().item<double>();
  };
  const double loss_fp8 = RunAndVisit(c, true, seed, batch_of(features), embed, head,
                                      [&](const std::string& n, const at::Tensor& g) {
                                        fp8_err[n] = distance(n, g);
                                        fp8_norm[n] = g.to(at::kDouble).norm().item<double>();
                                      });
  const double loss_moved = RunAndVisit(
      c, false, seed, batch_of((features * (1 + perturb)).to(at::kBFloat16)), embed, head,
      [&](const std::string& n, const at::Tensor& g) { moved_err[n] = distance(n, g); });
  nlohmann::json out = {{"target", target},     {"layers", layers},
                        {"tokens", tokens},     {"anchors", anchors},
                        {"perturb", perturb},   {"loss_bf16", loss_bf16},
                        {"loss_fp8", loss_fp8}, {"loss_perturbed", loss_moved}};
  std::printf("%-44s %14s %14s %12s\n", "parameter", "fp8 vs bf16", "bf16 perturbed",
              "fp8 norm / bf16");
  double total_bf16 = 0, total_fp8 = 0;
  for (const auto& [name, g] : bf16) {
    const double ref = g.to(at::kDouble).norm().item<double>();
    const double n8 = fp8_norm.at(name);
    total_bf16 += ref * ref;
    total_fp8 += n8 * n8;
    std::printf("%-44s %14.4f %14.4f %12.4f\n", name.c_str(), fp8_err.at(name), moved_err.at(name),
                n8 / ref);
    out["parameters"][name] = {{"fp8_vs_bf16", fp8_err.at(name)},
                               {"bf16_perturbed", moved_err.at(name)},
                               {"norm_ratio", n8 / ref}};
  }
  std::printf("loss bf16 %.6f, fp8 %.6f, bf16 perturbed %.6f; gradient norm bf16 %.4f, fp8 %.4f\n",
              loss_bf16, loss_fp8, loss_moved, std::sqrt(total_bf16), std::sqrt(total_fp8));
  out["grad_norm_bf16"] = std::sqrt(total_bf16);
  out["grad_norm_fp8"] = std::sqrt(total_fp8);
  const std::string json_path = StrFlag(argc, argv, "--json");
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(1) << "\n";
  return 0;
}
