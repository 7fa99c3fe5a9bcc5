#include "services/coordinator/decode_group.h"

#include <unistd.h>

#include <atomic>

#include "common/transport/transport.h"
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

absl::Status GroupFailure(const std::vector<absl::Status>& failures) {
  for (const absl::Status& s : failures) {
    if (s.code() != absl::StatusCode::kAborted) return s;
  }
  return failures.front();
}

}  // namespace dflash::coordinator
