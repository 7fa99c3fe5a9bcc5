// The target worker built without LibTorch: registers, refuses runs and decodes
// (services/worker_common/unavailable_runner.h).
#include "services/target_worker/target_runner.h"
#include "services/worker_common/unavailable_runner.h"

namespace dflash::worker {

std::unique_ptr<StepRunner> NewTargetRunner() { return NewUnavailableRunner(); }
std::unique_ptr<Evaluator> NewTargetEvaluator() { return NewUnavailableEvaluator(); }

}  // namespace dflash::worker
