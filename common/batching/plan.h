// The epoch plan: which pieces of which documents go into which micro-batch of which
// data-parallel pair, for one epoch. Pure function of (data lengths, options, epoch): the same
// inputs give a byte-identical plan on every machine (rng.h), which is what makes a resumed run
// reproduce the uninterrupted one (cursor.h) without storing the plan anywhere.
//
// Steps of PlanEpoch:
//   1. Shuffle the document order with SplitMix64 seeded by SeedHash(seed, epoch).
//   2. Cut each document to pieces: `truncate` keeps its first max_length tokens (the rest are
//      counted in EpochStats::truncated_tokens), `split` cuts it into consecutive pieces of at most
//      max_length, each packed and masked as a document of its own. Empty documents are skipped
//      and counted.
//   3. Pack every window of `pack_window` consecutive pieces with best-fit-decreasing (packer.h)
//      and shuffle the window's micro-batches, so that micro-batches of long documents (slow
//      attention) and of short ones alternate between pairs instead of arriving in runs.
//   4. Rebalance so that the micro-batch count is a multiple of num_pairs (split micro-batches,
//      else merge small ones, else cut a piece; see Rebalance in plan.cc), then deal micro-batch g
//      to pair g % num_pairs as its micro-batch g / num_pairs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/batching/document_source.h"

namespace dflash::batching {

enum class LongDocuments { kTruncate, kSplit };

// "truncate" | "split" (data.long_documents).
absl::StatusOr<LongDocuments> ParseLongDocuments(absl::string_view text);
absl::string_view LongDocumentsName(LongDocuments policy);

// Fill ratio (packed tokens / (micro-batches * budget)) against the window size, log-normal
// lengths (mu = ln 1000 - 0.5, sigma 1: mean ~1000 before clipping) clipped to [16, max_length],
// 200k documents, budget 8192, every window's partly filled tail micro-batches included
// (scripts/bench/packer_bench on x86-64):
//   window (pieces)     16      64     256     512    1024    2048    4096   16384
//   max_length 4096  0.785   0.934   0.983   0.991   0.995   0.998   0.999   1.000
//   max_length 8192  0.792   0.937   0.984   0.991   0.996   0.998   0.999   1.000
// Small windows lose on the last, partly filled micro-batches of every window; 2048 clears the
// 97% target with margin (0.998; 0.996 at budget 16384, 0.998 at 4096) while a micro-batch still
// draws its documents from ~250 consecutive micro-batches' worth of the shuffled order, so the
// data order stays close to the shuffle. Cost: ~0.13 s per epoch of 1M documents.
inline constexpr int64_t kDefaultPackWindow = 2048;

struct BatchingOptions {
  int64_t token_budget = 8192;  // batching.token_budget: tokens per micro-batch, at most
  int64_t max_length = 4096;    // data.max_length: tokens per piece, at most; <= token_budget
  LongDocuments long_documents = LongDocuments::kTruncate;  // data.long_documents
  int64_t pack_window = kDefaultPackWindow;                 // pieces packed together (see above)
  int64_t num_pairs = 1;                                    // data-parallel pairs
  int64_t grad_accum = 1;  // batching.grad_accum: micro-batches per pair per optimizer step
  uint64_t seed = 0;       // run seed
};

// Names the offending field ("batching.token_budget: ...").
absl::Status ValidateBatchingOptions(const BatchingOptions& options);

// A contiguous range of one source document, packed as a document of its own.
struct Piece {
  int64_t document = 0;  // index in the DocumentSource
  int64_t begin = 0;     // first token within that document
  int32_t length = 0;    // tokens, 1..max_length

  friend bool operator==(const Piece& a, const Piece& b) {
    return a.document == b.document && a.begin == b.begin && a.length == b.length;
  }
};

struct EpochStats {
  int64_t documents = 0;            // in the source
  int64_t empty_documents = 0;      // length 0: nothing to train on, skipped
  int64_t truncated_documents = 0;  // truncate policy: documents longer than max_length
  int64_t truncated_tokens = 0;     // tokens beyond max_length, not trained on (truncate policy)
  int64_t split_documents = 0;      // split policy: documents cut into two or more pieces
  int64_t pieces = 0;               // packed pieces
  int64_t tokens = 0;               // packed tokens (the sum of piece lengths)
  int64_t micro_batches = 0;        // over all pairs, after rebalancing
  // Rebalancing the micro-batch count to a multiple of num_pairs (Rebalance in plan.cc):
  int64_t rebalance_splits = 0;  // micro-batches added by splitting one in two
  int64_t cut_pieces = 0;        // of those, made by cutting a lone piece in two
  int64_t rebalance_merges = 0;  // micro-batches removed by merging two small ones
  int64_t token_budget = 0;

  // Packed tokens over micro_batches * token_budget.
  double fill_ratio() const;
};

class EpochPlan {
 public:
  int64_t epoch() const { return epoch_; }
  int64_t num_pairs() const { return num_pairs_; }
  int64_t grad_accum() const { return grad_accum_; }
  const EpochStats& stats() const { return stats_; }

  // Equal for every pair by construction.
  int64_t micro_batches_per_pair() const { return stats_.micro_batches / num_pairs_; }
  // ceil(micro_batches_per_pair / grad_accum). When grad_accum does not divide
  // micro_batches_per_pair, the epoch's last step is SHORT: it has the remainder's micro-batches
  // (the same count on every pair). Nothing is dropped or carried into the next epoch; the loss is
  // normalized by the step's total weight (method.md §3.6), so a short step is a valid, slightly
  // noisier step. StepMicroBatches tells the caller how many to expect.
  int64_t steps() const;
  int64_t StepMicroBatches(int64_t step_in_epoch) const;

  // Pieces of micro-batch `index` (0..micro_batches_per_pair-1) of `pair`.
  absl::Span<const Piece> MicroBatch(int64_t pair, int64_t index) const;
  // Micro-batch g over all pairs, in dealing order (pair g % P, index g / P).
  absl::Span<const Piece> GlobalMicroBatch(int64_t g) const;

  // 64-bit digest of the whole plan (pieces and boundaries), for determinism checks and logs.
  uint64_t Digest() const;

 private:
  friend absl::StatusOr<EpochPlan> PlanEpoch(const DocumentSource&, const BatchingOptions&,
                                             int64_t);
  int64_t epoch_ = 0;
  int64_t num_pairs_ = 1;
  int64_t grad_accum_ = 1;
  EpochStats stats_;
  std::vector<Piece> pieces_;  // grouped by micro-batch, in no particular micro-batch order
  // Micro-batch g (dealing order) is pieces_[ranges_[g].first, ranges_[g].second).
  std::vector<std::pair<int64_t, int64_t>> ranges_;
};

// Plans one epoch. Errors: InvalidArgument for invalid options or a negative length;
// FailedPrecondition when there are fewer non-empty documents (pieces) than pairs, or when the
// micro-batches can neither be split nor merged into a multiple of num_pairs (one-token
// micro-batches that do not fit together: only with a budget of 1).
absl::StatusOr<EpochPlan> PlanEpoch(const DocumentSource& source, const BatchingOptions& options,
                                    int64_t epoch);

}  // namespace dflash::batching
