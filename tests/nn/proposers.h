// A speculative-decoding proposer for tests that know the answer: for the prompts `prompts` whose
// greedy continuations are `want`, it proposes the right tokens for the first `right` slots of
// every block and wrong ones after (the next token + 1, modulo 256), so that verification keeps
// exactly `right` proposals where the answer goes on.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spec/speculative.h"

namespace dflash::nn::testing {

inline spec::Proposer KnowingProposer(const std::vector<std::vector<int64_t>>& prompts,
                                      const std::vector<std::vector<int64_t>>& want, int64_t block,
                                      int64_t right) {
  return [prompts, want, block, right](const std::vector<const spec::DraftContext*>& contexts) {
    std::vector<std::vector<int64_t>> out;
    for (const spec::DraftContext* c : contexts) {
      size_t which = 0;
      while (!std::equal(prompts[which].begin(), prompts[which].end(), c->tokens.begin())) {
        ++which;
      }
      const size_t emitted = c->tokens.size() - prompts[which].size();
      std::vector<int64_t> p;
      for (int64_t k = 0; k < block - 1; ++k) {
        const size_t at = emitted + static_cast<size_t>(k);
        const int64_t next = at < want[which].size() ? want[which][at] : 0;
        p.push_back(k < right ? next : (next + 1) % 256);
      }
      out.push_back(p);
    }
    return absl::StatusOr<std::vector<std::vector<int64_t>>>(out);
  };
}

}  // namespace dflash::nn::testing
