// Decoding with a tensor-parallel target (placement.target_parallel = n > 1): `dflashctl eval`,
// `regen` and evaluations during training run on a group of n target workers, each rank decoding
// the same request with its shard of the target in step with the others (they sum partial layer
// outputs over the group); rank 0's answer is the result (docs/models.md, "Generating with a
// tensor-parallel target"). With n = 1 a group is one worker and the calls are the plain ones.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "dflash/v1/common.pb.h"
#include "dflash/v1/worker.pb.h"
#include "services/coordinator/worker_control.h"

namespace dflash::coordinator {

using DecodeGroupWorkers = std::vector<v1::WorkerInfo>;  // in rank order

// A fresh name for one call's group (the shared-memory segment of a host group): `what` (eval,
// regen), this process and a counter.
std::string DecodeGroupName(const std::string& what);

// Groups of `n` among `idle` target workers, as a run's tensor-parallel groups are formed
// (placement.h GroupTargets: one machine, one kind, distinct GPUs); those that complete no group
// are left out.
std::vector<DecodeGroupWorkers> DecodeGroups(const std::vector<v1::WorkerInfo>& idle, int64_t n);

// Every rank's DecodeGroup field for one call on `group`: rank, world, the group's collective
// (host for CPU targets, nccl for GPU ones), `name` (host: the shared-memory name, fresh per call)
// and, on nccl, the unique id that rank 0 makes (OpenDecodeGroup). One worker: a field of world 1.
absl::StatusOr<std::vector<v1::DecodeGroup>> OpenDecodeGroup(const DecodeGroupWorkers& group,
                                                             const std::string& name,
                                                             WorkerControl* control);

// Which failure of a group's call to report: the first that is not a rank giving up because
// another one did (ABORTED), else the first.
absl::Status GroupFailure(const std::vector<absl::Status>& failures);

// Runs `call(worker, field)` on every rank of `group` at once and returns rank 0's answer, or the
// failure GroupFailure picks, naming its worker.
template <typename Response>
absl::StatusOr<Response> OnEveryRank(
    const DecodeGroupWorkers& group, const std::vector<v1::DecodeGroup>& fields,
    const std::function<absl::StatusOr<Response>(const v1::WorkerInfo&, const v1::DecodeGroup&)>&
        call) {
  if (group.size() == 1) return call(group[0], fields[0]);
  std::vector<std::future<absl::StatusOr<Response>>> calls;
  for (size_t r = 0; r < group.size(); ++r) {
    calls.push_back(std::async(std::launch::async, call, group[r], fields[r]));
  }
  std::vector<absl::StatusOr<Response>> answers;
  for (auto& c : calls) answers.push_back(c.get());
  std::vector<absl::Status> failures;
  for (size_t r = 0; r < answers.size(); ++r) {
    if (answers[r].ok()) continue;
    failures.push_back(
        absl::Status(answers[r].status().code(),
                     absl::StrCat("rank ", r, " of ", group.size(), " (", group[r].name(),
                                  "): ", answers[r].status().message())));
  }
  if (!failures.empty()) return GroupFailure(failures);
  return std::move(answers[0]);
}

// The group's worker names, "t0|t1" (one worker: its name): what eval results name as worker.
std::string GroupNames(const DecodeGroupWorkers& group);

// `req` decoded by every rank of `group` (a fresh group named for `what`: eval, regen), each
// rank's failure named as evaluation.h's WorkerFailure names a worker's; rank 0's answer.
absl::StatusOr<v1::EvaluateResponse> EvaluateOnGroup(const DecodeGroupWorkers& group,
                                                     const v1::EvaluateRequest& req,
                                                     WorkerControl* control);
absl::StatusOr<v1::GenerateResponse> GenerateOnGroup(const DecodeGroupWorkers& group,
                                                     const v1::GenerateRequest& req,
                                                     WorkerControl* control);

}  // namespace dflash::coordinator
