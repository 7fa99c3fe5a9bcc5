// run.yaml `data.train: builtin:NAME`: data sets generated in memory, for the embedded CPU demo and
// tests, identical on every machine (SplitMix64, common/base/rng.h). No tokenizer is involved:
// the documents are token ids of the built-in target's vocabulary (common/config/builtins.h).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/batching/memory_source.h"

namespace dflash::data {

// builtin:tiny-chat: 2000 "conversations" of 1-2 turns. A turn is a prompt of uniform random
// tokens (not supervised) and an answer (supervised) over 32 answer tokens that walks a fixed
// random successor table: each next token is succ[previous] with probability 7/8, otherwise a
// uniform answer token. A drafter can learn the table, so its loss falls far below the uniform
// entropy and its acceptance grows.
// builtin:long-synthetic: 4000 documents of 200-2000 tokens (log-normal, mean ~1000) with random
// token ids below 151000 and alternating prompt/answer runs (batching::SyntheticSource): the
// document shape of the GPU benchmarks at real token budgets, for a Qwen3-sized vocabulary.
// Nothing in it is learnable.
// NOT_FOUND naming the known data sets for any other name (without the "builtin:" prefix).
absl::StatusOr<std::unique_ptr<batching::DocumentSource>> BuiltinDataset(const std::string& name);

}  // namespace dflash::data
