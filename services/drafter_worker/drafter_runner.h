// The drafter worker's step (architecture.md, step pipeline; method.md §3-4): builds the drafter
// (or resumes it from a checkpoint), and for every micro-batch of a step receives the packed batch
// and features under the expected batch id, adds the coordinator's anchors and trains; then the
// optimizer step, and the checkpoint and export the coordinator asked for. No protobuf and no
// LibTorch in this header.
#pragma once

#include <memory>

#include "services/worker_common/step_runner.h"

namespace dflash::worker {

std::unique_ptr<StepRunner> NewDrafterRunner();

}  // namespace dflash::worker
