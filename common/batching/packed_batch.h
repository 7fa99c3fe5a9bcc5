// A micro-batch made concrete: the plain vectors a worker turns into tensors. Documents (pieces)
// are concatenated without padding; flash-attention style varlen attention reads the boundaries
// from cu_seqlens.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/batching/document_source.h"
#include "common/batching/plan.h"

namespace dflash::batching {

// T = total_tokens, b = number of pieces.
struct PackedBatch {
  std::vector<int32_t> input_ids;   // [T] token ids
  std::vector<uint8_t> loss_mask;   // [T] 1 = supervised token
  std::vector<int32_t> cu_seqlens;  // [b+1] offsets: piece d is [cu_seqlens[d], cu_seqlens[d+1])
  std::vector<int32_t> positions;   // [T] position within its piece, restarting at 0
  std::vector<int32_t> doc_ids;     // [T] local piece index 0..b-1
  std::vector<int64_t> piece_document;  // [b] source document index of each piece
  std::vector<int64_t> piece_begin;     // [b] first token of each piece within its document
  int64_t total_tokens = 0;

  int64_t num_pieces() const { return static_cast<int64_t>(piece_document.size()); }
};

// Copies the pieces' tokens out of `source` into `out` (its vectors are reused, so a caller that
// materializes many batches allocates once). InvalidArgument when a piece lies outside its
// document, or the pieces exceed token_budget tokens.
absl::Status MaterializeBatch(const DocumentSource& source, absl::Span<const Piece> pieces,
                              int64_t token_budget, PackedBatch* out);

absl::StatusOr<PackedBatch> MaterializeBatch(const DocumentSource& source,
                                             absl::Span<const Piece> pieces, int64_t token_budget);

}  // namespace dflash::batching
