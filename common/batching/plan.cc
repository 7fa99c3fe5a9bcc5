#include "common/batching/plan.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/batching/packer.h"
#include "common/base/rng.h"

namespace dflash::batching {
namespace {

using Range = std::pair<int64_t, int64_t>;

// Positions within int32 tensors (cu_seqlens, positions) must not overflow.
constexpr int64_t kMaxTokenBudget = int64_t{1} << 30;

absl::Status CutPieces(const DocumentSource& source, const BatchingOptions& options,
                       const std::vector<int64_t>& order, std::vector<Piece>* pieces,
                       EpochStats* stats) {
  pieces->clear();
  pieces->reserve(order.size());
  const int64_t max_length = options.max_length;
  for (int64_t doc : order) {
    const int64_t n = source.length(doc);
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat("document ", doc, " has length ", n));
    if (n == 0) {
      ++stats->empty_documents;
      continue;
    }
    if (n <= max_length) {
      pieces->push_back({doc, 0, static_cast<int32_t>(n)});
    } else if (options.long_documents == LongDocuments::kTruncate) {
      pieces->push_back({doc, 0, static_cast<int32_t>(max_length)});
      ++stats->truncated_documents;
      stats->truncated_tokens += n - max_length;
    } else {
      for (int64_t begin = 0; begin < n; begin += max_length) {
        pieces->push_back({doc, begin, static_cast<int32_t>(std::min(max_length, n - begin))});
      }
      ++stats->split_documents;
    }
  }
  return absl::OkStatus();
}

// Packs each window of `pack_window` consecutive pieces on its own, writing the pieces grouped by
// micro-batch into `packed` (within a micro-batch, in shuffled order) and one range per
// micro-batch; then shuffles the window's micro-batches.
void PackWindows(const std::vector<Piece>& pieces, const BatchingOptions& options, SplitMix64& rng,
                 std::vector<Piece>* packed, std::vector<Range>* ranges) {
  packed->resize(pieces.size());
  ranges->clear();
  CapacityIndex index(options.token_budget);
  std::vector<int32_t> lengths;
  std::vector<int32_t> bin_of;
  std::vector<int64_t> offset;
  const int64_t n = static_cast<int64_t>(pieces.size());
  for (int64_t w0 = 0; w0 < n; w0 += options.pack_window) {
    const int64_t w1 = std::min(n, w0 + options.pack_window);
    lengths.resize(w1 - w0);
    for (int64_t i = w0; i < w1; ++i) lengths[i - w0] = pieces[i].length;
    const int32_t bins = PackBestFitDecreasing(lengths, options.token_budget, &index, &bin_of);
    // Counting sort by bin: offset[b] is where bin b starts within the window.
    offset.assign(bins + 1, 0);
    for (int32_t b : bin_of) ++offset[b + 1];
    std::partial_sum(offset.begin(), offset.end(), offset.begin());
    const size_t first_range = ranges->size();
    for (int32_t b = 0; b < bins; ++b) ranges->push_back({w0 + offset[b], w0 + offset[b + 1]});
    for (int64_t i = w0; i < w1; ++i) (*packed)[w0 + offset[bin_of[i - w0]]++] = pieces[i];
    DeterministicShuffle(ranges->data() + first_range, bins, rng);
  }
}

// Cuts micro-batch `g` (two or more pieces) in two at the piece boundary that best balances its
// tokens; the second half becomes a new micro-batch at the end.
void SplitMicroBatch(const std::vector<Piece>& packed, int64_t g, std::vector<Range>* ranges,
                     std::vector<int64_t>* tokens) {
  const auto [b, e] = (*ranges)[g];
  const int64_t total = (*tokens)[g];
  int64_t prefix = packed[b].length;
  int64_t cut = b + 1;
  int64_t cut_prefix = prefix;
  for (int64_t s = b + 2; s < e; ++s) {
    prefix += packed[s - 1].length;
    if (std::llabs(2 * prefix - total) < std::llabs(2 * cut_prefix - total)) {
      cut = s;
      cut_prefix = prefix;
    }
  }
  (*ranges)[g] = {b, cut};
  ranges->push_back({cut, e});
  tokens->push_back(total - cut_prefix);
  (*tokens)[g] = cut_prefix;
}

// Cuts the single piece of micro-batch `g` into two halves of the same document (each then a
// piece of its own, like the split policy's pieces); the second half becomes a new micro-batch.
void CutPiece(std::vector<Piece>* packed, int64_t g, std::vector<Range>* ranges,
              std::vector<int64_t>* tokens) {
  Piece& first = (*packed)[(*ranges)[g].first];
  const int32_t head = first.length - first.length / 2;
  const Piece second{first.document, first.begin + head, first.length - head};
  first.length = head;
  packed->push_back(second);
  const int64_t at = static_cast<int64_t>(packed->size()) - 1;
  ranges->push_back({at, at + 1});
  tokens->push_back(second.length);
  (*tokens)[g] = head;
}

// Plans `merges` merges that lower the micro-batch count: each time the two live micro-batches
// with the fewest tokens (ties: the earlier), if together they fit the budget. Fills `plan` with
// (kept, absorbed) index pairs and returns true when every merge fits.
bool PlanMerges(std::vector<int64_t> tokens, int64_t merges, int64_t budget,
                std::vector<std::pair<int64_t, int64_t>>* plan) {
  constexpr int64_t kDead = std::numeric_limits<int64_t>::max();
  for (int64_t k = 0; k < merges; ++k) {
    int64_t a = -1;
    int64_t b = -1;  // tokens[a] <= tokens[b] <= every other live micro-batch
    for (int64_t g = 0; g < static_cast<int64_t>(tokens.size()); ++g) {
      if (tokens[g] == kDead) continue;
      if (a < 0 || tokens[g] < tokens[a]) {
        b = a;
        a = g;
      } else if (b < 0 || tokens[g] < tokens[b]) {
        b = g;
      }
    }
    if (b < 0 || tokens[a] + tokens[b] > budget) return false;
    plan->push_back({std::min(a, b), std::max(a, b)});
    tokens[std::min(a, b)] += tokens[std::max(a, b)];
    tokens[std::max(a, b)] = kDead;
  }
  return true;
}

// Copies each merged pair's pieces to the end of `packed` as one range and drops the absorbed
// range (the copied-from slots stay in `packed`, unreferenced).
void ApplyMerges(const std::vector<std::pair<int64_t, int64_t>>& merges, std::vector<Piece>* packed,
                 std::vector<Range>* ranges) {
  std::vector<bool> absorbed(ranges->size(), false);
  for (const auto& [kept, gone] : merges) {
    const int64_t begin = static_cast<int64_t>(packed->size());
    for (int64_t g : {kept, gone}) {
      for (int64_t i = (*ranges)[g].first; i < (*ranges)[g].second; ++i) {
        packed->push_back((*packed)[i]);
      }
    }
    (*ranges)[kept] = {begin, static_cast<int64_t>(packed->size())};
    absorbed[gone] = true;
  }
  size_t out = 0;
  for (size_t g = 0; g < ranges->size(); ++g) {
    if (!absorbed[g]) (*ranges)[out++] = (*ranges)[g];
  }
  ranges->resize(out);
}

// Makes the micro-batch count a multiple of num_pairs without losing or duplicating a token, in
// this order of preference:
//  1. Up by splitting: while the count is off, the micro-batch with the most tokens among those
//     holding two or more pieces (ties: the later one) is cut in two at the piece boundary that
//     balances tokens, the second half appended. At most num_pairs - 1 per epoch, so the fill
//     cost is small, and the appended micro-batches complete the last row of the deal.
//  2. Down by merging (only when too few micro-batches hold two pieces, i.e. tiny windows or
//     pieces about as long as the budget): the two smallest, while they fit the budget.
//  3. Up by cutting a lone piece (the longest) in two halves of the same document; this costs that
//     document the attention across the cut, as under the split policy (stats.cut_pieces).
absl::Status Rebalance(int64_t num_pairs, int64_t budget, std::vector<Piece>* packed,
                       std::vector<Range>* ranges, EpochStats* stats) {
  std::vector<int64_t> tokens(ranges->size());
  int64_t splittable = 0;  // micro-batches that step 1 can add
  for (size_t g = 0; g < ranges->size(); ++g) {
    for (int64_t i = (*ranges)[g].first; i < (*ranges)[g].second; ++i) {
      tokens[g] += (*packed)[i].length;
    }
    splittable += (*ranges)[g].second - (*ranges)[g].first - 1;
  }
  const int64_t count = static_cast<int64_t>(ranges->size());
  if (count % num_pairs == 0) return absl::OkStatus();
  std::vector<std::pair<int64_t, int64_t>> merges;
  if (splittable < num_pairs - count % num_pairs &&
      PlanMerges(tokens, count % num_pairs, budget, &merges) &&
      count - count % num_pairs >= num_pairs) {
    ApplyMerges(merges, packed, ranges);
    stats->rebalance_merges += static_cast<int64_t>(merges.size());
    return absl::OkStatus();
  }
  while (static_cast<int64_t>(ranges->size()) % num_pairs != 0) {
    int64_t multi = -1;   // most tokens among micro-batches of two or more pieces
    int64_t single = -1;  // longest lone piece of two or more tokens
    for (int64_t g = 0; g < static_cast<int64_t>(ranges->size()); ++g) {
      const int64_t n = (*ranges)[g].second - (*ranges)[g].first;
      if (n >= 2 && (multi < 0 || tokens[g] >= tokens[multi])) multi = g;
      if (n == 1 && tokens[g] >= 2 && (single < 0 || tokens[g] >= tokens[single])) single = g;
    }
    if (multi >= 0) {
      SplitMicroBatch(*packed, multi, ranges, &tokens);
    } else if (single >= 0) {
      CutPiece(packed, single, ranges, &tokens);
      ++stats->cut_pieces;
      ++stats->pieces;
    } else {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot give each of ", num_pairs, " data-parallel pairs the same number of ",
          "micro-batches: the epoch's ", stats->tokens, " tokens fill ", ranges->size(),
          " micro-batches of one token each, none of which can be merged; use fewer pairs"));
    }
    ++stats->rebalance_splits;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LongDocuments> ParseLongDocuments(absl::string_view text) {
  if (text == "truncate") return LongDocuments::kTruncate;
  if (text == "split") return LongDocuments::kSplit;
  return absl::InvalidArgumentError(
      absl::StrCat("data.long_documents: expected truncate or split, got \"", text, "\""));
}

absl::string_view LongDocumentsName(LongDocuments policy) {
  return policy == LongDocuments::kTruncate ? "truncate" : "split";
}

absl::Status ValidateBatchingOptions(const BatchingOptions& o) {
  if (o.token_budget < 1 || o.token_budget > kMaxTokenBudget) {
    return absl::InvalidArgumentError(absl::StrCat("batching.token_budget: must be in [1, ",
                                                   kMaxTokenBudget, "], got ", o.token_budget));
  }
  if (o.max_length < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.max_length: must be >= 1, got ", o.max_length));
  }
  if (o.max_length > o.token_budget) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.max_length (", o.max_length, ") must be <= batching.token_budget (",
                     o.token_budget, "): a document piece has to fit in one micro-batch"));
  }
  if (o.pack_window < 1 || o.pack_window > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pack_window (a batching option of the code, not a run.yaml field): must be "
                     "in [1, 2^31-1], got ",
                     o.pack_window));
  }
  if (o.num_pairs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement.pairs: must be >= 1, got ", o.num_pairs));
  }
  if (o.grad_accum < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batching.grad_accum: must be >= 1, got ", o.grad_accum));
  }
  return absl::OkStatus();
}

