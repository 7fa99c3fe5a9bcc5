// Target-side generation with a KV cache: batched greedy or sampled decoding with stop tokens and a
// token limit. Prompts are prefilled in one packed forward, then each step runs one new token of
// every unfinished sequence in one batched forward (TargetModel::Extend). With max_batch below the
// number of prompts, the KV cache holds max_batch sequences and the rows of finished sequences
// are refilled with waiting prompts (continuous batching).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/nn/target_model.h"

namespace dflash::nn {

struct SamplingOptions {
  double temperature = 0;  // 0: greedy (argmax, ties to the lowest id); > 0: sample
  int64_t top_k = 0;       // keep the k most likely tokens; 0: all
  double top_p = 1.0;      // keep the smallest set whose probability reaches top_p; 1: all
  uint64_t seed = 0;       // sampling generator (CPU), one per Generate call
  // transformers' repetition_penalty (Generate only, greedy or sampled): before anything else,
  // each logit of a token the sequence already holds (prompt or generated) is divided by it when
  // positive, multiplied by it when negative. 1: off.
  double repetition_penalty = 1.0;
};

struct GenerateOptions {
  int64_t max_new_tokens = 256;
  // Non-empty: one limit per prompt (each >= 1), used instead of max_new_tokens.
  std::vector<int64_t> max_new_tokens_per_prompt;
  std::vector<int64_t> stop_token_ids;  // generation of a sequence ends after emitting one
  SamplingOptions sampling;
  // Sequences decoded together (KV cache rows); 0: every prompt at once. Outputs do not depend on
  // it when greedy; sampled outputs draw from one generator in step order, so they do.
  int64_t max_batch = 0;
};

struct Generation {
  std::vector<int64_t> tokens;  // the new tokens, a stop token included
  bool stopped = false;         // ended on a stop token (else on max_new_tokens)
};

// INVALID_ARGUMENT naming the field when the options cannot be used.
absl::Status ValidateGenerateOptions(const GenerateOptions& options);
// The sampling part of it: temperature finite and >= 0, top_k >= 0, top_p in (0, 1],
// repetition_penalty finite and > 0.
absl::Status ValidateSampling(const SamplingOptions& sampling);

// transformers' RepetitionPenaltyLogitsProcessor on `logits` [N, V]: row r's logits of the ids in
// held[r] divided by `penalty` where positive, multiplied where negative; returned in fp32.
at::Tensor PenalizeRepeats(const at::Tensor& logits, const std::vector<std::vector<int64_t>>& held,
                           double penalty);

// [N, V] float32 probabilities, on the logits' device, that sampling draws each row's token from
// (temperature > 0): softmax(logits / temperature) over the top_k most likely tokens, then over the
// smallest set of most likely tokens whose probability reaches top_p (the first always kept).
at::Tensor SamplingProbabilities(const at::Tensor& logits, const SamplingOptions& options);

// The next token of each row of `logits` [N, V] fp32 (any device): argmax when greedy, else a
// sample after temperature, top-k and top-p, drawn from `generator` (a CPU generator).
std::vector<int64_t> PickTokens(const at::Tensor& logits, const SamplingOptions& options,
                                at::Generator& generator);

// Generates a continuation of every prompt (each non-empty, ids in the vocabulary). The model must
// be loaded with options.full. Outputs are in prompt order.
absl::StatusOr<std::vector<Generation>> Generate(const TargetModel& model,
                                                 const std::vector<std::vector<int64_t>>& prompts,
                                                 const GenerateOptions& options);

}  // namespace dflash::nn
