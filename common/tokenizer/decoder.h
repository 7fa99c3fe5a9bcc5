// The decoder chain of tokenizer.json (HF `decoders`): token strings go through each step's
// decode_chain in order and the results are joined. Steps: ByteLevel (byte-level code points back
// to bytes, lossy UTF-8), ByteFallback ("<0xXX>" tokens back to bytes), Fuse (join), Replace
// (pattern to content), Strip (a character cut from the ends of each token).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/regex.h"

namespace dflash::tokenizer {

struct DecoderStep {
  enum class Type { kByteLevel, kByteFallback, kFuse, kReplace, kStrip };
  Type type = Type::kByteLevel;
  std::string field;  // JSON path, for errors
  // Replace: a literal string, or an Oniguruma regex when pattern_is_regex.
  std::string pattern;
  bool pattern_is_regex = false;
  std::string content;      // Replace: the replacement
  char32_t strip_char = 0;  // Strip
  size_t strip_start = 0, strip_stop = 0;
};

class Decoder {
 public:
  // Errors name the field of a Replace regex that does not compile.
  static absl::StatusOr<std::unique_ptr<Decoder>> Create(std::vector<DecoderStep> steps);
  ~Decoder();

  // True when the chain is exactly one ByteLevel step (the caller's per-id fast path).
  bool IsPlainByteLevel() const;

  // The decoded text of `tokens` (vocabulary strings), as HF's Decoder::decode.
  absl::StatusOr<std::string> Decode(std::vector<std::string> tokens) const;

 private:
  Decoder() = default;
  std::vector<DecoderStep> steps_;
  std::vector<std::unique_ptr<Regex>> regexes_;  // per step; set for Replace with a regex
};

}  // namespace dflash::tokenizer
