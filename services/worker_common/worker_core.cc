#include "services/worker_common/worker_core.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/device/device_probe.h"
#include "common/device/kernel_profile.h"
#include "common/rpc/channel.h"
#include "common/rpc/grpc_status.h"
#include "services/worker_common/kernel_overrides.h"

namespace dflash::worker {
namespace {

std::string RoleLabel(const v1::WorkerInfo& w) {
  return w.role() == v1::WORKER_ROLE_TARGET ? "target" : "drafter";
}

}  // namespace

WorkerCore::WorkerCore(v1::WorkerInfo self, StepRunnerFactory runners,
                       metrics::MetricsServer* metrics)
    : self_(std::move(self)), runners_(std::move(runners)), metrics_(metrics) {}

absl::StatusOr<v1::EvaluateResponse> WorkerCore::Evaluate(const v1::EvaluateRequest& req) {
  if (evaluator_ == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "worker ", self_.name(), " does not evaluate drafters (a target worker does)"));
  }
  if (req.drafter_dir().empty())
    return absl::InvalidArgumentError("drafter_dir: must not be empty");
  if (req.prompts_size() == 0) return absl::InvalidArgumentError("prompts: none given");
  if (req.max_new_tokens() < 1) {
    return absl::InvalidArgumentError("max_new_tokens: must be at least 1");
  }
  auto spec = config::ParseRunSpec(req.resolved_config_yaml(), "evaluation config",
                                   config::RunSpecOptions{"", /*check_paths=*/true});
  if (!spec.ok()) return spec.status();
  EvalWork work;
  work.spec = *std::move(spec);
  work.gpu = Gpu();
  ASSIGN_OR_RETURN(work.group, GroupOf(req.group()));
  work.drafter_dir = req.drafter_dir();
  for (const v1::TokenIds& p : req.prompts())
    work.prompts.emplace_back(p.ids().begin(), p.ids().end());
  work.max_new_tokens = req.max_new_tokens();
  work.stop_token_ids.assign(req.stop_token_ids().begin(), req.stop_token_ids().end());
  work.batch_size = req.batch_size();
  work.run_id = req.run_id();
  work.step = req.run_id().empty() ? -1 : req.step();
  work.measure_baseline = req.measure_baseline();
  ASSIGN_OR_RETURN(EvalReport r, evaluator_->Evaluate(work));
  v1::EvaluateResponse resp;
  resp.set_prompts(r.prompts);
  resp.set_new_tokens(r.new_tokens);
  resp.set_verifications(r.verifications);
  resp.set_accepted(r.accepted);
  for (int64_t a : r.accepted_at) resp.add_accepted_at(a);
  resp.set_emitted(r.emitted);
  for (int64_t e : r.emitted_histogram) resp.add_emitted_histogram(e);
  for (const EvalContextCounts& c : r.by_context) {
    v1::ContextBucketCounts* b = resp.add_by_context();
    b->set_min_tokens(c.min_tokens);
    b->set_max_tokens(c.max_tokens);
    b->set_verifications(c.verifications);
    b->set_accepted(c.accepted);
    b->set_emitted(c.emitted);
    for (int64_t a : c.accepted_at) b->add_accepted_at(a);
  }
  resp.set_prompts_verified(r.prompts_verified);
  resp.set_prompt_tau_sum(r.prompt_tau_sum);
  resp.set_block_size(r.block_size);
  resp.set_seconds(r.seconds);
  resp.set_load_seconds(r.load_seconds);
  resp.set_baseline_seconds(r.baseline_seconds);
  resp.set_baseline_tokens(r.baseline_tokens);
  resp.set_baseline_identical(r.baseline_identical);
  resp.set_temperature(r.temperature);
  resp.set_top_p(r.top_p);
  resp.set_top_k(r.top_k);
  resp.set_seed(r.seed);
  return resp;
}

