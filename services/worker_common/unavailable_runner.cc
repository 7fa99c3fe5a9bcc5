#include "services/worker_common/unavailable_runner.h"

namespace dflash::worker {
namespace {

class UnavailableRunner : public StepRunner {
 public:
  absl::StatusOr<Prepared> Prepare(const RunContext&) override {
    return absl::UnimplementedError("this worker was built without LibTorch and cannot train");
  }
  absl::StatusOr<StepReport> RunStep(const StepWork&) override {
    return absl::UnimplementedError("this worker was built without LibTorch and cannot train");
  }
  void Abort() override {}
};

class UnavailableEvaluator : public Evaluator {
 public:
  absl::StatusOr<EvalReport> Evaluate(const EvalWork&) override {
    return absl::UnimplementedError("this worker was built without LibTorch and cannot decode");
  }
  absl::StatusOr<GenerateReport> Generate(const GenerateWork&) override {
    return absl::UnimplementedError("this worker was built without LibTorch and cannot decode");
  }
};

}  // namespace

std::unique_ptr<StepRunner> NewUnavailableRunner() { return std::make_unique<UnavailableRunner>(); }
std::unique_ptr<Evaluator> NewUnavailableEvaluator() {
  return std::make_unique<UnavailableEvaluator>();
}

}  // namespace dflash::worker
