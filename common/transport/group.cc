#include "common/transport/group.h"

#include "absl/strings/str_cat.h"
#include "common/transport/host_communicator.h"
#include "common/transport/nccl_communicator.h"
#include "common/transport/shm_segment.h"
#include "common/transport/transport.h"

namespace dflash::transport {

absl::StatusOr<std::unique_ptr<Communicator>> JoinGroup(const GroupOptions& options,
                                                        std::string* made_unique_id) {
  absl::StatusOr<Collective> collective =
      ParseCollective(options.collective, options.collective_field);
  if (!collective.ok()) return collective.status();
  if (*collective == Collective::kNccl) {
    if (options.gpu < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(options.collective_field, " nccl: this worker has no GPU"));
    }
    std::string id = options.nccl_unique_id;
    if (options.rank == 0 && id.empty()) {
      absl::StatusOr<std::string> made = NewNcclUniqueId();
      if (!made.ok()) return made.status();
      id = *made;
      *made_unique_id = id;
    }
    NcclCommunicator::Options o;
    o.rank = options.rank;
    o.world = options.world;
    o.device = options.gpu;
    o.timeout = options.timeout;
    return NcclCommunicator::Create(id, o);
  }
  if (options.name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.name_field, ": must not be empty for a group of ", options.world));
  }
  HostCommunicator::Options o;
  o.rank = options.rank;
  o.world = options.world;
  o.timeout = options.timeout;
  o.open_timeout = options.open_timeout;
  // A group of this name left by a crashed attempt is stale: names are per attempt.
  if (options.rank == 0) ShmSegment::Unlink(options.name);
  return HostCommunicator::Create(options.name, o);
}

}  // namespace dflash::transport
