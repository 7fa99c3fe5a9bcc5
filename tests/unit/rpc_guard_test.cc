// No exception leaves an RPC handler (common/rpc/guarded.h): each worker handler driven with a
// dependency that throws (the step runner's Prepare, RunStep and Abort, the evaluator) answers a
// status that names the operation and the cause instead of gRPC's "Unexpected error in RPC
// handling". The coordinator's handlers use the same Guarded; its own behaviour is tested here.
#include <gtest/gtest.h>

#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include "common/rpc/guarded.h"
#include "services/worker_common/worker_service.h"

namespace dflash::worker {
namespace {

TEST(Guarded, TurnsEveryEscapingExceptionIntoAStatusNamingTheOperation) {
  grpc::Status s = Guarded("Op", []() -> grpc::Status { throw std::runtime_error("boom"); });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(s.error_message(), "Op: boom");
  s = Guarded("Op", []() -> grpc::Status { throw std::bad_alloc(); });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(s.error_message().find("Op: out of host memory"), std::string::npos);
  s = Guarded("Op", []() -> grpc::Status { throw 7; });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_NE(s.error_message().find("not std::exception"), std::string::npos);
  // A LibTorch message: the backtrace after the message is left out.
  s = Guarded("Op", []() -> grpc::Status {
    throw std::runtime_error("CUDA error: out of memory\nException raised from c10 at x.cpp:1");
  });
  EXPECT_EQ(s.error_message(), "Op: CUDA error: out of memory");
  s = Guarded("Op", [] { return grpc::Status(grpc::StatusCode::NOT_FOUND, "kept"); });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
}

// A step runner whose every call throws once `throw_from` names it.
class ThrowingRunner : public StepRunner {
 public:
  explicit ThrowingRunner(std::string throw_from) : throw_from_(std::move(throw_from)) {}
  absl::StatusOr<Prepared> Prepare(const RunContext&) override {
    if (throw_from_ == "Prepare") throw std::runtime_error("prepare threw");
    return Prepared{};
  }
  absl::StatusOr<StepReport> RunStep(const StepWork&) override {
    throw std::runtime_error("step threw");
  }
  void Abort() override {
    if (throw_from_ == "Abort") throw std::logic_error("abort threw");
  }

 private:
  std::string throw_from_;
};

class ThrowingEvaluator : public Evaluator {
  absl::StatusOr<EvalReport> Evaluate(const EvalWork&) override {
    throw std::runtime_error("evaluate threw");
  }
  absl::StatusOr<GenerateReport> Generate(const GenerateWork&) override { throw std::bad_alloc(); }
  absl::StatusOr<std::string> OpenDecodeGroup(const std::string&, int) override {
    throw std::runtime_error("open threw");
  }
};

constexpr char kRunYaml[] =
    "name: guard\n"
    "target: {path: \"builtin:tiny-qwen3\", dtype: float32}\n"
    "drafter: {layers: 1, block_size: 8}\n"
    "data: {train: \"builtin:tiny-chat\", max_length: 256}\n"
    "optim: {max_steps: 2}\n"
    "eval: {prompts: \"builtin:tiny-chat\"}\n";

struct Worker {
  explicit Worker(const std::string& throw_from)
      : core(
            v1::WorkerInfo(), [throw_from] { return std::make_unique<ThrowingRunner>(throw_from); },
            nullptr),
        service(&core) {
    core.SetEvaluator(std::make_unique<ThrowingEvaluator>());
  }
  grpc::Status Prepare() {
    v1::PrepareRunRequest req;
    req.set_run_id("r-1");
    req.set_resolved_config_yaml(kRunYaml);
    req.set_channel("c");
    req.set_total_steps(2);
    v1::PrepareRunResponse resp;
    return service.PrepareRun(&ctx, &req, &resp);
  }
  WorkerCore core;
  TargetWorkerService service;
  grpc::ServerContext ctx;
};

TEST(WorkerHandlers, AnswerAStatusWhenTheirDependencyThrows) {
  {
    Worker w("Prepare");
    grpc::Status s = w.Prepare();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL);
    EXPECT_EQ(s.error_message(), "PrepareRun: prepare threw");
  }
  {
    Worker w("RunStep");
    ASSERT_TRUE(w.Prepare().ok());
    v1::RunStepRequest step;
    step.set_run_id("r-1");
    v1::RunStepResponse resp;
    grpc::Status s = w.service.RunStep(&w.ctx, &step, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL);
    EXPECT_EQ(s.error_message(), "RunStep: step threw");
    // The worker still answers afterwards.
    v1::WorkerStatusRequest status_req;
    v1::WorkerStatusResponse status;
    EXPECT_TRUE(w.service.GetStatus(&w.ctx, &status_req, &status).ok());
  }
  {
    Worker w("Abort");
    ASSERT_TRUE(w.Prepare().ok());
    v1::ReleaseRunRequest release;
    release.set_run_id("r-1");
    v1::ReleaseRunResponse released;
    grpc::Status s = w.service.ReleaseRun(&w.ctx, &release, &released);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL);
    EXPECT_EQ(s.error_message(), "ReleaseRun: abort threw");
    // The run was released all the same: a step of it is refused.
    v1::RunStepRequest step;
    step.set_run_id("r-1");
    v1::RunStepResponse resp;
    s = w.service.RunStep(&w.ctx, &step, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  }
  {
    Worker w("none");
    v1::EvaluateRequest eval;
    eval.set_resolved_config_yaml(kRunYaml);
    eval.set_drafter_dir("/nonexistent");
    eval.add_prompts()->add_ids(1);
    eval.set_max_new_tokens(4);
    v1::EvaluateResponse eval_resp;
    grpc::Status s = w.service.Evaluate(&w.ctx, &eval, &eval_resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL);
    EXPECT_EQ(s.error_message(), "Evaluate: evaluate threw");
    v1::GenerateRequest gen;
    gen.set_resolved_config_yaml(kRunYaml);
    gen.add_prompts()->add_ids(1);
    gen.add_max_new_tokens(4);
    v1::GenerateResponse gen_resp;
    s = w.service.Generate(&w.ctx, &gen, &gen_resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(s.error_message().find("Generate: out of host memory"), std::string::npos)
        << s.error_message();
    v1::OpenDecodeGroupRequest open;
    open.set_collective("nccl");
    v1::OpenDecodeGroupResponse open_resp;
    s = w.service.OpenDecodeGroup(&w.ctx, &open, &open_resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL);
    EXPECT_EQ(s.error_message(), "OpenDecodeGroup: open threw");
  }
}

}  // namespace
}  // namespace dflash::worker
