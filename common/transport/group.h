// Joining a collective group of worker processes: the data-parallel drafters of a run (gradient
// sums) and the ranks of a tensor-parallel target (partial layer outputs). `host` groups share
// memory on one machine (host_communicator.h); `nccl` groups hold one GPU per rank
// (nccl_communicator.h) and bootstrap through the coordinator: rank 0 makes the unique id, which
// the coordinator hands to the other ranks.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/transport/communicator.h"

namespace dflash::transport {

struct GroupOptions {
  int rank = 0, world = 1;
  std::string collective;      // host | nccl
  std::string name;            // host: the shared-memory name (per attempt: rank 0 replaces it)
  std::string nccl_unique_id;  // nccl: rank 0's (rank 0 makes one when empty)
  int gpu = -1;                // nccl: this rank's device
  absl::Duration timeout = absl::Minutes(10);  // every wait
  absl::Duration open_timeout = absl::Minutes(2);
  // Error prefixes: the request fields that carry the collective and the name.
  std::string collective_field = "collective", name_field = "group";
};

// The communicator of this rank. nccl rank 0: `made_unique_id` receives the id it made (the other
// ranks join at the first collective call), unless options.nccl_unique_id holds one that this
// process made earlier (NewNcclUniqueId: its bootstrap root lives here), which it joins with.
// INVALID_ARGUMENT / FAILED_PRECONDITION naming the field for a bad collective, an empty name or
// nccl without a GPU.
absl::StatusOr<std::unique_ptr<Communicator>> JoinGroup(const GroupOptions& options,
                                                        std::string* made_unique_id);

}  // namespace dflash::transport
