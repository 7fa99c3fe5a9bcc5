// The two halves of a pair's step in one process, as the workers run them (target_runner.h and
// drafter_runner.h over the shared-memory channel): a step trains and both sides report the same
// checksum; a batch whose id is not the one the drafter expects is refused and not trained on.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <future>

#include "absl/strings/str_cat.h"
#include "common/batching/anchors.h"
#include "common/batching/batcher.h"
#include "common/batching/packed_batch.h"
#include "common/data/run_data.h"
#include "common/run/resolve.h"
#include "services/drafter_worker/drafter_runner.h"
#include "services/target_worker/target_runner.h"

namespace dflash::worker {
namespace {

using ::testing::HasSubstr;

constexpr char kYaml[] = R"(
name: runner
seed: 1
target: {path: "builtin:tiny-qwen3", dtype: float32}
drafter: {layers: 1, block_size: 8}
data: {train: "builtin:tiny-chat", max_length: 256}
batching: {token_budget: 512, max_anchors: 32, grad_accum: 2}
optim: {max_steps: 4}
)";

class StepRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto spec = config::ParseRunSpec(kYaml, "test", config::RunSpecOptions{"", false});
    ASSERT_TRUE(spec.ok()) << spec.status();
    ctx_.run_id = "runner-test";
    ctx_.spec = *spec;
    ctx_.total_steps = 4;
    ctx_.channel = absl::StrCat("dflash-step-runner-test-", getpid());
    auto data = data::OpenRunData(*spec, false);
    ASSERT_TRUE(data.ok()) << data.status();
    data_ = std::make_unique<data::RunData>(*std::move(data));
    auto options = data::BatchingOptionsFor(*spec, 1);
    ASSERT_TRUE(options.ok());
    auto batcher = batching::Batcher::Create(&data_->source(), *options, nullptr);
    ASSERT_TRUE(batcher.ok());
    batcher_ = *std::move(batcher);
    target_ = NewTargetRunner();
    drafter_ = NewDrafterRunner();
    auto t = target_->Prepare(ctx_);  // creates the channel
    ASSERT_TRUE(t.ok()) << t.status();
    auto d = drafter_->Prepare(ctx_);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(t->applied.at("target.layer_ids"), d->applied.at("target.layer_ids"));
    EXPECT_EQ(d->applied.at("batching.max_anchors"), "32");
    // Each runner echoes exactly the settings echo's table for its role (common/run/resolve.h),
    // read back from what it built.
    auto keys = [](const std::map<std::string, std::string>& applied) {
      std::vector<std::string> k;
      for (const auto& [key, value] : applied) k.push_back(key);
      return k;
    };
    EXPECT_THAT(keys(t->applied), ::testing::UnorderedElementsAreArray(run::TargetEchoKeys(0)));
    EXPECT_THAT(keys(d->applied),
                ::testing::UnorderedElementsAreArray(run::DrafterEchoKeys(/*has_gamma=*/true)));
    EXPECT_EQ(t->applied.at("target.path"), "builtin:tiny-qwen3");
    EXPECT_EQ(t->applied.at("placement.transport"), "host");
    EXPECT_EQ(d->applied.at("placement.transport"), "host");
    EXPECT_EQ(d->applied.at("resume.step"), "0");
    EXPECT_EQ(d->applied.at("optim.total_steps"), "4");
  }

  // The coordinator's part: the next step's pieces and anchors.
  StepWork NextWork() {
    StepWork w;
    auto plan = batcher_->NextStep();
    EXPECT_TRUE(plan.ok());
    w.step = plan->step;
    for (const auto& mb : plan->micro_batches) {
      batching::PackedBatch b;
      EXPECT_TRUE(batching::MaterializeBatch(data_->source(), mb.pieces, 512, &b).ok());
      StepMicroBatch& m = w.micro_batches.emplace_back();
      m.batch_id = (static_cast<uint64_t>(w.step + 1) << 20) | mb.index_in_step;
      m.pieces = mb.pieces;
      m.anchors = *batching::SampleAnchors(b.loss_mask, b.doc_ids, 32, mb.anchor_seed);
    }
    return w;
  }

  RunContext ctx_;
  std::unique_ptr<data::RunData> data_;
  std::unique_ptr<batching::Batcher> batcher_;
  std::unique_ptr<StepRunner> target_, drafter_;
};

TEST_F(StepRunnerTest, StepTrainsOnWhatTheTargetSentAndRefusesAnotherBatchId) {
  const StepWork first = NextWork();
  auto sending = std::async(std::launch::async, [&] { return target_->RunStep(first); });
  absl::StatusOr<StepReport> trained = drafter_->RunStep(first);
  absl::StatusOr<StepReport> sent = sending.get();
  ASSERT_TRUE(sent.ok()) << sent.status();
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_NE(sent->checksum, 0u);
  EXPECT_EQ(trained->checksum, sent->checksum);  // trained on exactly what was sent
  EXPECT_EQ(trained->micro_batches, 2);
  EXPECT_EQ(trained->tokens, sent->tokens);
  EXPECT_TRUE(std::isfinite(trained->loss));
  EXPECT_FALSE(trained->skipped);
  EXPECT_EQ(trained->slot_accuracy.size(), 8u);

  // The target sends step 1; the drafter expects other batch ids (a pair out of step).
  const StepWork second = NextWork();
  StepWork wrong = second;
  for (StepMicroBatch& m : wrong.micro_batches) m.batch_id += 7;
  auto sending2 = std::async(std::launch::async, [&] { return target_->RunStep(second); });
  absl::StatusOr<StepReport> refused = drafter_->RunStep(wrong);
  sending2.wait();
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr(std::to_string(wrong.micro_batches[0].batch_id)));
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr(std::to_string(second.micro_batches[0].batch_id)));
  // Not trained on: the drafter still has one step, so step 2 is refused as out of order.
  StepWork third = NextWork();
  absl::StatusOr<StepReport> out_of_order = drafter_->RunStep(third);
  EXPECT_EQ(out_of_order.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(out_of_order.status().message()), HasSubstr("has trained 1 steps"));
  // The drafter aborted the channel: the target's next step ends at once instead of waiting.
  absl::StatusOr<StepReport> after = target_->RunStep(third);
  EXPECT_EQ(after.status().code(), absl::StatusCode::kAborted) << after.status();
}

}  // namespace
}  // namespace dflash::worker