absl::StatusOr<v1::GenerateResponse> WorkerCore::Generate(const v1::GenerateRequest& req) {
  if (evaluator_ == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("worker ", self_.name(), " does not generate (a target worker does)"));
  }
  if (req.prompts_size() == 0) return absl::InvalidArgumentError("prompts: none given");
  if (req.max_new_tokens_size() != 1 && req.max_new_tokens_size() != req.prompts_size()) {
    return absl::InvalidArgumentError(absl::StrCat("max_new_tokens: ", req.max_new_tokens_size(),
                                                   " values for ", req.prompts_size(),
                                                   " prompts (give one, or one per prompt)"));
  }
  config::RunSpecOptions opts;
  opts.check_paths = true;
  auto spec = config::ParseRunSpec(req.resolved_config_yaml(), "generation config", opts);
  if (!spec.ok()) return spec.status();
  GenerateWork work;
  work.spec = *std::move(spec);
  work.gpu = Gpu();
  ASSIGN_OR_RETURN(work.group, GroupOf(req.group()));
  for (int i = 0; i < req.prompts_size(); ++i) {
    work.prompts.emplace_back(req.prompts(i).ids().begin(), req.prompts(i).ids().end());
    work.max_new_tokens.push_back(req.max_new_tokens(req.max_new_tokens_size() == 1 ? 0 : i));
  }
  work.stop_token_ids.assign(req.stop_token_ids().begin(), req.stop_token_ids().end());
  work.temperature = req.temperature();
  work.top_p = req.top_p() > 0 ? req.top_p() : 1.0;
  work.top_k = req.top_k();
  work.repetition_penalty = req.repetition_penalty() > 0 ? req.repetition_penalty() : 1.0;
  work.seed = req.seed();
  if (req.max_batch() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch: ", req.max_batch(), " must be >= 0 (0: every prompt at once)"));
  }
  work.max_batch = req.max_batch();
  ASSIGN_OR_RETURN(GenerateReport r, evaluator_->Generate(work));
  v1::GenerateResponse resp;
  for (size_t i = 0; i < r.outputs.size(); ++i) {
    resp.add_outputs()->mutable_ids()->Add(r.outputs[i].begin(), r.outputs[i].end());
    resp.add_stopped(r.stopped[i]);
  }
  resp.set_seconds(r.seconds);
  return resp;
}

absl::StatusOr<v1::OpenDecodeGroupResponse> WorkerCore::OpenDecodeGroup(
    const v1::OpenDecodeGroupRequest& req) {
  if (evaluator_ == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("worker ", self_.name(), " does not decode (a target worker does)"));
  }
  ASSIGN_OR_RETURN(std::string id, evaluator_->OpenDecodeGroup(req.collective(), Gpu()));
  v1::OpenDecodeGroupResponse resp;
  resp.set_nccl_unique_id(id);
  return resp;
}

absl::StatusOr<DecodeGroupWork> WorkerCore::GroupOf(const v1::DecodeGroup& g) {
  DecodeGroupWork w;
  if (g.world() <= 1) return w;
  if (g.rank() < 0 || g.rank() >= g.world()) {
    return absl::InvalidArgumentError(
        absl::StrCat("group.rank: ", g.rank(), " is outside [0, ", g.world(), ")"));
  }
  w.rank = g.rank();
  w.world = g.world();
  w.collective = g.collective();
  w.name = g.name();
  w.nccl_unique_id = g.nccl_unique_id();
  return w;
}

int WorkerCore::Gpu() {
  std::lock_guard<std::mutex> lock(mu_);
  return self_.device().kind() == "cuda" ? self_.device().index() : -1;
}

