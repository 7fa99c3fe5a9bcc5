// Acceptance-length evaluation by speculative decoding: what the coordinator sends a
// target worker and how it reads the answer, shared by `dflashctl eval` (EvaluateDrafter) and the
// evaluations during training (eval.every_steps, run_driver.cc).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/config/run_spec.h"
#include "dflash/v1/common.pb.h"
#include "dflash/v1/worker.pb.h"

namespace dflash::coordinator {

// The request for `spec`'s eval.prompts (at most eval.max_prompts, tokenized by the run's data
// settings) and eval.max_new_tokens, decoding with `spec`'s target and the drafter at
// `drafter_dir`.
absl::StatusOr<v1::EvaluateRequest> MakeEvaluateRequest(const config::RunSpec& spec,
                                                        const std::string& drafter_dir);

// A worker's failure as the coordinator reports it to dflashctl: a worker that cannot be reached
// (UNAVAILABLE, DEADLINE_EXCEEDED) becomes ABORTED naming it, so that the client does not take it
// for the coordinator being unreachable.
absl::Status WorkerFailure(const absl::Status& s, const std::string& worker);

// tau, acceptance by position and throughput of a worker's answer.
v1::EvalResult ToEvalResult(const v1::EvaluateResponse& resp, const std::string& worker,
                            const std::string& drafter_dir, int64_t step, int64_t unix_ms);

}  // namespace dflash::coordinator
