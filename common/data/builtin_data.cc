#include "common/data/builtin_data.h"

#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/rng.h"
#include "common/config/builtins.h"

namespace dflash::data {
namespace {

using config::TinyQwen3;

std::unique_ptr<batching::InMemorySource> TinyChat() {
  constexpr int64_t kDocs = 2000;
  const int64_t first = TinyQwen3::kFirstDataToken;
  const int64_t span = TinyQwen3::kVocabSize - first;
  // Answers use the first kAnswerTokens ids only: a successor table small enough for a one-layer
  // drafter to learn within the demo's few hundred steps on a CPU.
  constexpr int64_t kAnswerTokens = TinyQwen3::kAnswerTokens;
  SplitMix64 rng(TinyQwen3::kTinyChatSeed);
  const std::vector<int32_t> succ = config::TinyChatSuccessors(rng);
  auto uniform_token = [&] { return static_cast<int32_t>(first + rng.Below(span)); };
  auto answer_token = [&] { return static_cast<int32_t>(first + rng.Below(kAnswerTokens)); };
  auto between = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng.Below(static_cast<uint64_t>(hi - lo + 1)));
  };
  auto source = std::make_unique<batching::InMemorySource>();
  for (int64_t d = 0; d < kDocs; ++d) {
    std::vector<int32_t> tokens;
    std::vector<uint8_t> mask;
    const int64_t turns = between(1, 2);
    for (int64_t t = 0; t < turns; ++t) {
      const int64_t prompt = between(6, 40), answer = between(20, 160);
      for (int64_t i = 0; i < prompt; ++i) {
        tokens.push_back(uniform_token());
        mask.push_back(0);
      }
      int32_t prev = answer_token();
      for (int64_t i = 0; i < answer; ++i) {
        prev = rng.Below(8) < 7 ? succ[prev - first] : answer_token();
        tokens.push_back(prev);
        mask.push_back(1);
      }
    }
    source->Add(std::move(tokens), std::move(mask));
  }
  return source;
}

}  // namespace

absl::StatusOr<std::unique_ptr<batching::DocumentSource>> BuiltinDataset(const std::string& name) {
  if (name == "tiny-chat") return TinyChat();
  if (name == "long-synthetic") {
    constexpr double kSigma = 0.6;
    return std::make_unique<batching::SyntheticSource>(
        batching::LogNormalLengths(4000, std::log(1000.0) - kSigma * kSigma / 2, kSigma, 200, 2000,
                                   /*seed=*/0x4c4f4e47),
        /*seed=*/0x53594e54);
  }
  return absl::NotFoundError(
      absl::StrCat("unknown built-in data set '", name, "' (known: tiny-chat, long-synthetic)"));
}

}  // namespace dflash::data
