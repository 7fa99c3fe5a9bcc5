#include "services/coordinator/decode_group.h"

#include <unistd.h>

#include <atomic>

#include "common/transport/transport.h"
#include "services/coordinator/evaluation.h"
#include "services/coordinator/placement.h"

namespace dflash::coordinator {

std::string DecodeGroupName(const std::string& what) {
  static std::atomic<int64_t> next{0};
  return absl::StrCat("dflash-", what, "-", getpid(), "-", next++);
}

std::vector<DecodeGroupWorkers> DecodeGroups(const std::vector<v1::WorkerInfo>& idle, int64_t n) {
  return GroupTargets(idle, n);
}

absl::StatusOr<std::vector<v1::DecodeGroup>> OpenDecodeGroup(const DecodeGroupWorkers& group,
                                                             const std::string& name,
                                                             WorkerControl* control) {
  std::vector<v1::DecodeGroup> fields(group.size());
  if (group.size() <= 1) {
    if (!fields.empty()) fields[0].set_world(1);
    return fields;
  }
  const transport::Collective collective = TargetCollective(group[0]);
  std::string id;
  if (collective == transport::Collective::kNccl) {
    v1::OpenDecodeGroupRequest req;
    req.set_collective(transport::CollectiveName(collective));
    absl::StatusOr<v1::OpenDecodeGroupResponse> resp = control->OpenDecodeGroup(group[0], req);
    if (!resp.ok()) {
      return absl::Status(resp.status().code(),
                          absl::StrCat("opening the decoding group on ", group[0].name(), ": ",
                                       resp.status().message()));
    }
    id = resp->nccl_unique_id();
  }
  for (size_t r = 0; r < group.size(); ++r) {
    fields[r].set_rank(static_cast<int32_t>(r));
    fields[r].set_world(static_cast<int32_t>(group.size()));
    fields[r].set_collective(transport::CollectiveName(collective));
    fields[r].set_name(name);
    fields[r].set_nccl_unique_id(id);
  }
  return fields;
}

std::string GroupNames(const DecodeGroupWorkers& group) {
  std::string names;
  for (const v1::WorkerInfo& w : group) names += (names.empty() ? "" : "|") + w.name();
  return names;
}

absl::StatusOr<v1::EvaluateResponse> EvaluateOnGroup(const DecodeGroupWorkers& group,
                                                     const v1::EvaluateRequest& req,
                                                     WorkerControl* control) {
  absl::StatusOr<std::vector<v1::DecodeGroup>> fields =
      OpenDecodeGroup(group, DecodeGroupName("eval"), control);
  if (!fields.ok()) return fields.status();
  return OnEveryRank<v1::EvaluateResponse>(
      group, *fields,
      [&](const v1::WorkerInfo& rank,
          const v1::DecodeGroup& field) -> absl::StatusOr<v1::EvaluateResponse> {
        v1::EvaluateRequest call = req;
        if (field.world() > 1) *call.mutable_group() = field;
        absl::StatusOr<v1::EvaluateResponse> r = control->Evaluate(rank, call);
        if (!r.ok()) return WorkerFailure(r.status(), rank.name());
        return r;
      });
}

absl::StatusOr<v1::GenerateResponse> GenerateOnGroup(const DecodeGroupWorkers& group,
                                                     const v1::GenerateRequest& req,
                                                     WorkerControl* control) {
  absl::StatusOr<std::vector<v1::DecodeGroup>> fields =
      OpenDecodeGroup(group, DecodeGroupName("regen"), control);
  if (!fields.ok()) return fields.status();
  return OnEveryRank<v1::GenerateResponse>(
      group, *fields,
      [&](const v1::WorkerInfo& rank,
          const v1::DecodeGroup& field) -> absl::StatusOr<v1::GenerateResponse> {
        v1::GenerateRequest call = req;
        if (field.world() > 1) *call.mutable_group() = field;
        absl::StatusOr<v1::GenerateResponse> r = control->Generate(rank, call);
        if (!r.ok()) return WorkerFailure(r.status(), rank.name());
        return r;
      });
}

absl::Status GroupFailure(const std::vector<absl::Status>& failures) {
  for (const absl::Status& s : failures) {
    if (s.code() != absl::StatusCode::kAborted) return s;
  }
  return failures.front();
}

}  // namespace dflash::coordinator
