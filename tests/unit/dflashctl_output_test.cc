// dflashctl's human output: the progress line and the data summary of `status`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "services/dflashctl/output.h"
#include "services/dflashctl/progress.h"

namespace dflash::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(ProgressLine, HalfWayShowsBarCountsRateAndEta) {
  ProgressSample s{512ull << 20, 1024ull << 20, 12345, 3'400'000};
  const std::string line = ProgressBar::Line(s, 10.0);
  EXPECT_THAT(line, StartsWith("[##########..........]  50%  512.0 MiB/1.0 GiB"));
  EXPECT_THAT(line, HasSubstr("12.3K docs  3.4M tok  340.0K tok/s  ETA 0:10"));
}

TEST(ProgressLine, DoneShowsTotalTimeInsteadOfEta) {
  ProgressSample s{100, 100, 3, 999};
  const std::string line = ProgressBar::Line(s, 75.0);
  EXPECT_THAT(line, StartsWith("[####################] 100%"));
  EXPECT_THAT(line, HasSubstr("in 1:15"));
  EXPECT_THAT(line, ::testing::Not(HasSubstr("ETA")));
}

TEST(ProgressLine, EmptyInputDoesNotDivideByZero) {
  const std::string line = ProgressBar::Line(ProgressSample{}, 0.0);
  EXPECT_THAT(line, StartsWith("[....................]   0%  0 B/0 B  0 docs  0 tok"));
}

TEST(DataLines, ListsSkippedRecordsByReasonInNameOrder) {
  v1::DataSummary d;
  d.set_prepared_path("/data/chat.dfdata");
  d.set_tokenizer_fingerprint("0123456789abcdef0123");
  d.set_documents(10);
  d.set_tokens(5000);
  d.set_supervised_tokens(3000);
  d.set_records_read(14);
  d.set_records_skipped(4);
  (*d.mutable_skipped_by_reason())["unknown_role"] = 1;
  (*d.mutable_skipped_by_reason())["malformed_json"] = 3;
  d.set_micro_batches_per_epoch(2);
  d.set_pairs(1);
  d.set_steps_per_epoch(2);
  d.set_fill_ratio(0.9876);
  const std::string text = DataLines(d);
  EXPECT_THAT(text, HasSubstr("data:     /data/chat.dfdata\n"));
  EXPECT_THAT(text, HasSubstr("tokenizer 0123456789ab\n"));
  EXPECT_THAT(text, HasSubstr("skipped 4 (malformed_json 3, unknown_role 1)"));
  EXPECT_THAT(text, HasSubstr("fill 98.8%"));
}

TEST(StepProgressLine, ShowsStepLossAcceptanceRateAndEta) {
  StepSample s;
  s.step = 80;
  s.total_steps = 200;
  s.loss = 3.41234;
  s.acceptance_length = 2.314;
  s.tokens_per_s = 12345;
  s.step_seconds = 0.1;
  EXPECT_EQ(StepProgress::Line(s),
            "[########............]  step 80/200  epoch 0  loss 3.4123  acc.len 2.31  12.3K tok/s"
            "  ETA 0:12");
  s.step = 200;
  EXPECT_THAT(StepProgress::Line(s), ::testing::Not(::testing::HasSubstr("ETA")));
}