double EpochStats::fill_ratio() const {
  if (micro_batches == 0 || token_budget == 0) return 0.0;
  return static_cast<double>(tokens) / (static_cast<double>(micro_batches) * token_budget);
}

int64_t EpochPlan::steps() const {
  return (micro_batches_per_pair() + grad_accum_ - 1) / grad_accum_;
}

int64_t EpochPlan::StepMicroBatches(int64_t step_in_epoch) const {
  const int64_t first = step_in_epoch * grad_accum_;
  return std::max<int64_t>(0, std::min(grad_accum_, micro_batches_per_pair() - first));
}

absl::Span<const Piece> EpochPlan::GlobalMicroBatch(int64_t g) const {
  const Range& r = ranges_[g];
  return absl::Span<const Piece>(pieces_.data() + r.first, r.second - r.first);
}

absl::Span<const Piece> EpochPlan::MicroBatch(int64_t pair, int64_t index) const {
  return GlobalMicroBatch(index * num_pairs_ + pair);
}

uint64_t EpochPlan::Digest() const {
  uint64_t h = SeedHash(0, {static_cast<uint64_t>(epoch_), ranges_.size()});
  for (size_t g = 0; g < ranges_.size(); ++g) {
    for (const Piece& p : GlobalMicroBatch(g)) {
      h = SeedHash(h, {static_cast<uint64_t>(p.document), static_cast<uint64_t>(p.begin),
                       static_cast<uint64_t>(p.length)});
    }
    h = SeedHash(h, {~uint64_t{0}});  // micro-batch boundary
  }
  return h;
}

