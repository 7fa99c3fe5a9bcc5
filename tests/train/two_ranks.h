// Two data-parallel ranks in one test process: rank 0 on the calling thread, rank 1 on its own,
// joined through a two-rank HostCommunicator (shared memory) named `name`.
#pragma once

#include <array>
#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/transport/host_communicator.h"

namespace dflash::train {

// Each rank's status: the communicator's creation error, or what `rank_main` returned.
inline std::array<absl::Status, 2> RunTwoRanks(
    const std::string& name,
    const std::function<absl::Status(int rank, transport::Communicator* comm)>& rank_main) {
  std::array<absl::Status, 2> status;
  auto run = [&](int rank) {
    transport::HostCommunicator::Options o;
    o.rank = rank;
    o.world = 2;
    o.timeout = absl::Seconds(60);
    auto comm = transport::HostCommunicator::Create(name, o);
    status[rank] = comm.ok() ? rank_main(rank, comm->get()) : comm.status();
  };
  std::thread r1(run, 1);
  run(0);
  r1.join();
  return status;
}

}  // namespace dflash::train
