// The target worker's step (architecture.md, step pipeline): loads the run's target and data,
// creates the pair's feature channel, and for every micro-batch of a step packs the pieces the
// coordinator named, runs the target and sends the packed batch with its features to the drafter
// under the coordinator's batch id. No protobuf and no LibTorch in this header.
#pragma once

#include <memory>

#include "services/worker_common/step_runner.h"

namespace dflash::worker {

std::unique_ptr<StepRunner> NewTargetRunner();

}  // namespace dflash::worker
