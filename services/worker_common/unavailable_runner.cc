// Workers built without LibTorch (-DDFLASH_WITH_TORCH=OFF) register and answer control RPCs but
// cannot train: every run they are asked to prepare is refused, saying why.
#include "services/drafter_worker/drafter_runner.h"
#include "services/target_worker/target_runner.h"
#include "services/worker_common/evaluator.h"

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

std::unique_ptr<StepRunner> NewTargetRunner() { return std::make_unique<UnavailableRunner>(); }
std::unique_ptr<StepRunner> NewDrafterRunner() { return std::make_unique<UnavailableRunner>(); }
std::unique_ptr<Evaluator> NewTargetEvaluator() { return std::make_unique<UnavailableEvaluator>(); }

}  // namespace dflash::worker