TEST(RunDetails, ShowsRunDirAndLastStep) {
  v1::RunStatus r;
  r.set_run_id("demo-1");
  r.set_run_dir("/var/lib/dflash/runs/demo-1");
  v1::StepMetrics* m = r.mutable_last_step();
  m->set_step(299);
  m->set_loss(2.71093);
  m->set_acceptance_length(3.18);
  m->set_tokens(1024);
  m->set_seconds(0.35);
  const std::string text = RunDetails(r);
  EXPECT_THAT(text, ::testing::HasSubstr("run dir:  /var/lib/dflash/runs/demo-1\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("last step: 300 (epoch 0): loss 2.7109, acc.len 3.18"));
  EXPECT_THAT(text, ::testing::HasSubstr("1024 tokens in 0.35 s"));
}

// The resolved feature layers and mask token (RunStatus.resolved_target), as text and in -o json.
TEST(RunDetails, ShowsTheResolvedLayerIdsAndMaskToken) {
  v1::RunStatus r;
  r.set_run_id("smol-1");
  EXPECT_THAT(RunDetails(r), ::testing::Not(::testing::HasSubstr("mask token")));
  v1::ResolvedTarget* t = r.mutable_resolved_target();
  for (int64_t id : {1, 8, 15, 22, 28}) t->add_target_layer_ids(id);
  t->set_mask_token_id(3);
  t->set_mask_token("<repo_name>");
  t->set_mask_token_rule("the first special token the chat template and text framing never use");
  const std::string text = RunDetails(r);
  EXPECT_THAT(text, ::testing::HasSubstr("target layer ids: 1,8,15,22,28\n"));
  EXPECT_THAT(text, ::testing::HasSubstr("mask token id:    3 (<repo_name>: the first special "
                                         "token the chat template and text framing never use)\n"));
  const std::string json = ToJson(r);
  EXPECT_THAT(
      json,
      ::testing::HasSubstr(
          R"("resolved_target":{"target_layer_ids":["1","8","15","22","28"],"mask_token_id":"3","mask_token":"\u003crepo_name\u003e")"));
}

// An evaluation running beside the steps (RunStatus.evaluating): which snapshot, where, since when.
TEST(RunDetails, ShowsTheEvaluationRunningBesideTraining) {
  v1::RunStatus r;
  r.set_run_id("demo-1");
  EXPECT_THAT(RunDetails(r), ::testing::Not(::testing::HasSubstr("evaluating")));
  v1::EvalInProgress* e = r.mutable_evaluating();
  e->set_step(400);
  e->set_worker("t0");
  e->set_started_unix_ms(1764758400000);
  EXPECT_THAT(RunDetails(r),
              ::testing::HasSubstr("evaluating: the drafter of step 400 on t0 (pair 0's target, "
                                   "beside the training steps) since "));
  EXPECT_THAT(ToJson(r), ::testing::HasSubstr(R"("evaluating":{"step":"400","worker":"t0")"));
}

// The eval table's line of the reference package's measures: both taus and the histogram.
TEST(EvalTable, ShowsEmittedTausAndHistogram) {
  v1::EvalResult r;
  r.set_drafter_dir("/d");
  r.set_block_size(2);
  r.set_tau(1.5);
  r.set_verifications(4);
  r.set_tau_pooled(1.25);
  r.set_tau_prompt_mean(1.375);
  for (double h : {0.0, 0.75, 0.25}) r.add_emitted_histogram(h);
  const std::string table = EvalTable(r);
  EXPECT_THAT(table, ::testing::HasSubstr("tau        1.500 tokens per verification (4 "
                                          "verifications)\n"));
  EXPECT_THAT(table, ::testing::HasSubstr(
                         "emitted    1.250 tokens per verification pooled, 1.375 mean of the "
                         "prompts' means; share of verifications by tokens emitted: 0:0.000 "
                         "1:0.750 2:0.250\n"));
}

// With a baseline: the speed-up and how many prompts both decodes emitted alike; without one,
// neither line.
TEST(EvalTable, ShowsIdenticalPromptsOnlyWithABaseline) {
  v1::EvalResult r;
  r.set_prompts(24);
  r.set_tokens_per_second(343.4);
  EXPECT_THAT(EvalTable(r), ::testing::Not(::testing::HasSubstr("identical")));
  r.set_baseline_tokens_per_second(159.6);
  r.set_baseline_identical_prompts(7);
  const std::string table = EvalTable(r);
  EXPECT_THAT(table, ::testing::HasSubstr("speed-up 2.15x\n"));
  EXPECT_THAT(table, ::testing::HasSubstr(
                         "identical  7 of 24 prompts decoded token for token alike by both\n"));
}

}  // namespace
}  // namespace dflash::ctl
