// What a worker built without LibTorch (-DDFLASH_WITH_TORCH=OFF) runs: it registers and answers
// control RPCs, but refuses every run it is asked to prepare and every decode, saying why. Each
// worker folder's no-LibTorch runner file returns these.
#pragma once

#include <memory>

#include "services/worker_common/evaluator.h"
#include "services/worker_common/step_runner.h"

namespace dflash::worker {

std::unique_ptr<StepRunner> NewUnavailableRunner();
std::unique_ptr<Evaluator> NewUnavailableEvaluator();

}  // namespace dflash::worker
