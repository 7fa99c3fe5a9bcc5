// The data cursor and the Batcher: serialization, refusal of foreign cursors, and the property
// that matters: a run resumed from the cursor of any step produces exactly the steps (pieces and
// anchor seeds) the uninterrupted run produced after it.
#include "common/batching/cursor.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/batching/batcher.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/batching/batching_test_util.h"

namespace dflash::batching {
namespace {

using ::testing::HasSubstr;
using testing::PropertySeeds;
using testing::RandomOptions;
using testing::RandomSource;

// Every field of a step that the workers see, as text, so steps compare with one EXPECT_EQ.
std::string StepText(const StepPlan& s) {
  std::string out = absl::StrCat("e", s.epoch, " s", s.step_in_epoch, " g", s.step, " m",
                                 s.micro_batches_per_pair, ":");
  for (const MicroBatchPlan& mb : s.micro_batches) {
    absl::StrAppend(&out, " [p", mb.pair, " i", mb.index_in_epoch, " k", mb.index_in_step, " a",
                    mb.anchor_seed.Hash());
    for (const Piece& p : mb.pieces)
      absl::StrAppend(&out, " ", p.document, "@", p.begin, "+", p.length);
    out += "]";
  }
  return out;
}

TEST(DataCursor, SerializeRoundTrip) {
  DataCursor c;
  c.epoch = 3;
  c.micro_batch = 40;
  c.step = 1234;
  c.seed = 0xfedcba9876543210ULL;  // above INT64_MAX
  c.num_pairs = 4;
  c.token_budget = 8192;
  c.max_length = 4096;
  c.long_documents = LongDocuments::kSplit;
  c.pack_window = 2048;
  c.grad_accum = 2;
  c.num_documents = 100000;
  c.data_fingerprint = 0x0123456789abcdefULL;
  const std::string text = SerializeCursor(c);
  EXPECT_EQ(text,
            "v=1;epoch=3;micro_batch=40;step=1234;seed=18364758544493064720;num_pairs=4;"
            "token_budget=8192;max_length=4096;pack_window=2048;grad_accum=2;"
            "num_documents=100000;long_documents=split;data_fingerprint=0123456789abcdef");
  absl::StatusOr<DataCursor> parsed = ParseCursor(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, c);
}

TEST(DataCursor, ParseRejectsMalformedText) {
  const std::string good = SerializeCursor(DataCursor());
  ASSERT_TRUE(ParseCursor(good).ok());
  for (const std::string& bad :
       {std::string(""), std::string("v=2;") + good.substr(4), good.substr(4), good + ";extra=1",
        good + ";epoch=1", good.substr(0, good.rfind(';')),
        absl::StrCat("v=1;epoch=-1", good.substr(good.find(";micro_batch"))),
        absl::StrCat("v=1;epoch=x", good.substr(good.find(";micro_batch"))), good + ";novalue"}) {
    EXPECT_FALSE(ParseCursor(bad).ok()) << bad;
  }
}

TEST(Batcher, ResumeFromAnyCutEqualsUninterrupted) {
  for (uint64_t seed : PropertySeeds(200)) {
    SCOPED_TRACE(seed);
    SplitMix64 rng(seed);
    const BatchingOptions o = RandomOptions(rng);
    auto source = RandomSource(rng, 40 + static_cast<int64_t>(rng.Below(120)), o.max_length);
    absl::StatusOr<std::unique_ptr<Batcher>> full = Batcher::Create(source.get(), o);
    ASSERT_TRUE(full.ok()) << full.status();
    // Three epochs (or at least 3 steps), recording the cursor committed with each step.
    std::vector<std::string> steps;
    std::vector<std::string> cursors = {SerializeCursor((*full)->cursor())};
    while ((*full)->cursor().epoch < 3) {
      absl::StatusOr<StepPlan> step = (*full)->NextStep();
      ASSERT_TRUE(step.ok()) << step.status();
      ASSERT_EQ(step->step, static_cast<int64_t>(steps.size()));
      steps.push_back(StepText(*step));
      cursors.push_back(SerializeCursor((*full)->cursor()));
    }
    for (int cut_try = 0; cut_try < 4; ++cut_try) {
      const size_t cut = rng.Below(steps.size());
      absl::StatusOr<DataCursor> saved = ParseCursor(cursors[cut]);
      ASSERT_TRUE(saved.ok());
      absl::StatusOr<std::unique_ptr<Batcher>> resumed = Batcher::Create(source.get(), o, &*saved);
      ASSERT_TRUE(resumed.ok()) << resumed.status();
      for (size_t i = cut; i < steps.size(); ++i) {
        absl::StatusOr<StepPlan> step = (*resumed)->NextStep();
        ASSERT_TRUE(step.ok());
        ASSERT_EQ(StepText(*step), steps[i]) << "cut at " << cut;
        ASSERT_EQ(SerializeCursor((*resumed)->cursor()), cursors[i + 1]);
      }
    }
  }
}

TEST(Batcher, StepsCoverEachEpochOnceWithShortLastStep) {
  // 7 micro-batches per pair (2 pairs), grad_accum 3: steps of 3, 3 and a short 1.
  InMemorySource source;
  for (int d = 0; d < 14; ++d) source.Add(std::vector<int32_t>(10, d), std::vector<uint8_t>(10, 1));
  BatchingOptions o;
  o.token_budget = 16;
  o.max_length = 16;
  o.num_pairs = 2;
  o.grad_accum = 3;
  absl::StatusOr<std::unique_ptr<Batcher>> batcher = Batcher::Create(&source, o);
  ASSERT_TRUE(batcher.ok());
  std::vector<int64_t> sizes;
  std::vector<int> seen(14, 0);
  while ((*batcher)->cursor().epoch == 0) {
    absl::StatusOr<StepPlan> step = (*batcher)->NextStep();
    ASSERT_TRUE(step.ok());
    sizes.push_back(step->micro_batches_per_pair);
    ASSERT_EQ(step->micro_batches.size(), static_cast<size_t>(2 * step->micro_batches_per_pair));
    for (const MicroBatchPlan& mb : step->micro_batches) {
      EXPECT_EQ(mb.anchor_seed, (AnchorSeed{0, step->step, mb.index_in_step * 2 + mb.pair}));
      for (const Piece& p : mb.pieces) ++seen[p.document];
    }
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{3, 3, 1}));
  EXPECT_EQ(seen, std::vector<int>(14, 1));
  EXPECT_EQ((*batcher)->cursor().micro_batch, 0);
  EXPECT_EQ((*batcher)->cursor().step, 3);
}

TEST(Batcher, RefusesCursorFromOtherSettingsOrData) {
  SplitMix64 rng(11);
  auto source = RandomSource(rng, 100, 64);
  BatchingOptions o;
  o.token_budget = 128;
  o.max_length = 64;
  o.num_pairs = 2;
  o.seed = 1;
  absl::StatusOr<std::unique_ptr<Batcher>> batcher = Batcher::Create(source.get(), o);
  ASSERT_TRUE(batcher.ok());
  ASSERT_TRUE((*batcher)->NextStep().ok());
  const DataCursor saved = (*batcher)->cursor();

  BatchingOptions other = o;
  other.seed = 2;
  other.num_pairs = 4;
  absl::Status s = Batcher::Create(source.get(), other, &saved).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("seed: saved 1, this run 2"));
  EXPECT_THAT(s.message(), HasSubstr("num_pairs: saved 2, this run 4"));
  other = o;
  other.token_budget = 256;
  EXPECT_THAT(Batcher::Create(source.get(), other, &saved).status().message(),
              HasSubstr("token_budget: saved 128, this run 256"));

  // Same count, one length changed: the fingerprint catches it.
  SplitMix64 rng2(11);
  auto changed = RandomSource(rng2, 100, 64);
  changed->Add({1, 2, 3}, {1, 1, 1});
  EXPECT_THAT(Batcher::Create(changed.get(), o, &saved).status().message(),
              HasSubstr("num_documents: saved 100, this run 101"));
  InMemorySource same_count;
  for (int64_t d = 0; d < 100; ++d) {
    const DocumentView v = source->document(d);
    std::vector<int32_t> t(v.tokens.begin(), v.tokens.end());
    if (d == 50) t.push_back(7);
    same_count.Add(t, std::vector<uint8_t>(t.size(), 1));
  }
  EXPECT_THAT(Batcher::Create(&same_count, o, &saved).status().message(),
              HasSubstr("data_fingerprint"));

  // A position outside the epoch.
  DataCursor far = saved;
  far.micro_batch = 1 << 20;
  EXPECT_THAT(Batcher::Create(source.get(), o, &far).status().message(),
              HasSubstr("points at micro-batch"));
  EXPECT_TRUE(Batcher::Create(source.get(), o, &saved).ok());
}

}  // namespace
}  // namespace dflash::batching
