// The embedded CPU demo (run.yaml `builtin:` names): one place for the shapes that the built-in
// target (common/nn/builtin_target.h) and the built-in data set (common/data/builtin_data.h) must
// agree on, so that the demo's token ids always fit the demo's vocabulary.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "common/base/rng.h"

namespace dflash::config {

// builtin:tiny-qwen3: a Qwen3-shaped decoder with fixed pseudo-random weights (seeded, identical in
// every process), small enough to run on a CPU. 8 layers so that the default K = 5 feature layers
// (method.md §2) are distinct: ids 1..5.
struct TinyQwen3 {
  static constexpr int64_t kVocabSize = 512;
  static constexpr int64_t kHiddenSize = 64;
  static constexpr int64_t kIntermediateSize = 128;
  static constexpr int64_t kLayers = 8;
  static constexpr int64_t kHeads = 4;
  static constexpr int64_t kKvHeads = 2;
  static constexpr int64_t kHeadDim = 16;
  static constexpr int64_t kMaxPositions = 4096;
  static constexpr double kRopeTheta = 10000.0;
  static constexpr uint64_t kWeightSeed = 20261203;
  // drafter.mask_token_id auto for this target: an id that builtin:tiny-chat never emits.
  static constexpr int64_t kMaskTokenId = 1;
  // builtin:tiny-chat emits ids in [kFirstDataToken, kVocabSize).
  static constexpr int64_t kFirstDataToken = 16;
  // builtin:tiny-chat's answers use ids [kFirstDataToken, kFirstDataToken + kAnswerTokens) and
  // follow a successor table over them (TinyChatSuccessors).
  static constexpr int64_t kAnswerTokens = 32;
  static constexpr uint64_t kTinyChatSeed = 0x54494e5943484154ULL;  // "TINYCHAT"
};

// The successor table of builtin:tiny-chat's answers: succ[i] is the token after answer token
// kFirstDataToken + i. Drawn first from `rng` (seeded kTinyChatSeed; the data set keeps drawing
// from it), so that the built-in target (common/nn/builtin_target.cc) can follow the same table.
inline std::vector<int32_t> TinyChatSuccessors(SplitMix64& rng) {
  std::vector<int32_t> succ(TinyQwen3::kAnswerTokens);
  for (int64_t i = 0; i < TinyQwen3::kAnswerTokens; ++i) {
    succ[i] = static_cast<int32_t>(TinyQwen3::kFirstDataToken + i);
  }
  for (int64_t i = TinyQwen3::kAnswerTokens - 1; i > 0; --i) {
    std::swap(succ[i], succ[rng.Below(static_cast<uint64_t>(i) + 1)]);
  }
  return succ;
}

}  // namespace dflash::config
