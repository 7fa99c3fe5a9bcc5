// The main() of a worker process, shared by both roles: flags/config, registration, control
// service, /metrics, clean shutdown on SIGTERM.
#pragma once

#include "dflash/v1/common.pb.h"
#include "services/worker_common/worker_core.h"

namespace dflash::worker {

// `evaluators` (target workers) makes the evaluator behind the Evaluate RPC; null: UNIMPLEMENTED.
int RunWorkerMain(int argc, char** argv, v1::WorkerRole role, StepRunnerFactory runners,
                  EvaluatorFactory evaluators = nullptr);

}  // namespace dflash::worker
