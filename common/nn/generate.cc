#include "common/nn/generate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/multinomial.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace dflash::nn {

absl::Status ValidateGenerateOptions(const GenerateOptions& options) {
  if (options.max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens ", options.max_new_tokens, " must be at least 1"));
  }
  const SamplingOptions& s = options.sampling;
  if (!(s.temperature >= 0) || !std::isfinite(s.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature ", s.temperature, " must be finite and >= 0"));
  }
  if (s.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k ", s.top_k, " must be >= 0"));
  }
  if (!(s.top_p > 0 && s.top_p <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p ", s.top_p, " must be in (0, 1]"));
  }
  return absl::OkStatus();
}

std::vector<int64_t> PickTokens(const at::Tensor& logits, const SamplingOptions& options,
                                at::Generator& generator) {
  c10::InferenceMode inference;
  at::Tensor l = logits.to(at::kCPU, at::kFloat).contiguous();  // [N, V]
  at::Tensor picked;
  if (options.temperature == 0) {
    picked = at::argmax(l, 1);  // the first maximum: ties go to the lowest id
  } else {
    l = l / options.temperature;
    const double neg_inf = -std::numeric_limits<double>::infinity();
    if (options.top_k > 0 && options.top_k < l.size(1)) {
      at::Tensor kth = std::get<0>(at::topk(l, options.top_k, 1)).narrow(1, options.top_k - 1, 1);
      l = l.masked_fill(l < kth, neg_inf);
    }
    if (options.top_p < 1) {
      auto [sorted, order] = at::sort(l, 1, /*descending=*/true);
      at::Tensor probs = at::softmax(sorted, 1);
      // Drop a token when the tokens before it already reach top_p (the first is always kept).
      at::Tensor drop_sorted = (at::cumsum(probs, 1) - probs) >= options.top_p;
      at::Tensor drop = at::zeros_like(drop_sorted).scatter(1, order, drop_sorted);
      l = l.masked_fill(drop, neg_inf);
    }
    picked = at::multinomial(at::softmax(l, 1), 1, /*replacement=*/false, generator).squeeze(1);
  }
  const int64_t* p = picked.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + picked.numel());
}

absl::StatusOr<std::vector<Generation>> Generate(const TargetModel& model,
                                                 const std::vector<std::vector<int64_t>>& prompts,
                                                 const GenerateOptions& options) {
  RETURN_IF_ERROR(ValidateGenerateOptions(options));
  if (prompts.empty()) return std::vector<Generation>();
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt ", i, " is empty"));
    }
  }
  const int64_t n = static_cast<int64_t>(prompts.size());
  std::vector<int64_t> limits(n, options.max_new_tokens);
  if (!options.max_new_tokens_per_prompt.empty()) {
    if (options.max_new_tokens_per_prompt.size() != prompts.size()) {
      return absl::InvalidArgumentError(absl::StrCat("max_new_tokens_per_prompt has ",
                                                     options.max_new_tokens_per_prompt.size(),
                                                     " entries for ", n, " prompts"));
    }
    limits = options.max_new_tokens_per_prompt;
    for (int64_t i = 0; i < n; ++i) {
      if (limits[i] < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("max_new_tokens of prompt ", i, " is ", limits[i], ", must be >= 1"));
      }
    }
  }
  int64_t capacity = 0;
  for (int64_t i = 0; i < n; ++i) {
    capacity = std::max<int64_t>(capacity, static_cast<int64_t>(prompts[i].size()) + limits[i]);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, KvCache::Create(model, n, capacity));
  at::Generator generator = at::detail::createCPUGenerator(options.sampling.seed);
  const std::set<int64_t> stops(options.stop_token_ids.begin(), options.stop_token_ids.end());

  std::vector<Generation> out(n);
  std::vector<int64_t> active(n);
  for (int64_t i = 0; i < n; ++i) active[i] = i;
  std::vector<std::vector<int64_t>> inputs = prompts;
  while (!active.empty()) {
    ASSIGN_OR_RETURN(ExtendOutput step, model.Extend(active, inputs, cache.get(), false));
    // The last row of each sequence predicts its next token.
    std::vector<int64_t> last_rows;
    int64_t row = 0;
    for (const std::vector<int64_t>& in : inputs) {
      row += static_cast<int64_t>(in.size());
      last_rows.push_back(row - 1);
    }
    at::Tensor rows = step.hidden.index_select(
        0, at::tensor(last_rows, at::TensorOptions().dtype(at::kLong)).to(step.hidden.device()));
    ASSIGN_OR_RETURN(at::Tensor logits, model.Logits(rows));
    std::vector<int64_t> next = PickTokens(logits, options.sampling, generator);
    std::vector<int64_t> still;
    std::vector<std::vector<int64_t>> next_inputs;
    for (size_t i = 0; i < active.size(); ++i) {
      Generation& g = out[active[i]];
      g.tokens.push_back(next[i]);
      g.stopped = stops.count(next[i]) > 0;
      if (g.stopped || static_cast<int64_t>(g.tokens.size()) >= limits[active[i]]) continue;
      still.push_back(active[i]);
      next_inputs.push_back({next[i]});
    }
    active = std::move(still);
    inputs = std::move(next_inputs);
  }
  return out;
}

}  // namespace dflash::nn
