#include "common/train/run_options.h"

#include "absl/strings/str_cat.h"
#include "common/data/run_data.h"

namespace dflash::train {

absl::StatusOr<LocalRunOptions> LocalRunOptionsFor(const config::RunSpec& spec, int64_t total_steps,
                                                   int64_t num_pairs) {
  LocalRunOptions o;
  absl::StatusOr<batching::BatchingOptions> batching = data::BatchingOptionsFor(spec, num_pairs);
  if (!batching.ok()) return batching.status();
  o.batching = *batching;
  o.init_from = spec.drafter.init_from;
  o.checkpoint_every = spec.checkpoint.every_steps;
  o.checkpoint_keep = spec.checkpoint.keep;
  if (o.checkpoint_keep < 1) {
    return absl::InvalidArgumentError("checkpoint.keep: must be at least 1");
  }
  o.max_anchors = spec.batching.max_anchors;  // range checked by the run.yaml field table and
                                              // by LocalRun::Create for programmatic options
  const std::optional<double> gamma =
      spec.loss.gamma ? spec.loss.gamma : config::DefaultGamma(spec.drafter.block_size);
  if (!gamma) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss.gamma: block_size ", spec.drafter.block_size, " has no default; set loss.gamma"));
  }
  o.loss.gamma = *gamma;
  o.loss.weighting = spec.loss.weighting == "dpace" ? drafter::LossWeighting::kDpace
                                                    : drafter::LossWeighting::kDecay;
  o.loss.dpace_alpha = spec.loss.dpace_alpha;
  o.loss.selector_loss_alpha = spec.loss.selector_alpha;
  o.loss.selector_warmup_steps = spec.loss.selector_warmup_steps;
  o.loss.selector_ramp_steps = spec.loss.selector_ramp_steps;
  const config::OptimSpec& opt = spec.optim;
  o.optim.lr = opt.lr;
  o.optim.warmup_ratio = opt.warmup_ratio;
  if (opt.schedule == "cosine") {
    o.optim.schedule = LrSchedule::kCosine;
  } else if (opt.schedule == "linear") {
    o.optim.schedule = LrSchedule::kLinear;
  } else if (opt.schedule == "constant") {
    o.optim.schedule = LrSchedule::kConstant;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("optim.schedule: '", opt.schedule, "' is not cosine, linear or constant"));
  }
  o.optim.clip_norm = opt.clip;  // 0 disables
  o.optim.weight_decay = opt.weight_decay;
  if (opt.betas.size() != 2) {
    return absl::InvalidArgumentError("optim.betas: must be two numbers [beta1, beta2]");
  }
  o.optim.beta1 = opt.betas[0];
  o.optim.beta2 = opt.betas[1];
  o.optim.eps = opt.eps;
  o.optim.total_steps = total_steps;
  if (absl::Status s = ValidateOptimConfig(o.optim); !s.ok()) {
    // ValidateOptimConfig names OptimConfig's fields; say which run.yaml field that is.
    return absl::InvalidArgumentError(absl::StrCat("optim: ", s.message()));
  }
  return o;
}

}  // namespace dflash::train