absl::StatusOr<v1::PrepareRunResponse> WorkerCore::PrepareRun(const v1::PrepareRunRequest& req) {
  if (req.run_id().empty()) return absl::InvalidArgumentError("run_id: must not be empty");
  int gpu;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!run_id_.empty() && run_id_ != req.run_id()) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", self_.name(), " already holds run ", run_id_));
    }
    gpu = self_.device().kind() == "cuda" ? self_.device().index() : -1;
  }
  // The worker parses the resolved config itself: paths must exist where the worker runs.
  auto spec = config::ParseRunSpec(req.resolved_config_yaml(), absl::StrCat("run ", req.run_id()),
                                   config::RunSpecOptions{"", /*check_paths=*/true});
  if (!spec.ok()) return spec.status();
  RunContext ctx;
  ctx.run_id = req.run_id();
  ctx.spec = *std::move(spec);
  ctx.gpu = gpu;
  ctx.pair = req.pair();
  ctx.num_pairs = std::max<int64_t>(1, req.num_pairs());
  ctx.total_steps = req.total_steps();
  ctx.resume_checkpoint = req.resume_checkpoint();
  ctx.channel = req.channel();
  ctx.transport = req.transport().empty() ? "host" : req.transport();
  ctx.drafter_group = req.drafter_group();
  ctx.collective = req.collective();
  ctx.nccl_unique_id = req.nccl_unique_id();
  ctx.channel_descriptor = req.channel_descriptor();
  ctx.tp_rank = req.tp_rank();
  ctx.tp_world = std::max<int64_t>(1, req.tp_world());
  ctx.tp_group = req.tp_group();
  ctx.tp_collective = req.tp_collective();
  ctx.tp_nccl_unique_id = req.tp_nccl_unique_id();
  if (ctx.tp_rank < 0 || ctx.tp_rank >= ctx.tp_world) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp_rank: ", ctx.tp_rank, " is outside [0, ", ctx.tp_world, ")"));
  }
  if (ctx.channel.empty()) return absl::InvalidArgumentError("channel: must not be empty");
  if (ctx.total_steps < 1) return absl::InvalidArgumentError("total_steps: must be at least 1");
  if (!req.run_dir().empty()) {
    // The worker's lines about this run, in the run directory (a failure to open costs only it).
    std::string name, role;
    {
      std::lock_guard<std::mutex> lock(mu_);
      name = self_.name();
      role = RoleLabel(self_);
    }
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(req.run_dir()) / "logs", ec);
    const std::string path =
        (std::filesystem::path(req.run_dir()) / "logs" / absl::StrCat(role, "-", name, ".log"))
            .string();
    if (ec || !OpenRunLog(req.run_id(), path)) {
      LOG_RUN(WARNING, req.run_id(), -1) << "cannot write the run log " << path;
    }
  }
  std::shared_ptr<StepRunner> runner = runners_();
  absl::StatusOr<Prepared> prepared = runner->Prepare(ctx);
  if (!prepared.ok()) {
    LOG_RUN(WARNING, req.run_id(), -1) << "cannot prepare: " << prepared.status();
    CloseRunLog(req.run_id());
    return prepared.status();
  }
  v1::PrepareRunResponse resp;
  for (const auto& [k, v] : prepared->applied) (*resp.mutable_applied())[k] = v;
  resp.set_nccl_unique_id(prepared->nccl_unique_id);
  resp.set_channel_descriptor(prepared->channel_descriptor);
  resp.set_tp_nccl_unique_id(prepared->tp_nccl_unique_id);
  resp.set_kernel_overrides(KernelOverrides());
  resp.set_kernels(prepared->kernels);
  if (!resp.kernel_overrides().empty()) {
    LOG_RUN(WARNING, req.run_id(), -1)
        << "kernel overrides from the environment: " << resp.kernel_overrides();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (runner_) runner_->Abort();  // a previous attempt of the same run
  run_id_ = req.run_id();
  transport_ = ctx.transport;
  runner_ = std::move(runner);
  step_ = 0;
  LOG_RUN(INFO, run_id_, -1) << "prepared (peer " << req.peer_worker_id() << ", pair " << ctx.pair
                             << "), applying " << resp.applied_size() << " settings";
  return resp;
}

