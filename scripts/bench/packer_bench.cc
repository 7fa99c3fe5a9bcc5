// packer_bench: how fast the coordinator plans an epoch and materializes micro-batches, and how
// full the micro-batches are, on synthetic log-normal document lengths (median ~600, mean ~1000
// before clipping, sigma 1; the shape of chat SFT data). CPU only.
//
//   packer_bench [--documents N (1000000)] [--window_documents N (200000)] [--batches N (2000)]
//
// Prints three tables: epoch planning per (budget, max_length, policy); fill against the packing
// window; materialization and anchor sampling throughput.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/batching/anchors.h"
#include "common/batching/cursor.h"
#include "common/batching/memory_source.h"
#include "common/batching/packed_batch.h"
#include "common/batching/packer.h"
#include "common/batching/plan.h"

namespace dflash::batching {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

const double kMu = std::log(1000.0) - 0.5;  // mean ~1000 before clipping, sigma 1

struct Flags {
  int64_t documents = 1000000;
  int64_t window_documents = 200000;
  int64_t batches = 2000;
};

bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const int64_t v = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--documents") == 0) {
      flags->documents = v;
    } else if (std::strcmp(argv[i], "--window_documents") == 0) {
      flags->window_documents = v;
    } else if (std::strcmp(argv[i], "--batches") == 0) {
      flags->batches = v;
    } else {
      return false;
    }
  }
  return argc % 2 == 1;
}

// Plans one epoch of the given data and prints a row; returns false on a planning error.
bool PlanRow(const SyntheticSource& source, const BatchingOptions& o, const char* lengths) {
  int64_t tokens_in = 0;
  for (int64_t i = 0; i < source.num_documents(); ++i) tokens_in += source.length(i);
  const Clock::time_point start = Clock::now();
  absl::StatusOr<EpochPlan> plan = PlanEpoch(source, o, 0);
  const double s = Seconds(start);
  if (!plan.ok()) {
    std::fprintf(stderr, "PlanEpoch: %s\n", plan.status().ToString().c_str());
    return false;
  }
  const EpochStats& st = plan->stats();
  std::printf("| %6lld | %6lld | %-8s | %-12s | %8lld | %7.3f | %7.2f | %6.0f | %8.4f | %5lld |\n",
              static_cast<long long>(o.token_budget), static_cast<long long>(o.max_length),
              std::string(LongDocumentsName(o.long_documents)).c_str(), lengths,
              static_cast<long long>(st.micro_batches), s, source.num_documents() / s / 1e6,
              tokens_in / s / 1e6, st.fill_ratio(), static_cast<long long>(st.rebalance_splits));
  return true;
}

bool PlanningTable(const Flags& f) {
  std::printf("\n## Epoch planning, %lld documents, 8 pairs, window %lld\n\n",
              static_cast<long long>(f.documents), static_cast<long long>(kDefaultPackWindow));
  std::printf(
      "| budget | max_len | policy   | lengths      | micro-b. |  plan s | Mdocs/s | Mtok/s |"
      "     fill | rebal |\n|---|---|---|---|---|---|---|---|---|---|\n");
  struct Case {
    int64_t budget, max_length;
    LongDocuments policy;
    int64_t clip;  // lengths clipped to [16, clip]
  };
  const Case cases[] = {
      {4096, 2048, LongDocuments::kTruncate, 2048},   {4096, 4096, LongDocuments::kTruncate, 4096},
      {8192, 2048, LongDocuments::kTruncate, 2048},   {8192, 4096, LongDocuments::kTruncate, 4096},
      {8192, 8192, LongDocuments::kTruncate, 8192},   {8192, 4096, LongDocuments::kSplit, 32768},
      {16384, 4096, LongDocuments::kTruncate, 4096},  {16384, 8192, LongDocuments::kTruncate, 8192},
      {16384, 16384, LongDocuments::kTruncate, 16384}};
  for (const Case& c : cases) {
    SyntheticSource source(LogNormalLengths(f.documents, kMu, 1.0, 16, c.clip, 1), 1);
    BatchingOptions o;
    o.token_budget = c.budget;
    o.max_length = c.max_length;
    o.long_documents = c.policy;
    o.num_pairs = 8;
    o.seed = 1;
    const std::string lengths = "[16, " + std::to_string(c.clip) + "]";
    if (!PlanRow(source, o, lengths.c_str())) return false;
  }
  return true;
}

bool WindowTable(const Flags& f) {
  std::printf("\n## Fill against pack_window, budget 8192, %lld documents, 1 pair\n\n",
              static_cast<long long>(f.window_documents));
  const int64_t windows[] = {16, 64, 256, 512, 1024, 2048, 4096, 16384};
  std::printf("| max_len |");
  for (int64_t w : windows) std::printf(" w=%lld |", static_cast<long long>(w));
  std::printf("\n|---|");
  for (size_t i = 0; i < sizeof(windows) / sizeof(windows[0]); ++i) std::printf("---|");
  std::printf("\n");
  for (int64_t max_length : {4096, 8192}) {
    SyntheticSource source(LogNormalLengths(f.window_documents, kMu, 1.0, 16, max_length, 2), 2);
    std::printf("| %7lld |", static_cast<long long>(max_length));
    for (int64_t w : windows) {
      BatchingOptions o;
      o.token_budget = 8192;
      o.max_length = max_length;
      o.pack_window = w;
      absl::StatusOr<EpochPlan> plan = PlanEpoch(source, o, 0);
      if (!plan.ok()) return false;
      std::printf(" %.4f |", plan->stats().fill_ratio());
    }
    std::printf("\n");
  }
  return true;
}

