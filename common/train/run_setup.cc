#include "common/train/run_setup.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/drafter/fp8_linear.h"
#include "common/nn/builtin_target.h"
#include "common/plan/memory_plan.h"

namespace dflash::train {
namespace {

constexpr char kBuiltin[] = "builtin:";

bool IsBuiltin(const std::string& path) { return absl::StartsWith(path, kBuiltin); }
std::string BuiltinName(const std::string& path) { return path.substr(sizeof(kBuiltin) - 1); }

}  // namespace

absl::StatusOr<drafter::DrafterConfig> RunDrafterConfig(const config::RunSpec& spec,
                                                        const model::TransformerConfig& target) {
  drafter::DrafterConfig c;
  c.target = target;
  c.num_layers = spec.drafter.layers;
  c.block_size = spec.drafter.block_size;
  absl::StatusOr<std::vector<int64_t>> ids = run::RunLayerIds(spec, target);
  if (!ids.ok()) return ids.status();
  c.target_layer_ids = *ids;
  absl::StatusOr<int64_t> mask = run::RunMaskTokenId(spec, target);
  if (!mask.ok()) return mask.status();
  c.mask_token_id = *mask;
  absl::StatusOr<run::SlidingLayers> sliding = run::RunSlidingLayers(spec);
  if (!sliding.ok()) return sliding.status();
  drafter::SetSlidingLayers(&c, sliding->layers, sliding->window);
  const config::Dflash2Settings two = config::ResolvedDflash2(spec.drafter);
  c.conv_kernel_size = two.conv_kernel_size;
  c.conv_group_size = two.conv_group_size;
  c.selector_rank = two.selector_rank;
  c.selector_top_k = two.selector_top_k;
  if (absl::Status s = drafter::ValidateDrafterConfig(c); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("drafter: ", s.message()));
  }
  return c;
}

absl::StatusOr<c10::ScalarType> RunTargetDtype(const config::RunSpec& spec) {
  if (spec.target.dtype == "bfloat16") return c10::ScalarType::BFloat16;
  if (spec.target.dtype == "float16") return c10::ScalarType::Half;
  if (spec.target.dtype == "float32") return c10::ScalarType::Float;
  return absl::InvalidArgumentError(
      absl::StrCat("target.dtype: '", spec.target.dtype, "' is not bfloat16, float16 or float32"));
}

absl::StatusOr<std::unique_ptr<nn::TargetModel>> LoadRunTarget(const config::RunSpec& spec,
                                                               c10::Device device,
                                                               bool embeddings_only, bool full,
                                                               const TargetShard& shard) {
  absl::StatusOr<model::TransformerConfig> config = run::RunTargetConfig(spec);
  if (!config.ok()) return config.status();
  nn::TargetModelOptions options;
  absl::StatusOr<std::vector<int64_t>> ids = run::RunLayerIds(spec, *config);
  if (!ids.ok()) return ids.status();
  options.layer_ids = embeddings_only ? std::vector<int64_t>{0} : *ids;
  absl::StatusOr<c10::ScalarType> dtype = RunTargetDtype(spec);
  if (!dtype.ok()) return dtype.status();
  options.dtype = *dtype;
  options.device = device;
  options.full = full && !embeddings_only;
  options.tp_rank = shard.rank;
  options.tp_world = shard.world;
  options.tp_all_reduce = shard.all_reduce;
  absl::StatusOr<std::unique_ptr<nn::TargetModel>> target =
      IsBuiltin(spec.target.path) ? nn::BuiltinTarget(BuiltinName(spec.target.path), options)
                                  : nn::TargetModel::Load(spec.target.path, options);
  if (!target.ok()) {
    return absl::Status(target.status().code(),
                        absl::StrCat("target.path: ", target.status().message()));
  }
  if (IsBuiltin(spec.target.path)) (*target)->set_source(spec.target.path);
  return target;
}

absl::StatusOr<std::unique_ptr<drafter::DrafterModel>> CreateRunDrafter(
    const config::RunSpec& spec, const nn::TargetModel& target, c10::Device device) {
  absl::StatusOr<drafter::DrafterConfig> config = RunDrafterConfig(spec, target.config());
  if (!config.ok()) return config.status();
  drafter::DrafterOptions options;
  options.device = device;
  options.seed = static_cast<uint64_t>(spec.seed);
  absl::StatusOr<c10::ScalarType> dtype = RunTargetDtype(spec);
  if (!dtype.ok()) return dtype.status();
  if (*dtype != c10::ScalarType::Float) options.compute_dtype = *dtype;
  const std::optional<drafter::Recompute> recompute =
      drafter::ParseRecompute(spec.drafter.recompute);
  if (!recompute) {
    return absl::InvalidArgumentError(absl::StrCat(
        "drafter.recompute: unknown value \"", spec.drafter.recompute, "\" (none, mlp or layers)"));
  }
  options.recompute = *recompute;
  options.fp8 = spec.drafter.precision == "fp8";
  if (options.fp8 && !drafter::Fp8MatmulInHardware(device)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "drafter.precision: fp8 runs on a GPU of compute capability 8.9 or later (Ada, Hopper, "
        "Blackwell); this drafter's device is ",
        device.str()));
  }
  return drafter::DrafterModel::Create(*config, options, target.embed_tokens(), target.lm_head());
}

std::string TargetDtypeName(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::BFloat16:
      return "bfloat16";
    case c10::ScalarType::Half:
      return "float16";
    case c10::ScalarType::Float:
      return "float32";
    default:
      return std::string(c10::toString(dtype));
  }
}

}  // namespace dflash::train