absl::Status WorkerCore::ReleaseRun(const std::string& run_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (run_id_ == run_id && !run_id.empty()) {
    LOG_RUN(INFO, run_id_, step_) << "released";
    CloseRunLog(run_id_);
    // The run is released before the runner is stopped: a runner whose Abort throws leaves no
    // run behind.
    std::shared_ptr<StepRunner> runner = std::move(runner_);
    run_id_.clear();
    if (runner) runner->Abort();
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RunStepResponse> WorkerCore::RunStep(const v1::RunStepRequest& req) {
  std::shared_ptr<StepRunner> runner;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (run_id_.empty() || run_id_ != req.run_id() || !runner_) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", self_.name(), " does not hold run ", req.run_id(),
                       run_id_.empty() ? std::string(" (it holds none)")
                                       : absl::StrCat(" (it holds ", run_id_, ")")));
    }
    runner = runner_;
  }
  StepWork work;
  work.step = req.step();
  work.epoch = req.epoch();
  for (const v1::MicroBatch& m : req.micro_batches()) {
    StepMicroBatch& mb = work.micro_batches.emplace_back();
    mb.batch_id = m.batch_id();
    for (const v1::Piece& p : m.pieces())
      mb.pieces.push_back({p.document(), p.begin(), p.length()});
    mb.anchors.assign(m.anchors().begin(), m.anchors().end());
  }
  work.checkpoint_path = req.checkpoint_path();
  work.checkpoint_metadata.insert(req.checkpoint_metadata().begin(),
                                  req.checkpoint_metadata().end());
  work.export_dir = req.export_dir();
  std::lock_guard<std::mutex> step_lock(step_mu_);
  int gpu;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gpu = self_.device().index();
    process_peak_ = std::max(process_peak_, device::TorchAllocatorStats(gpu).peak_allocated_bytes);
  }
  device::ResetTorchPeak(gpu);  // the step's own peak, for dflash_worker_gpu_memory_step_peak_bytes
  absl::StatusOr<StepReport> report = RunStepProfiled(*runner, work, gpu, req.run_id());
  const uint64_t step_peak = device::TorchAllocatorStats(gpu).peak_allocated_bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    process_peak_ = std::max(process_peak_, step_peak);
  }
  if (metrics_) {
    std::string name, role;
    {
      std::lock_guard<std::mutex> lock(mu_);
      name = self_.name();
      role = RoleLabel(self_);
    }
    metrics_->Gauge("dflash_worker_gpu_memory_step_peak_bytes")
        .Add({{"worker", name}, {"role", role}, {"gpu", gpu < 0 ? "cpu" : std::to_string(gpu)}})
        .Set(static_cast<double>(step_peak));
  }
  if (!report.ok()) {
    LOG_RUN(WARNING, req.run_id(), req.step()) << "step failed: " << report.status();
    return report.status();
  }
  UpdateStepMetrics(*report);
  v1::RunStepResponse resp;
  resp.set_checksum(report->checksum);
  v1::StepMetrics* m = resp.mutable_metrics();
  m->set_step(report->step);
  m->set_epoch(req.epoch());
  m->set_loss(report->loss);
  m->set_weight_sum(report->weight_sum);
  m->set_grad_norm(report->grad_norm);
  m->set_lr(report->lr);
  m->set_skipped(report->skipped);
  m->set_micro_batches(report->micro_batches);
  m->set_tokens(report->tokens);
  for (double a : report->slot_accuracy) m->add_slot_accuracy(a);
  m->set_acceptance_length(report->acceptance_length);
  m->set_skipped_steps(report->skipped_steps);
  m->set_oom_splits(report->oom_splits);
  return resp;
}

absl::StatusOr<StepReport> WorkerCore::RunStepProfiled(StepRunner& runner, const StepWork& work,
                                                       int gpu, const std::string& run_id) {
  if (!profile_steps_.Covers(work.step)) return runner.RunStep(work);
  std::optional<absl::StatusOr<StepReport>> report;
  absl::StatusOr<device::KernelProfile> profile = device::ProfileKernels([&] {
    report = runner.RunStep(work);
    device::SynchronizeTorchDevice(gpu);
  });
  if (!profile.ok()) {
    LOG_RUN(WARNING, run_id, work.step) << "step profile: " << profile.status();
    // The profiler could not start: the step runs unprofiled; a profiling failure fails no step.
    return report.has_value() ? *std::move(report) : runner.RunStep(work);
  }
  // One line of key=value pairs (scripts/bench/pipeline.sh reads them), then the longest kernels.
  std::string line =
      absl::StrFormat("step profile: wall_ms=%.2f busy_ms=%.2f kernel_ms=%.2f launches=%d",
                      profile->wall_ms, profile->busy_ms, profile->kernel_ms, profile->launches);
  for (const auto& [category, ms] : profile->category_ms) {
    std::string key = category;
    std::replace(key.begin(), key.end(), ' ', '_');
    std::replace(key.begin(), key.end(), '/', '_');
    absl::StrAppendFormat(&line, " %s_ms=%.2f", key, ms);
  }
  LOG_RUN(INFO, run_id, work.step) << line;
  std::string top = "step profile, longest kernels:";
  for (size_t i = 0; i < profile->kernels.size() && i < 5; ++i) {
    absl::StrAppendFormat(&top, " [%.2f ms x%d] %s;", profile->kernels[i].ms,
                          profile->kernels[i].count, profile->kernels[i].name.substr(0, 90));
  }
  LOG_RUN(INFO, run_id, work.step) << top;
  return *std::move(report);
}