// The same best-fit-decreasing with a std::set<(room, bin)> in place of CapacityIndex, to
// measure what the bucketed index buys.
int64_t PackWithSet(const std::vector<int32_t>& lengths, int64_t budget, int64_t window) {
  int64_t bins_total = 0;
  std::vector<int32_t> order;
  for (size_t w0 = 0; w0 < lengths.size(); w0 += window) {
    const size_t w1 = std::min(lengths.size(), w0 + static_cast<size_t>(window));
    order.clear();
    for (size_t i = w0; i < w1; ++i) order.push_back(static_cast<int32_t>(i));
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return lengths[a] != lengths[b] ? lengths[a] > lengths[b] : a < b;
    });
    std::set<std::pair<int64_t, int32_t>> open;
    int32_t bins = 0;
    for (int32_t i : order) {
      auto it = open.lower_bound({lengths[i], -1});
      if (it == open.end()) {
        open.insert({budget - lengths[i], bins++});
      } else {
        const std::pair<int64_t, int32_t> b = *it;
        open.erase(it);
        if (b.first > lengths[i]) open.insert({b.first - lengths[i], b.second});
      }
    }
    bins_total += bins;
  }
  return bins_total;
}

void PackerIndexTable(const Flags& f) {
  std::vector<int64_t> l64 = LogNormalLengths(f.documents, kMu, 1.0, 16, 4096, 3);
  std::vector<int32_t> lengths(l64.begin(), l64.end());
  std::printf("\n## Best-fit index, %lld documents, budget 8192, window %lld (packing only)\n\n",
              static_cast<long long>(f.documents), static_cast<long long>(kDefaultPackWindow));
  std::printf("| index | bins | ms | ns/document |\n|---|---|---|---|\n");
  Clock::time_point start = Clock::now();
  CapacityIndex index(8192);
  std::vector<int32_t> bin_of;
  int64_t bins = 0;
  for (size_t w0 = 0; w0 < lengths.size(); w0 += kDefaultPackWindow) {
    const size_t n = std::min<size_t>(kDefaultPackWindow, lengths.size() - w0);
    bins +=
        PackBestFitDecreasing(absl::MakeConstSpan(lengths.data() + w0, n), 8192, &index, &bin_of);
  }
  double s = Seconds(start);
  std::printf("| CapacityIndex | %lld | %.1f | %.1f |\n", static_cast<long long>(bins), s * 1e3,
              s * 1e9 / lengths.size());
  start = Clock::now();
  bins = PackWithSet(lengths, 8192, kDefaultPackWindow);
  s = Seconds(start);
  std::printf("| std::set | %lld | %.1f | %.1f |\n", static_cast<long long>(bins), s * 1e3,
              s * 1e9 / lengths.size());
}

bool MaterializeTable(const Flags& f) {
  SyntheticSource source(LogNormalLengths(f.documents, kMu, 1.0, 16, 4096, 4), 4);
  BatchingOptions o;
  o.token_budget = 8192;
  o.max_length = 4096;
  absl::StatusOr<EpochPlan> plan = PlanEpoch(source, o, 0);
  if (!plan.ok()) return false;
  const int64_t n = std::min(f.batches, plan->stats().micro_batches);
  PackedBatch batch;
  int64_t tokens = 0;
  int64_t anchors = 0;
  double materialize_s = 0;
  double anchor_s = 0;
  for (int64_t g = 0; g < n; ++g) {
    Clock::time_point start = Clock::now();
    if (!MaterializeBatch(source, plan->GlobalMicroBatch(g), o.token_budget, &batch).ok()) {
      return false;
    }
    materialize_s += Seconds(start);
    start = Clock::now();
    absl::StatusOr<std::vector<int32_t>> a =
        SampleAnchors(batch.loss_mask, batch.doc_ids, 512, AnchorSeed{1, g, 0});
    anchor_s += Seconds(start);
    if (!a.ok()) return false;
    tokens += batch.total_tokens;
    anchors += static_cast<int64_t>(a->size());
  }
  std::printf("\n## Per micro-batch, budget 8192, %lld micro-batches\n\n",
              static_cast<long long>(n));
  std::printf("| stage | us/micro-batch | Mtok/s |\n|---|---|---|\n");
  std::printf("| MaterializeBatch | %.1f | %.0f |\n", materialize_s * 1e6 / n,
              tokens / materialize_s / 1e6);
  std::printf("| SampleAnchors (512 of ~%lld tokens) | %.1f | %.0f |\n",
              static_cast<long long>(tokens / n), anchor_s * 1e6 / n, tokens / anchor_s / 1e6);
  std::printf("\nmean anchors per micro-batch: %.1f\n", static_cast<double>(anchors) / n);
  const Clock::time_point start = Clock::now();
  const uint64_t fingerprint = DataFingerprint(source);
  std::printf("DataFingerprint over %lld documents: %.1f ms (%016llx)\n",
              static_cast<long long>(source.num_documents()), Seconds(start) * 1e3,
              static_cast<unsigned long long>(fingerprint));
  return true;
}

}  // namespace
}  // namespace dflash::batching

int main(int argc, char** argv) {
  dflash::batching::Flags flags;
  if (!dflash::batching::ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr,
                 "usage: packer_bench [--documents N] [--window_documents N] [--batches N]\n");
    return 2;
  }
  if (!dflash::batching::PlanningTable(flags)) return 1;
  if (!dflash::batching::WindowTable(flags)) return 1;
  dflash::batching::PackerIndexTable(flags);
  if (!dflash::batching::MaterializeTable(flags)) return 1;
  return 0;
}
