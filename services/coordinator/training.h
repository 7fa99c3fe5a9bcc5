// What a started run's step loop holds (Training) and one planned step with its RPCs in flight
// (PlannedStep), shared by run_start.cc (set-up), run_driver.cc (the step loop) and step_commit.cc
// (the commit). Internal to the coordinator.
#pragma once

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "common/batching/batcher.h"
#include "common/batching/packed_batch.h"
#include "common/config/run_spec.h"
#include "common/data/run_data.h"
#include "dflash/v1/worker.pb.h"
#include "services/coordinator/placement.h"

namespace dflash::coordinator {

// The checkpoint metadata key of the data cursor after its step (as LocalRun writes it,
// common/train/local_run.cc).
inline constexpr char kCursorKey[] = "data.cursor";

// A worker that did not answer (gone, or too slow): not the run's fault.
inline bool Unreachable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded;
}

// An out-of-memory that a retry from the checkpoint may get past: every one but a single
// document that did not fit (the trainer's and the target's "not recoverable: ... one document
// of N tokens", which only a smaller data.max_length or token_budget fixes).
inline bool RetryableOutOfMemory(const absl::Status& s) {
  return s.code() == absl::StatusCode::kResourceExhausted &&
         !absl::StrContains(s.message(), "one document of");
}

struct PlannedStep;

struct Training {
  Placement p;
  config::RunSpec spec;
  data::RunData data;
  batching::BatchingOptions batching;
  std::unique_ptr<batching::Batcher> batcher;
  int64_t total_steps = 0;
  int64_t step = 0;  // the next step to train
  std::string run_dir, checkpoint_dir, export_dir, resume_from;
  batching::PackedBatch scratch;
  std::unique_ptr<PlannedStep> ahead;  // the next step, its targets already dispatched
  absl::Status ahead_error;            // planning the next step failed
  std::chrono::steady_clock::time_point last_commit = std::chrono::steady_clock::now();
  // eval.every_steps > 0: the prompts, tokenized once when the run starts (drafter_dir unset).
  std::optional<v1::EvaluateRequest> eval_request;
  v1::ResolvedTarget resolved;  // target.layer_ids and drafter.mask_token_id, `auto` resolved
  // eval.every_steps: the evaluation running beside the steps (at most one at a time), and the
  // tau of one that ended, committed with the next step.
  std::optional<std::future<absl::StatusOr<v1::EvalResult>>> running_eval;
  std::optional<double> eval_tau;
};

// One planned step and its RPCs in flight. Destroying it waits for the calls (std::async).
struct PlannedStep {
  int64_t step = 0, epoch = 0, tokens = 0;
  std::string cursor;    // the data cursor after this step
  std::string eval_dir;  // the drafter snapshot evaluated after this step ("" = none)
  std::vector<v1::RunStepRequest> targets, drafters;
  std::vector<std::future<absl::StatusOr<v1::RunStepResponse>>> target_calls, drafter_calls;
  // Tensor-parallel ranks 1..n-1 of each pair's target: the pair's target request, the same step.
  std::vector<std::future<absl::StatusOr<v1::RunStepResponse>>> tp_calls;
  std::vector<size_t> tp_pair;  // the pair of each tp call
};

}  // namespace dflash::coordinator
