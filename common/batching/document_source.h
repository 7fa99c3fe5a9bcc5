// What the packer reads: a random-access set of tokenized documents. The prepared data set
// (common/data/prepared.h) implements it over a memory-mapped file; tests implement it in memory.
#pragma once

#include <cstdint>

#include "absl/types/span.h"

namespace dflash::batching {

struct DocumentView {
  absl::Span<const int32_t> tokens;     // token ids, length n
  absl::Span<const uint8_t> loss_mask;  // length n; 1 = supervised (assistant) token, 0 otherwise
};

class DocumentSource {
 public:
  virtual ~DocumentSource() = default;
  virtual int64_t num_documents() const = 0;
  // Tokens in document i (0 <= i < num_documents()); cheap (the length index).
  virtual int64_t length(int64_t i) const = 0;
  // Views stay valid as long as the source lives.
  virtual DocumentView document(int64_t i) const = 0;
};

}  // namespace dflash::batching
