// A checkpoint's own sampling settings (transformers' generation_config.json), for generating as
// the model's authors intended: `dflashctl regen --generation_config`.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace dflash::model {

struct GenerationDefaults {
  std::string path;          // the file read
  bool do_sample = false;    // false: greedy (transformers' default)
  double temperature = 1.0;  // transformers' defaults where the file is silent
  double top_p = 1.0;
  int64_t top_k = 50;
  double repetition_penalty = 1.0;  // applies to greedy decoding too
};

// `dir`/generation_config.json: NOT_FOUND naming the path when the checkpoint has none;
// INVALID_ARGUMENT naming the file and key for a value of the wrong type or out of range
// (temperature < 0, top_p outside (0, 1], top_k < 0), or for another way of choosing tokens set
// to anything but its no-op value (repetition_penalty != 1, num_beams > 1, min_p, typical_p,
// no_repeat_ngram_size, suppressed or forced tokens, ...: generation_config.cc lists them).
absl::StatusOr<GenerationDefaults> ReadGenerationConfig(const std::string& dir);

}  // namespace dflash::model