absl::StatusOr<EpochPlan> PlanEpoch(const DocumentSource& source, const BatchingOptions& options,
                                    int64_t epoch) {
  RETURN_IF_ERROR(ValidateBatchingOptions(options));
  if (epoch < 0) return absl::InvalidArgumentError(absl::StrCat("epoch must be >= 0, got ", epoch));
  EpochPlan plan;
  plan.epoch_ = epoch;
  plan.num_pairs_ = options.num_pairs;
  plan.grad_accum_ = options.grad_accum;
  EpochStats& stats = plan.stats_;
  stats.token_budget = options.token_budget;
  stats.documents = source.num_documents();

  SplitMix64 rng(SeedHash(kTagEpochShuffle, {options.seed, static_cast<uint64_t>(epoch)}));
  std::vector<int64_t> order(stats.documents);
  std::iota(order.begin(), order.end(), 0);
  DeterministicShuffle(order.data(), stats.documents, rng);

  std::vector<Piece> pieces;
  RETURN_IF_ERROR(CutPieces(source, options, order, &pieces, &stats));
  stats.pieces = static_cast<int64_t>(pieces.size());
  if (stats.pieces < options.num_pairs) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the data set has ", stats.documents - stats.empty_documents, " non-empty documents (",
        stats.pieces, " pieces) but the run has ", options.num_pairs,
        " data-parallel pairs; every pair needs at least one micro-batch per epoch"));
  }
  for (const Piece& p : pieces) stats.tokens += p.length;

  PackWindows(pieces, options, rng, &plan.pieces_, &plan.ranges_);
  RETURN_IF_ERROR(
      Rebalance(options.num_pairs, options.token_budget, &plan.pieces_, &plan.ranges_, &stats));
  stats.micro_batches = static_cast<int64_t>(plan.ranges_.size());
  return plan;
}

}  // namespace dflash::batching
