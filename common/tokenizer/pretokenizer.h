// Pre-tokenization: the file's Split regexes (behavior Isolated) applied in order, then ByteLevel
// (optional prefix space, optional GPT-2 regex). Pieces come out as views with their text offsets.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/regex.h"

namespace dflash::tokenizer {

struct PreTokenizerConfig {
  std::vector<std::string> split_patterns;  // Oniguruma syntax, as in tokenizer.json
  std::vector<std::string> split_fields;    // JSON path of each pattern, for errors
  bool add_prefix_space = false;            // ByteLevel.add_prefix_space
  bool use_regex = false;                   // ByteLevel.use_regex (the GPT-2 pattern)
};

class PreTokenizer {
 public:
  // Errors name the failing pattern's JSON field.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(const PreTokenizerConfig& config);

  // One pre-token: `bytes` (valid UTF-8) starts at byte `offset` of the text; its first `phantom`
  // bytes (the ByteLevel prefix space) are not in the text at all.
  using Emit = absl::FunctionRef<void(std::string_view bytes, uint32_t offset, uint32_t phantom)>;

  // Splits `text` (valid UTF-8); `base` is added to every offset.
  absl::Status Run(std::string_view text, uint32_t base, Emit emit) const;

 private:
  absl::Status RunStage(size_t stage, std::string_view piece, uint32_t offset, Emit emit) const;
  absl::Status RunByteLevel(std::string_view piece, uint32_t offset, Emit emit) const;

  std::vector<std::unique_ptr<Regex>> splits_;
  std::unique_ptr<Regex> gpt2_;  // set when use_regex
  bool add_prefix_space_ = false;
};

}  // namespace dflash::tokenizer
