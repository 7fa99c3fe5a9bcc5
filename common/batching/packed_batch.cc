#include "common/batching/packed_batch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace dflash::batching {

absl::Status MaterializeBatch(const DocumentSource& source, absl::Span<const Piece> pieces,
                              int64_t token_budget, PackedBatch* out) {
  int64_t total = 0;
  for (const Piece& p : pieces) {
    if (p.document < 0 || p.document >= source.num_documents()) {
      return absl::InvalidArgumentError(
          absl::StrCat("piece names document ", p.document, " of ", source.num_documents()));
    }
    const int64_t n = source.length(p.document);
    if (p.length < 1 || p.begin < 0 || p.begin + p.length > n) {
      return absl::InvalidArgumentError(absl::StrCat("piece [", p.begin, ", ", p.begin + p.length,
                                                     ") lies outside document ", p.document, " of ",
                                                     n, " tokens"));
    }
    total += p.length;
  }
  if (total > token_budget) {
    return absl::InvalidArgumentError(
        absl::StrCat("pieces hold ", total, " tokens, over the token budget of ", token_budget));
  }
  const size_t b = pieces.size();
  out->total_tokens = total;
  out->input_ids.resize(total);
  out->loss_mask.resize(total);
  out->positions.resize(total);
  out->doc_ids.resize(total);
  out->cu_seqlens.resize(b + 1);
  out->piece_document.resize(b);
  out->piece_begin.resize(b);
  int32_t offset = 0;
  for (size_t d = 0; d < b; ++d) {
    const Piece& p = pieces[d];
    const DocumentView doc = source.document(p.document);
    if (static_cast<int64_t>(doc.tokens.size()) < p.begin + p.length ||
        doc.loss_mask.size() != doc.tokens.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "document ", p.document, " has ", doc.tokens.size(), " tokens and ", doc.loss_mask.size(),
          " mask entries, but its length index says ", source.length(p.document)));
    }
    out->cu_seqlens[d] = offset;
    out->piece_document[d] = p.document;
    out->piece_begin[d] = p.begin;
    std::copy_n(doc.tokens.data() + p.begin, p.length, out->input_ids.data() + offset);
    std::copy_n(doc.loss_mask.data() + p.begin, p.length, out->loss_mask.data() + offset);
    std::fill_n(out->doc_ids.data() + offset, p.length, static_cast<int32_t>(d));
    for (int32_t i = 0; i < p.length; ++i) out->positions[offset + i] = i;
    offset += p.length;
  }
  out->cu_seqlens[b] = offset;
  return absl::OkStatus();
}

absl::StatusOr<PackedBatch> MaterializeBatch(const DocumentSource& source,
                                             absl::Span<const Piece> pieces, int64_t token_budget) {
  PackedBatch batch;
  RETURN_IF_ERROR(MaterializeBatch(source, pieces, token_budget, &batch));
  return batch;
}

}  // namespace dflash::batching
