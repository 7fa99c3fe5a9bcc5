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
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <functional>
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
  if (options.max_batch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch ", options.max_batch, " must be >= 0 (0: every prompt at once)"));
  }
  return ValidateSampling(options.sampling);
}

absl::Status ValidateSampling(const SamplingOptions& s) {
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
  if (!(s.repetition_penalty > 0) || !std::isfinite(s.repetition_penalty)) {
    return absl::InvalidArgumentError(absl::StrCat("repetition_penalty ", s.repetition_penalty,
                                                   " must be finite and > 0 (1: off)"));
  }
  return absl::OkStatus();
}

at::Tensor PenalizeRepeats(const at::Tensor& logits, const std::vector<std::vector<int64_t>>& held,
                           double penalty) {
  at::Tensor out = logits.to(at::kFloat).clone();
  const int64_t v_size = out.size(1);
  std::vector<int64_t> at_flat;  // row * V + id of each distinct held id
  for (size_t r = 0; r < held.size(); ++r) {
    std::vector<int64_t> ids = held[r];
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (int64_t id : ids) at_flat.push_back(static_cast<int64_t>(r) * v_size + id);
  }
  if (at_flat.empty()) return out;
  const at::Tensor linear = at::tensor(at_flat, at::kLong).to(out.device());
  const at::Tensor flat = out.view({-1});
  const at::Tensor v = flat.index_select(0, linear);
  flat.index_copy_(0, linear, at::where(v < 0, v * penalty, v / penalty));
  return out;
}

at::Tensor SamplingProbabilities(const at::Tensor& logits, const SamplingOptions& options) {
  at::Tensor l = logits.to(at::kFloat) / options.temperature;  // [N, V]
  const double neg_inf = -std::numeric_limits<double>::infinity();
  if (options.top_k > 0 && options.top_k < l.size(1)) {
    // Ties with the k-th value stay.
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
  return at::softmax(l, 1);
}

std::vector<int64_t> PickTokens(const at::Tensor& logits, const SamplingOptions& options,
                                at::Generator& generator) {
  c10::InferenceMode inference;
  at::Tensor picked;
  if (options.temperature == 0) {
    // On the logits' device (the first maximum: ties go to the lowest id on every device); only
    // the N ids travel to the host.
    picked = at::argmax(logits, 1).to(at::kCPU).contiguous();
  } else {
    const at::Tensor probs = SamplingProbabilities(logits.to(at::kCPU).contiguous(), options);
    picked = at::multinomial(probs, 1, /*replacement=*/false, generator).squeeze(1);
  }
  const int64_t* p = picked.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + picked.numel());
}

namespace {

// A sequence being decoded: which prompt, which cache row, its last token.
struct Slot {
  int64_t prompt = 0;
  int64_t row = 0;
  int64_t last = 0;
};

}  // namespace

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
  const int64_t rows = options.max_batch > 0 ? std::min(options.max_batch, n) : n;
  ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache, KvCache::Create(model, rows, capacity));
  at::Generator generator = at::detail::createCPUGenerator(options.sampling.seed);
  const std::set<int64_t> stops(options.stop_token_ids.begin(), options.stop_token_ids.end());

  std::vector<Generation> out(n);
  std::vector<Slot> active;  // in cache-row order, so that a full batch is one contiguous range
  std::vector<int64_t> free_rows;
  for (int64_t r = rows - 1; r >= 0; --r) free_rows.push_back(r);
  int64_t next_prompt = 0;
  // Waiting prompts fill free cache rows once an eighth of the rows is free (or nothing runs):
  // one prefill per wave of finished sequences rather than one per sequence.
  const size_t refill_at = static_cast<size_t>(std::max<int64_t>(1, rows / 8));

  // Picks each row's next token, records it, and keeps the slots that go on.
  auto advance = [&](std::vector<Slot> slots, const at::Tensor& last_hidden) -> absl::Status {
    ASSIGN_OR_RETURN(at::Tensor logits, model.Logits(last_hidden));
    if (options.sampling.repetition_penalty != 1.0) {
      std::vector<std::vector<int64_t>> held;
      for (const Slot& s : slots) {
        held.push_back(prompts[s.prompt]);
        const std::vector<int64_t>& made = out[s.prompt].tokens;
        held.back().insert(held.back().end(), made.begin(), made.end());
      }
      logits = PenalizeRepeats(logits, held, options.sampling.repetition_penalty);
    }
    std::vector<int64_t> next = PickTokens(logits, options.sampling, generator);
    for (size_t i = 0; i < slots.size(); ++i) {
      Generation& g = out[slots[i].prompt];
      g.tokens.push_back(next[i]);
      g.stopped = stops.count(next[i]) > 0;
      if (g.stopped || static_cast<int64_t>(g.tokens.size()) >= limits[slots[i].prompt]) {
        free_rows.push_back(slots[i].row);
        continue;
      }
      slots[i].last = next[i];
      active.push_back(slots[i]);
    }
    std::sort(active.begin(), active.end(),
              [](const Slot& a, const Slot& b) { return a.row < b.row; });
    return absl::OkStatus();
  };

  while (next_prompt < n || !active.empty()) {
    if (next_prompt < n && (active.empty() || free_rows.size() >= refill_at)) {
      // Prefill waiting prompts into free rows.
      std::sort(free_rows.begin(), free_rows.end(), std::greater<int64_t>());
      std::vector<Slot> fresh;
      std::vector<int64_t> seqs;
      std::vector<std::vector<int64_t>> inputs;
      while (!free_rows.empty() && next_prompt < n) {
        Slot s{next_prompt, free_rows.back(), 0};
        free_rows.pop_back();
        RETURN_IF_ERROR(cache->Truncate(s.row, 0));
        seqs.push_back(s.row);
        inputs.push_back(prompts[next_prompt++]);
        fresh.push_back(s);
      }
      ASSIGN_OR_RETURN(ExtendOutput step, model.Extend(seqs, inputs, cache.get(), false));
      std::vector<int64_t> last_rows;
      int64_t row = 0;
      for (const std::vector<int64_t>& in : inputs) {
        row += static_cast<int64_t>(in.size());
        last_rows.push_back(row - 1);
      }
      at::Tensor last = step.hidden.index_select(
          0, at::tensor(last_rows, at::TensorOptions().dtype(at::kLong)).to(step.hidden.device()));
      RETURN_IF_ERROR(advance(std::move(fresh), last));
      continue;
    }
    // One decoding step of every running sequence.
    std::vector<Slot> running = std::move(active);
    active.clear();
    std::vector<int64_t> seqs;
    std::vector<std::vector<int64_t>> inputs;
    for (const Slot& s : running) {
      seqs.push_back(s.row);
      inputs.push_back({s.last});
    }
    ASSIGN_OR_RETURN(ExtendOutput step, model.Extend(seqs, inputs, cache.get(), false));
    RETURN_IF_ERROR(advance(std::move(running), step.hidden));
  }
  return out;
}

}  // namespace dflash::nn
