// Sampled speculative decoding (docs/method.md §1.1): a seeded sampler on the logits' device and
// the lossless acceptance rule of speculative sampling, over the distribution that plain sampling
// draws each token from (nn::SamplingProbabilities: temperature, then top-k, then top-p). A
// proposal x drawn from the drafter's distribution q is kept with probability
// min(1, p(x) / q(x)), p the target's; at the first rejection the token is drawn from the
// residual max(0, p - q), renormalized; when every proposal is kept, the bonus token is drawn
// from p. The emitted tokens are then distributed exactly as plain sampling from the target's p
// (Leviathan et al., 2023; Chen et al., 2023).
// A proposer that gives no distribution is certain of its proposals (q a point mass): the rule
// keeps x with probability p(x) and resamples from p without x.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "common/nn/generate.h"

namespace dflash::spec {

using SamplingOptions = nn::SamplingOptions;  // common/nn/generate.h, as plain sampling's

// Draws with a generator of the probabilities' device, seeded once: the same seed, the same
// draws, on the same device.
class Sampler {
 public:
  Sampler(const SamplingOptions& o, c10::Device device);
  // One token id per row of `probs` [rows, V].
  std::vector<int64_t> Sample(const at::Tensor& probs);
  // `n` uniform values in [0, 1) on the sampler's device.
  at::Tensor Uniform(int64_t n);

 private:
  c10::Device device_;
  at::Generator generator_;
};

// One sequence's block as the acceptance rule sees it.
struct SampledBlock {
  int64_t first_row = 0;  // its first row in p: the row that scores proposal 1
  int64_t length = 0;     // slots verified: the anchor and length - 1 proposals
  const std::vector<int64_t>* proposals = nullptr;  // at least length - 1 ids
  int64_t q_index = -1;  // its block in q ([blocks, B-1, V]); -1: the proposals are certain
};

struct SampledVerdict {
  int64_t accepted = 0;  // proposals kept (a prefix)
  int64_t next = 0;      // then this token: the resample at the first rejection, or the bonus
};

// The acceptance rule over every block of a verification at once: `p` [rows, V] the target's
// sampling probabilities, `q` [blocks, B-1, V] the drafter's (undefined when every block's
// proposals are certain).
std::vector<SampledVerdict> AcceptSampled(const at::Tensor& p, const at::Tensor& q,
                                          const std::vector<SampledBlock>& blocks,
                                          Sampler* sampler);

}  // namespace dflash::spec