void WorkerCore::UpdateStepMetrics(const StepReport& report) {
  std::string name, role, transport;
  {
    std::lock_guard<std::mutex> lock(mu_);
    step_ = report.step + 1;
    name = self_.name();
    role = RoleLabel(self_);
    transport = transport_;
  }
  if (!metrics_) return;
  const prometheus::Labels l = {{"worker", name}, {"role", role}};
  metrics_->Gauge("dflash_worker_step").Add(l).Set(static_cast<double>(report.step + 1));
  const prometheus::Labels t = {{"worker", name}, {"role", role}, {"transport", transport}};
  metrics_->Counter("dflash_worker_transport_bytes_total")
      .Add(t)
      .Increment(static_cast<double>(report.transport_bytes));
  metrics_->Counter("dflash_worker_transport_wait_seconds_total")
      .Add(t)
      .Increment(report.transport_wait_seconds);
  metrics_->Gauge("dflash_worker_feature_queue_depth")
      .Add(t)
      .Set(static_cast<double>(report.max_queue_depth));
  metrics_->Counter("dflash_worker_tokens_total")
      .Add(l)
      .Increment(static_cast<double>(report.tokens));
  metrics_->Counter("dflash_worker_micro_batches_total")
      .Add(l)
      .Increment(static_cast<double>(report.micro_batches));
  metrics_->Counter("dflash_worker_oom_splits_total")
      .Add(l)
      .Increment(static_cast<double>(report.oom_splits));
}

v1::WorkerStatusResponse WorkerCore::Status() {
  std::lock_guard<std::mutex> lock(mu_);
  v1::WorkerStatusResponse resp;
  *resp.mutable_worker() = self_;
  resp.set_run_id(run_id_);
  resp.set_step(step_);
  return resp;
}

void WorkerCore::ReconcileAssignment(const std::string& assigned_run_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!run_id_.empty() && run_id_ != assigned_run_id) {
    LOG_RUN(WARNING, run_id_, step_) << "coordinator no longer assigns this run to me "
                                     << "(assigned: '" << assigned_run_id << "'); dropping it";
    CloseRunLog(run_id_);
    if (runner_) runner_->Abort();
    runner_.reset();
    run_id_.clear();
  }
}

void WorkerCore::SetWorkerId(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  self_.set_worker_id(id);
}

void WorkerCore::SetControlAddress(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  self_.set_control_address(address);
}

v1::WorkerInfo WorkerCore::Info() {
  std::lock_guard<std::mutex> lock(mu_);
  return self_;
}

v1::DeviceInfo WorkerCore::ReadDevice() {
  v1::DeviceInfo d;
  int gpu;
  std::string name, role;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gpu = self_.device().index();
    d = self_.device();
    name = self_.name();
    role = RoleLabel(self_);
  }
  auto probe = device::Probe(gpu);
  if (probe.ok()) {
    d.set_total_bytes(probe->total_bytes);
    d.set_free_bytes(probe->free_bytes);
  }
  if (gpu >= 0) d.set_process_reserved_bytes(device::TorchAllocatorStats(gpu).reserved_bytes);
  if (metrics_) {
    const std::string gpu_label = gpu < 0 ? "cpu" : std::to_string(gpu);
    prometheus::Labels l = {{"worker", name}, {"role", role}, {"gpu", gpu_label}};
    metrics_->Gauge("dflash_worker_gpu_memory_total_bytes").Add(l).Set(d.total_bytes());
    metrics_->Gauge("dflash_worker_gpu_memory_used_bytes")
        .Add(l)
        .Set(d.total_bytes() - d.free_bytes());
    const auto alloc = device::TorchAllocatorStats(gpu);
    metrics_->Gauge("dflash_worker_gpu_memory_allocated_bytes").Add(l).Set(alloc.allocated_bytes);
    metrics_->Gauge("dflash_worker_gpu_memory_reserved_bytes").Add(l).Set(alloc.reserved_bytes);
    uint64_t process_peak;
    {
      std::lock_guard<std::mutex> lock(mu_);
      process_peak_ = std::max(process_peak_, alloc.peak_allocated_bytes);
      process_peak = process_peak_;
    }
    metrics_->Gauge("dflash_worker_gpu_memory_peak_bytes").Add(l).Set(process_peak);
    prometheus::Labels wl = {{"worker", name}, {"role", role}};
    metrics_->Gauge("dflash_worker_host_rss_bytes").Add(wl).Set(device::HostRssBytes());
    std::lock_guard<std::mutex> lock(mu_);
    metrics_->Gauge("dflash_worker_step").Add(wl).Set(static_cast<double>(step_));
  }
  return d;
}

CoordinatorLink::CoordinatorLink(const std::string& coordinator_address, WorkerCore* core,
                                 metrics::MetricsServer* metrics,
                                 std::shared_ptr<grpc::ChannelCredentials> creds)
    : address_(coordinator_address), core_(core), metrics_(metrics) {
  stub_ = v1::Registry::NewStub(MakeChannel(coordinator_address, std::move(creds)));
}

CoordinatorLink::~CoordinatorLink() { Stop(); }

void CoordinatorLink::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void CoordinatorLink::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool CoordinatorLink::WaitMs(int64_t ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return stopping_; });
}

bool CoordinatorLink::RegisterOnce() {
  v1::RegisterRequest req;
  *req.mutable_worker() = core_->Info();
  *req.mutable_worker()->mutable_device() = core_->ReadDevice();
  v1::RegisterResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Status s = stub_->Register(&ctx, req, &resp);
  if (!s.ok()) {
    LOG(WARNING) << "register with coordinator " << address_ << " failed: " << s.error_message();
    return false;
  }
  worker_id_ = resp.worker_id();
  interval_ms_ = std::max<int64_t>(10, resp.heartbeat_interval_ms());
  core_->SetWorkerId(worker_id_);
  LOG(INFO) << "registered with coordinator " << address_ << " as " << worker_id_
            << " (heartbeat every " << interval_ms_ << " ms)";
  return true;
}

void CoordinatorLink::Loop() {
  const std::string name = core_->Info().name();
  const std::string role = RoleLabel(core_->Info());
  auto& registered =
      metrics_->Gauge("dflash_worker_registered").Add({{"worker", name}, {"role", role}});
  auto& beats =
      metrics_->Counter("dflash_worker_heartbeats_total").Add({{"worker", name}, {"role", role}});
  auto& failures = metrics_->Counter("dflash_worker_heartbeat_failures_total")
                       .Add({{"worker", name}, {"role", role}});
  int64_t backoff_ms = 100;
  while (true) {
    if (worker_id_.empty()) {
      registered.Set(0);
      if (!RegisterOnce()) {
        if (!WaitMs(backoff_ms)) return;
        backoff_ms = std::min<int64_t>(backoff_ms * 2, 5000);
        continue;
      }
      backoff_ms = 100;
      registered.Set(1);
    }
    if (!WaitMs(interval_ms_)) return;
    v1::HeartbeatRequest req;
    req.set_worker_id(worker_id_);
    *req.mutable_device() = core_->ReadDevice();
    req.set_run_id(core_->Status().run_id());
    v1::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(interval_ms_ * 2));
    grpc::Status s = stub_->Heartbeat(&ctx, req, &resp);
    if (s.ok()) {
      beats.Increment();
      core_->ReconcileAssignment(resp.assigned_run_id());
    } else {
      failures.Increment();
      if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
        LOG(WARNING) << "coordinator does not know " << worker_id_
                     << " (restarted?); registering again";
        worker_id_.clear();
      } else {
        LOG(WARNING) << "heartbeat failed: " << s.error_message();
      }
    }
  }
}

}  // namespace dflash::worker
