#include "services/coordinator/coordinator.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/base/logging.h"
#include "common/base/status.h"
#include "common/batching/cursor.h"
#include "common/config/run_spec.h"
#include "common/data/run_data.h"
#include "common/plan/largest_budget.h"
#include "common/plan/memory_plan.h"
#include "common/rpc/run_state.h"
#include "common/run/resolve.h"
#include "services/coordinator/decode_group.h"
#include "services/coordinator/evaluation.h"
#include "services/coordinator/placement.h"
#include "services/coordinator/regen.h"
#include "services/coordinator/settings_echo.h"

namespace dflash::coordinator {
namespace {

std::string NewRunId(const std::string& name) {
  static std::mt19937_64 rng{std::random_device{}()};
  static std::mutex rng_mu;
  std::lock_guard<std::mutex> lock(rng_mu);
  char suffix[16];
  std::snprintf(suffix, sizeof(suffix), "%06llx",
                static_cast<unsigned long long>(rng() & 0xffffff));
  return absl::StrCat(name, "-", suffix);
}

// Four hex digits that tell this coordinator process apart from earlier ones.
std::string NewIncarnation() {
  std::mt19937 rng{std::random_device{}()};
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04x", static_cast<unsigned>(rng() & 0xffff));
  return buf;
}

std::string RoleName(v1::WorkerRole role) {
  return role == v1::WORKER_ROLE_TARGET    ? "target"
         : role == v1::WORKER_ROLE_DRAFTER ? "drafter"
                                           : "unknown";
}

}  // namespace

Coordinator::Coordinator(const CoordinatorOptions& options, std::unique_ptr<RunStore> store,
                         const Clock* clock, WorkerControl* workers,
                         metrics::MetricsServer* metrics)
    : options_(options),
      clock_(clock),
      workers_(workers),
      metrics_(metrics),
      store_(std::move(store)),
      registry_(clock, options.worker_timeout_ms, NewIncarnation()) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(const CoordinatorOptions& options,
                                                                 std::unique_ptr<RunStore> store,
                                                                 const Clock* clock,
                                                                 WorkerControl* workers,
                                                                 metrics::MetricsServer* metrics) {
  std::unique_ptr<Coordinator> c(
      new Coordinator(options, std::move(store), clock, workers, metrics));
  RETURN_IF_ERROR(c->Recover());
  return c;
}

absl::Status Coordinator::Recover() {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(auto runs, store_->ListRuns());
  int recovered = 0;
  for (const auto& run : runs) {
    if (run.state() == v1::RUN_STATE_STARTING || run.state() == v1::RUN_STATE_RUNNING) {
      RETURN_IF_ERROR(TransitionLocked(
          run.run_id(), run.state(), v1::RUN_STATE_PAUSED,
          absl::StrCat("coordinator restarted while the run was ", StateName(run.state()))));
    }
    if (!IsTerminal(run.state())) ++recovered;
  }
  LOG(INFO) << "run store holds " << runs.size() << " run(s), " << recovered << " not finished";
  UpdateGaugesLocked();
  return absl::OkStatus();
}

absl::Status Coordinator::TransitionLocked(const std::string& run_id, v1::RunState from,
                                           v1::RunState to, const std::string& message,
                                           const std::vector<std::string>* worker_ids) {
  ASSIGN_OR_RETURN(v1::RunEvent event,
                   store_->Transition(run_id, from, to, message, clock_->NowUnixMs(), worker_ids));
  LOG_RUN(INFO, run_id, event.step())
      << StateName(from) << " -> " << StateName(to) << (message.empty() ? "" : ": ") << message;
  if (metrics_) {
    metrics_->Counter("dflash_coordinator_run_transitions_total")
        .Add({{"state", StateName(to)}})
        .Increment();
  }
  if (IsTerminal(to) || to == v1::RUN_STATE_PAUSED) registry_.ReleaseRun(run_id);
  events_cv_.SignalAll();
  return absl::OkStatus();
}

namespace {

v1::DataSummary ToProto(const data::RunDataSummary& s) {
  v1::DataSummary d;
  d.set_prepared_path(s.prepared_path);
  d.set_tokenizer_fingerprint(s.tokenizer_fingerprint);
  d.set_documents(s.documents);
  d.set_tokens(s.tokens);
  d.set_supervised_tokens(s.supervised_tokens);
  d.set_records_read(s.records_read);
  d.set_records_skipped(s.records_skipped);
  for (const auto& [reason, n] : s.skipped_by_reason) (*d.mutable_skipped_by_reason())[reason] = n;
  d.set_documents_over_max_length(s.documents_over_max_length);
  d.set_micro_batches_per_epoch(s.micro_batches_per_epoch);
  d.set_fill_ratio(s.fill_ratio);
  d.set_steps_per_epoch(s.steps_per_epoch);
  d.set_pairs(s.pairs);
  return d;
}

}  // namespace

namespace {

// What the workers would refuse only when the run starts, refused at submit, naming the field:
// the target's config, its feature layers, the drafter's mask token, and what the target's shapes
// cannot take (run::CheckRunTargetShapes: a tensor-parallel width, DFlash2's settings). Returns the
// resolved target settings; *target gets the target's config.
absl::StatusOr<v1::ResolvedTarget> CheckRunTarget(const config::RunSpec& spec,
                                                  model::TransformerConfig* target) {
  absl::StatusOr<model::TransformerConfig> config = run::RunTargetConfig(spec);
  if (config.status().code() == absl::StatusCode::kNotFound) {  // no config.json: a config error
    return absl::InvalidArgumentError(config.status().message());
  }
  if (!config.ok()) return config.status();
  *target = *config;
  ASSIGN_OR_RETURN(v1::ResolvedTarget resolved, ResolveTargetSettings(spec, *target));
  RETURN_IF_ERROR(run::CheckRunTargetShapes(spec, *target));
  return resolved;
}

// Training reads prepared (or built-in) data only; refuse now what could not be trained on later.
// The structure, tokenizer and settings are checked here; the full checksum pass (seconds on a
// large set) is left to the start of training so that SubmitRun answers within its deadline.
// Sets the run's data summary and total steps.
absl::Status CheckRunData(const config::RunSpec& spec, const model::TransformerConfig& target,
                          v1::RunStatus* run) {
  ASSIGN_OR_RETURN(data::RunData data, data::OpenRunData(spec, /*verify=*/false));
  RETURN_IF_ERROR(data::CheckDataVocabulary(spec, data, target.vocab_size));
  *run->mutable_data() = ToProto(data.summary);
  run->set_total_steps(data.summary.total_steps);
  return absl::OkStatus();
}

// drafter.precision: fp8 against the registered drafters' devices: refused when every registered
// drafter is on a CPU or a GPU below compute capability 8.9 (none registered: not checked here; the
// drafter refuses it when the run is prepared).
absl::Status CheckPrecisionOnDrafters(const config::RunSpec& spec,
                                      const std::vector<v1::WorkerInfo>& workers) {
  if (spec.drafter.precision != "fp8") return absl::OkStatus();
  std::vector<std::string> seen;
  for (const v1::WorkerInfo& w : workers) {
    if (w.role() != v1::WORKER_ROLE_DRAFTER) continue;
    if (w.device().kind() == "cuda" && w.device().compute_capability() >= 89) {
      return absl::OkStatus();
    }
    seen.push_back(w.device().kind() == "cuda"
                       ? absl::StrCat(w.name(), " (", w.device().name(), ", compute capability ",
                                      w.device().compute_capability() / 10, ".",
                                      w.device().compute_capability() % 10, ")")
                       : absl::StrCat(w.name(), " (cpu)"));
  }
  if (seen.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("drafter.precision: fp8 needs a drafter on a GPU of compute capability 8.9 or "
                   "later; the registered drafters are ",
                   absl::StrJoin(seen, ", ")));
}

absl::Status Prefixed(const absl::Status& s, const std::string& source) {
  return s.ok() ? s : absl::Status(s.code(), absl::StrCat(source, ": ", s.message()));
}

}  // namespace

absl::Status Coordinator::CheckFitsRegisteredGpus(const config::RunSpec& spec,
                                                  const model::TransformerConfig& target) {
  // The memory plan against the largest registered GPU of each role (none: not checked here;
  // every placement is checked against its own GPUs).
  const PlanTargets pt = PlanTargetsOf(spec, ListWorkers());
  if (transport::BuffersOf(pt.transport).pair_shares_gpu) {
    RETURN_IF_ERROR(plan::CheckSharedGpuFits(spec, target, pt.shared_gpu, pt.shared_capacity));
  }
  for (const auto& [role, worker, capacity] :
       {std::make_tuple("target", pt.target_worker, pt.target_capacity),
        std::make_tuple("drafter", pt.drafter_worker, pt.drafter_capacity)}) {
    RETURN_IF_ERROR(plan::CheckFits(spec, target, pt.transport, role,
                                    absl::StrCat(worker, " (the largest registered GPU)"),
                                    capacity));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RunStatus> Coordinator::SubmitRun(const std::string& run_yaml,
                                                     const std::string& source_name, bool dry_run) {
  const std::string source = source_name.empty() ? "run.yaml" : source_name;
  config::RunSpecOptions opts;
  opts.check_paths = true;
  opts.data_roots = options_.data_roots;
  ASSIGN_OR_RETURN(config::RunSpec spec, config::ParseRunSpec(run_yaml, source, opts));
  model::TransformerConfig target;
  absl::StatusOr<v1::ResolvedTarget> resolved = CheckRunTarget(spec, &target);
  if (!resolved.ok()) return Prefixed(resolved.status(), source);
  RETURN_IF_ERROR(Prefixed(CheckFitsRegisteredGpus(spec, target), source));
  RETURN_IF_ERROR(Prefixed(CheckPrecisionOnDrafters(spec, ListWorkers()), source));
  v1::RunStatus run;
  run.set_name(spec.name);
  run.set_state(v1::RUN_STATE_QUEUED);
  run.set_resolved_config_yaml(config::EmitRunSpec(spec));
  *run.mutable_resolved_target() = *resolved;
  RETURN_IF_ERROR(Prefixed(CheckRunData(spec, target, &run), source));
  if (dry_run) {
    run.set_state(v1::RUN_STATE_UNSPECIFIED);  // nothing was queued
    run.set_message("dry run: valid; nothing was queued");
    return run;
  }
  run.set_run_id(NewRunId(spec.name));
  run.set_message("waiting for an idle target/drafter pair");
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(store_->CreateRun(run, run_yaml, clock_->NowUnixMs()));
  LOG_RUN(INFO, run.run_id(), -1) << "submitted (" << source_name << "), queued";
  if (metrics_) {
    metrics_->Counter("dflash_coordinator_run_transitions_total")
        .Add({{"state", "queued"}})
        .Increment();
  }
  events_cv_.SignalAll();
  UpdateGaugesLocked();
  return store_->GetRun(run.run_id());
}

absl::StatusOr<v1::PlanRunResponse> Coordinator::PlanRun(const std::string& run_yaml,
                                                         bool largest) {
  config::RunSpecOptions opts;
  opts.check_paths = true;
  opts.data_roots = options_.data_roots;
  ASSIGN_OR_RETURN(config::RunSpec spec, config::ParseRunSpec(run_yaml, "run.yaml", opts));
  ASSIGN_OR_RETURN(model::TransformerConfig target, run::RunTargetConfig(spec));
  RETURN_IF_ERROR(run::CheckRunTargetShapes(spec, target));  // what submit refuses too
  const PlanTargets pt = PlanTargetsOf(spec, ListWorkers());
  ASSIGN_OR_RETURN(plan::RunPlan p, plan::PlanRun(spec, target, pt.transport));
  v1::PlanRunResponse resp;
  resp.set_table(plan::PlanTable(p, pt.target_capacity, pt.drafter_capacity));
  nlohmann::json json =
      nlohmann::json::parse(plan::PlanJson(p, pt.target_capacity, pt.drafter_capacity));
  AddFreeNow(p, &resp, &json);
  if (largest) {
    std::vector<plan::FittedBudget> lines;
    if (pt.target_capacity > 0) {
      lines.push_back(
          {"target worker " + pt.target_worker, plan::FitScope::kTarget, pt.target_capacity});
    }
    if (pt.drafter_capacity > 0) {
      lines.push_back(
          {"drafter worker " + pt.drafter_worker, plan::FitScope::kDrafter, pt.drafter_capacity});
    }
    if (pt.shared_capacity > 0) {
      lines.push_back({"target and drafter on " + pt.shared_gpu, plan::FitScope::kSharedGpu,
                       pt.shared_capacity});
    }
    RETURN_IF_ERROR(plan::FillLargestBudgets(spec, target, pt.transport, &lines));
    resp.set_table(resp.table() +
                   (lines.empty() ? "largest batches: no GPU worker registered, nothing to fit "
                                    "(dflashctl plan --local --gpu_gib G --largest plans against "
                                    "a size)\n"
                                  : plan::LargestTable(lines, spec)));
    json["largest"] = nlohmann::json::parse(plan::LargestJson(lines));
  }
  resp.set_json(json.dump(2) + "\n");
  for (const auto& [role, worker, capacity] :
       {std::make_tuple("target", pt.target_worker, pt.target_capacity),
        std::make_tuple("drafter", pt.drafter_worker, pt.drafter_capacity)}) {
    absl::Status fits = plan::CheckFits(spec, target, pt.transport, role, worker, capacity);
    if (!fits.ok()) resp.add_problems(std::string(fits.message()));
  }
  return resp;
}

void Coordinator::AddFreeNow(const plan::RunPlan& p, v1::PlanRunResponse* resp,
                             nlohmann::json* json) {
  // Each GPU's free memory now against the plan of the workers a pair would place there: one
  // target and one drafter per GPU at most.
  const std::vector<v1::WorkerInfo> workers = ListWorkers();
  std::vector<DeviceNeed> needs;
  std::set<std::pair<std::string, v1::WorkerRole>> taken;
  for (const v1::WorkerInfo& w : workers) {
    if (w.device().kind() != "cuda" || w.health() != v1::WORKER_HEALTH_UP) continue;
    if (!taken.insert({DeviceKey(w), w.role()}).second) continue;
    if (w.role() == v1::WORKER_ROLE_TARGET) needs.push_back({w, p.target.device_bytes});
    if (w.role() == v1::WORKER_ROLE_DRAFTER) needs.push_back({w, p.drafter.device_bytes});
  }
  const std::vector<GpuMemoryNow> now = MemoryNow(needs, workers);
  if (now.empty()) return;
  std::string table = "\nfree now (the workers' last heartbeats; a run that does not fit waits)\n";
  nlohmann::json list = nlohmann::json::array();
  for (const GpuMemoryNow& g : now) {
    const std::string names = absl::StrJoin(g.workers, ", ");
    absl::StrAppend(&table, "  ", g.Describe(), " (", names, ")",
                    !g.known   ? ": free memory not reported"
                    : g.Fits() ? ": fits now"
                               : ": WOULD WAIT",
                    "\n");
    list.push_back({{"gpu", g.index},
                    {"host", g.host},
                    {"workers", g.workers},
                    {"need_bytes", g.need},
                    {"free_bytes", g.free},
                    {"total_bytes", g.total},
                    {"workers_reserved_bytes", g.all_workers},
                    {"other_processes_bytes", g.others},
                    {"fits_now", g.known ? nlohmann::json(g.Fits()) : nlohmann::json(nullptr)}});
    if (g.known && !g.Fits()) resp->add_waits(g.Describe());
  }
  resp->set_table(resp->table() + table);
  (*json)["free_now"] = list;
}

std::vector<v1::WorkerInfo> Coordinator::IdleTargets() {
  std::vector<v1::WorkerInfo> out;
  for (const v1::WorkerInfo& w : ListWorkers()) {
    if (w.role() == v1::WORKER_ROLE_TARGET && w.health() == v1::WORKER_HEALTH_UP &&
        w.run_id().empty()) {
      out.push_back(w);
    }
  }
  return out;
}

absl::StatusOr<v1::EvalResult> Coordinator::EvaluateDrafter(const v1::EvaluateDrafterRequest& req) {
  config::RunSpecOptions opts;
  opts.check_paths = true;
  opts.data_roots = options_.data_roots;
  ASSIGN_OR_RETURN(config::RunSpec spec, config::ParseRunSpec(req.run_yaml(), "run.yaml", opts));
  if (req.drafter_dir().empty()) return absl::InvalidArgumentError("drafter_dir: required");
  // The drafter directory and the prompts are checked as run.yaml paths are (they exist, and lie
  // inside the data roots): as drafter.init_from and eval.prompts of the same spec.
  spec.drafter.init_from = req.drafter_dir();
  if (!req.prompts().empty()) spec.eval.prompts = req.prompts();
  if (req.max_new_tokens() > 0) spec.eval.max_new_tokens = req.max_new_tokens();
  if (req.max_prompts() > 0) spec.eval.max_prompts = req.max_prompts();
  ASSIGN_OR_RETURN(spec, config::ParseRunSpec(config::EmitRunSpec(spec), "evaluation", opts));
  ASSIGN_OR_RETURN(v1::EvaluateRequest eval, MakeEvaluateRequest(spec, spec.drafter.init_from));
  eval.set_measure_baseline(true);
  eval.set_batch_size(req.batch_size());
  // placement.target_parallel n > 1: a group of n idle targets decodes, each with its shard.
  const int64_t n = spec.placement.target_parallel;
  const std::vector<DecodeGroupWorkers> groups = DecodeGroups(IdleTargets(), n);
  if (groups.empty()) {
    return absl::FailedPreconditionError(
        n > 1
            ? absl::StrCat("no group of ", n, " idle target workers (placement.target_parallel ", n,
                           ": one machine, one kind, one GPU each) is registered to decode "
                           "with (each is up and holds no run)")
            : std::string("no idle target worker is registered to decode with (each is up and "
                          "holds no run)"));
  }
  const DecodeGroupWorkers& group = groups.front();
  const int64_t start = clock_->NowUnixMs();
  ASSIGN_OR_RETURN(v1::EvaluateResponse resp, EvaluateOnGroup(group, eval, workers_));
  const std::string names = GroupNames(group);
  LOG(INFO) << "evaluated " << spec.drafter.init_from << " on " << names << ": "
            << resp.verifications() << " verifications";
  return ToEvalResult(resp, names, spec.drafter.init_from, 0, start);
}

absl::Status Coordinator::Regenerate(
    const v1::RegenerateRequest& req,
    const std::function<bool(const v1::RegenerateProgress&)>& progress) {
  config::RunSpecOptions opts;
  opts.check_paths = true;
  opts.data_roots = options_.data_roots;
  ASSIGN_OR_RETURN(config::RunSpec spec, config::ParseRunSpec(req.run_yaml(), "run.yaml", opts));
  if (!req.input().empty()) {
    spec.data.train = req.input();
    ASSIGN_OR_RETURN(spec, config::ParseRunSpec(config::EmitRunSpec(spec), "regen", opts));
  }
  // The output is written on this machine: its directory must exist (and lie in a data root, as
  // data.train must, when roots are configured: checked as data.train of the same spec).
  if (req.output().empty()) return absl::InvalidArgumentError("output: required");
  const std::filesystem::path out = std::filesystem::absolute(req.output());
  {
    config::RunSpec where = spec;  // its directory is checked as drafter.init_from would be
    where.drafter.init_from = out.parent_path().string();
    absl::StatusOr<config::RunSpec> checked =
        config::ParseRunSpec(config::EmitRunSpec(where), "regen", opts);
    if (!checked.ok()) {
      return absl::InvalidArgumentError(absl::StrReplaceAll(
          checked.status().message(), {{"drafter.init_from", "output (its directory)"}}));
    }
  }
  v1::RegenerateRequest absolute = req;
  absolute.set_output(out.string());
  if (req.generation_config()) RETURN_IF_ERROR(coordinator::UseGenerationConfig(spec, &absolute));
  return coordinator::Regenerate(spec, absolute,
                                 DecodeGroups(IdleTargets(), spec.placement.target_parallel),
                                 workers_, progress);
}

absl::StatusOr<v1::RunStatus> Coordinator::GetRun(const std::string& run_id) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(v1::RunStatus run, store_->GetRun(run_id));
  FillProgressLocked(&run);
  return run;
}

absl::StatusOr<std::vector<v1::RunStatus>> Coordinator::ListRuns() {
  absl::MutexLock lock(&mu_);
  return store_->ListRuns();
}

absl::StatusOr<v1::RunStatus> Coordinator::CancelRun(const std::string& run_id) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(v1::RunStatus run, store_->GetRun(run_id));
  if (IsTerminal(run.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("run ", run_id, " already ended (", StateName(run.state()), ")"));
  }
  RETURN_IF_ERROR(
      TransitionLocked(run_id, run.state(), v1::RUN_STATE_CANCELLED, "cancelled by user"));
  UpdateGaugesLocked();
  return store_->GetRun(run_id);
}

absl::StatusOr<std::vector<v1::RunEvent>> Coordinator::WaitForEvents(
    const std::string& run_id, int64_t after_seq, std::chrono::milliseconds max_wait,
    bool* terminal) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + absl::FromChrono(max_wait);
  while (true) {
    ASSIGN_OR_RETURN(auto events, store_->EventsAfter(run_id, after_seq));
    ASSIGN_OR_RETURN(v1::RunStatus run, store_->GetRun(run_id));
    *terminal = IsTerminal(run.state());
    if (!events.empty() || *terminal) return events;
    if (events_cv_.WaitWithDeadline(&mu_, deadline)) {  // true: the deadline passed
      ASSIGN_OR_RETURN(events, store_->EventsAfter(run_id, after_seq));
      return events;
    }
  }
}

std::vector<v1::WorkerInfo> Coordinator::ListWorkers() {
  absl::MutexLock lock(&mu_);
  return registry_.List();
}

absl::StatusOr<v1::RegisterResponse> Coordinator::Register(const v1::WorkerInfo& worker) {
  absl::MutexLock lock(&mu_);
  std::optional<v1::WorkerInfo> before;  // the same name's previous registration
  ASSIGN_OR_RETURN(std::string id, registry_.Register(worker, &before));
  if (before && !before->run_id().empty()) {
    // A worker that registers again while holding a run was restarted (its new process holds no
    // run): the run is paused now rather than when a call to the old process fails or its
    // heartbeats time out, and the calls still in flight to the old process are ended.
    workers_->CancelCalls(*before);
    auto run = store_->GetRun(before->run_id());
    if (run.ok() &&
        (run->state() == v1::RUN_STATE_RUNNING || run->state() == v1::RUN_STATE_STARTING)) {
      TransitionLocked(before->run_id(), run->state(), v1::RUN_STATE_PAUSED,
                       absl::StrCat(RoleName(worker.role()), " worker ", id, " (", worker.name(),
                                    ") restarted: it registered again"))
          .IgnoreError();
    }
  }
  UpdateGaugesLocked();
  v1::RegisterResponse resp;
  resp.set_worker_id(id);
  resp.set_heartbeat_interval_ms(options_.heartbeat_interval_ms);
  return resp;
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const v1::HeartbeatRequest& req) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(registry_.Heartbeat(req.worker_id(), req.device()));
  if (metrics_) metrics_->Counter("dflash_coordinator_heartbeats_total").Add({}).Increment();
  ASSIGN_OR_RETURN(v1::WorkerInfo w, registry_.Get(req.worker_id()));
  v1::HeartbeatResponse resp;
  resp.set_assigned_run_id(w.run_id());
  return resp;
}

void Coordinator::Tick() {
  std::vector<Placement> placements;
  {
    absl::MutexLock lock(&mu_);
    for (const v1::WorkerInfo& w : registry_.Sweep()) {
      // A hung worker keeps its connections open: its calls are ended now, not at their deadlines,
      // so that the run's step thread ends and the run can be placed again.
      workers_->CancelCalls(w);
      if (w.run_id().empty()) continue;
      auto run = store_->GetRun(w.run_id());
      if (!run.ok() || IsTerminal(run->state()) || run->state() == v1::RUN_STATE_PAUSED) continue;
      absl::Status s = TransitionLocked(
          w.run_id(), run->state(), v1::RUN_STATE_PAUSED,
          absl::StrCat(RoleName(w.role()), " worker ", w.worker_id(), " (", w.name(),
                       ") missed heartbeats for more than ", registry_.timeout_ms(), " ms"));
      if (!s.ok()) {
        LOG_RUN(ERROR, w.run_id(), -1) << "cannot pause: " << s;
      }
    }
    RequeuePausedRunsLocked();
    placements = PlaceQueuedRunsLocked();
    UpdateGaugesLocked();
  }
  for (const Placement& p : placements) StartRun(p);
}

void Coordinator::RequeuePausedRunsLocked() {
  auto runs = store_->ListRuns();
  if (!runs.ok()) return;
  for (const v1::RunStatus& run : *runs) {
    // A paused run whose step thread has ended waits for workers again; it continues from its
    // newest checkpoint when placed (run_driver.cc).
    if (run.state() != v1::RUN_STATE_PAUSED || drivers_.count(run.run_id()) > 0) continue;
    TransitionLocked(run.run_id(), v1::RUN_STATE_PAUSED, v1::RUN_STATE_QUEUED,
                     "waiting for an idle target/drafter pair to resume")
        .IgnoreError();
  }
}

std::string Coordinator::FreeMemoryWait(const config::RunSpec& spec,
                                        const std::vector<std::vector<v1::WorkerInfo>>& groups,
                                        const std::vector<v1::WorkerInfo>& drafters, size_t pairs,
                                        const std::vector<v1::WorkerInfo>* eval_group) {
  absl::StatusOr<model::TransformerConfig> tc = run::RunTargetConfig(spec);
  if (!tc.ok()) return "";  // StartRun reports it
  std::vector<DeviceNeed> needs;
  for (size_t i = 0; i < pairs; ++i) {
    absl::StatusOr<transport::Transport> transport =
        ResolveTransport(spec, groups[i][0], drafters[i]);
    if (!transport.ok()) return "";
    absl::StatusOr<plan::RunPlan> p = plan::PlanRun(spec, *tc, *transport);
    if (!p.ok()) return "";
    for (const v1::WorkerInfo& t : groups[i]) needs.push_back({t, p->target.device_bytes});
    needs.push_back({drafters[i], p->drafter.device_bytes});
    // An evaluation group holds the target (the training forward's plan: an upper bound of the
    // weights, the drafter snapshot and the KV caches it decodes with).
    if (i == 0 && eval_group != nullptr) {
      for (const v1::WorkerInfo& t : *eval_group) needs.push_back({t, p->target.device_bytes});
    }
  }
  return FreeMemoryShortfall(needs, registry_.List());
}

std::vector<Placement> Coordinator::PlaceQueuedRunsLocked() {
  std::vector<Placement> placements;
  auto runs = store_->ListRuns();
  if (!runs.ok()) {
    LOG(ERROR) << "cannot list runs: " << runs.status();
    return placements;
  }
  for (const v1::RunStatus& run : *runs) {
    if (run.state() != v1::RUN_STATE_QUEUED) continue;
    auto targets = registry_.IdleWorkers(v1::WORKER_ROLE_TARGET);
    auto drafters = registry_.IdleWorkers(v1::WORKER_ROLE_DRAFTER);
    auto spec = config::ParseRunSpec(run.resolved_config_yaml(), run.run_id(),
                                     config::RunSpecOptions{"", /*check_paths=*/false});
    if (!spec.ok()) {
      TransitionLocked(run.run_id(), run.state(), v1::RUN_STATE_FAILED,
                       absl::StrCat("stored config no longer parses: ", spec.status().message()))
          .IgnoreError();
      continue;
    }
    // placement.target_parallel: each pair's target is a group of that many target processes.
    const std::vector<std::vector<v1::WorkerInfo>> groups =
        GroupTargets(targets, spec->placement.target_parallel);
    const size_t available = std::min(groups.size(), drafters.size());
    const size_t wanted = PairsWantedLocked(run.run_id(), *spec, drafters, available);
    if (available == 0 || wanted > available) continue;  // stays queued until workers free up
    // eval.worker: one more target group for the evaluations, when the run wants one.
    const EvalGroupNeed eval_need = EvalGroupWanted(*spec, groups);
    if (eval_need == EvalGroupNeed::kYes && groups.size() <= wanted) {
      const std::string wait =
          absl::StrCat("waiting for an idle target group (", spec->placement.target_parallel,
                       " process(es)) to reserve for evaluation (eval.worker: reserved), beside ",
                       wanted, " pair(s)");
      if (run.message() != wait) store_->SetQueuedMessage(run.run_id(), wait).IgnoreError();
      continue;
    }
    bool reserve = eval_need != EvalGroupNeed::kNo && groups.size() > wanted;
    // The memory plan against what the pairs' GPUs have free now (memory other processes hold
    // is not the run's): a run that does not fit waits, with the reason as its message.
    if (std::string wait = FreeMemoryWait(*spec, groups, drafters, wanted); !wait.empty()) {
      if (run.message() != wait) {
        absl::Status s = store_->SetQueuedMessage(run.run_id(), wait);
        if (!s.ok()) LOG_RUN(WARNING, run.run_id(), -1) << "cannot record why it waits: " << s;
        LOG_RUN(INFO, run.run_id(), -1) << "waits for GPU memory: " << wait;
      }
      continue;
    }
    // The evaluation group's GPUs must have the target's memory free too: reserved waits for it,
    // auto evaluates on pair 0 instead.
    if (reserve) {
      const std::string eval_wait =
          FreeMemoryWait(*spec, groups, drafters, wanted, &groups[wanted]);
      if (!eval_wait.empty() && eval_need == EvalGroupNeed::kYes) {
        const std::string wait =
            absl::StrCat("for evaluation (eval.worker: reserved): ", eval_wait);
        if (run.message() != wait) store_->SetQueuedMessage(run.run_id(), wait).IgnoreError();
        continue;
      }
      reserve = eval_wait.empty();
    }
    std::optional<Placement> p = AssignLocked(run, groups, drafters, wanted, reserve);
    if (p) placements.push_back(*std::move(p));
  }
  return placements;
}

size_t Coordinator::PairsWantedLocked(const std::string& run_id, const config::RunSpec& spec,
                                      const std::vector<v1::WorkerInfo>& drafters,
                                      size_t available) {
  if (spec.placement.pairs) return static_cast<size_t>(*spec.placement.pairs);
  // A run that resumes keeps its pair count: its data cursor plans for it (and a cursor of
  // another pair count is refused), so auto then waits for as many pairs as before.
  auto last = store_->LastCommittedStep(run_id);
  if (last.ok() && last->has_value()) {
    auto cursor = batching::ParseCursor((*last)->cursor);
    if (cursor.ok() && cursor->num_pairs >= 1) return static_cast<size_t>(cursor->num_pairs);
  }
  // placement.pairs auto: every idle pair. GPU drafters sum gradients over NCCL, which takes one
  // rank per GPU: auto stops before the first drafter on a GPU an earlier one holds.
  size_t max_auto = available;
  if (!drafters.empty() && DrafterCollective(drafters[0]) == transport::Collective::kNccl) {
    std::set<std::string> gpus;
    for (max_auto = 0; max_auto < available; ++max_auto) {
      if (!gpus.insert(DeviceKey(drafters[max_auto])).second) break;
    }
  }
  return std::min(available, max_auto);
}

std::optional<Placement> Coordinator::AssignLocked(
    const v1::RunStatus& run, const std::vector<std::vector<v1::WorkerInfo>>& groups,
    const std::vector<v1::WorkerInfo>& drafters, size_t wanted, bool reserve_eval_group) {
  Placement p;
  p.run_id = run.run_id();
  p.resolved_yaml = run.resolved_config_yaml();
  std::vector<std::string> ids;
  std::vector<std::string> described;
  for (size_t i = 0; i < wanted; ++i) {
    const std::vector<v1::WorkerInfo>& group = groups[i];
    p.pairs.emplace_back(group[0], drafters[i]);
    p.target_ranks.emplace_back(group.begin() + 1, group.end());
    std::vector<std::string> names;
    for (const v1::WorkerInfo& w : group) {
      registry_.Assign(w.worker_id(), run.run_id()).IgnoreError();
      ids.push_back(w.worker_id());
      names.push_back(w.name());
    }
    registry_.Assign(drafters[i].worker_id(), run.run_id()).IgnoreError();
    ids.push_back(drafters[i].worker_id());
    described.push_back(absl::StrCat(absl::StrJoin(names, "|"), "+", drafters[i].name()));
  }
  std::string eval_on;
  if (reserve_eval_group) {
    p.eval_group = groups[wanted];
    std::vector<std::string> names;
    for (const v1::WorkerInfo& w : p.eval_group) {
      registry_.Assign(w.worker_id(), run.run_id()).IgnoreError();
      ids.push_back(w.worker_id());
      names.push_back(w.name());
    }
    eval_on = absl::StrCat("; evaluation on ", absl::StrJoin(names, "|"), " (reserved)");
  }
  absl::Status s = TransitionLocked(
      run.run_id(), v1::RUN_STATE_QUEUED, v1::RUN_STATE_STARTING,
      absl::StrCat("placed on ", wanted, " pair(s): ", absl::StrJoin(described, ", "), eval_on),
      &ids);
  if (!s.ok()) {
    LOG_RUN(ERROR, run.run_id(), -1) << "placement failed: " << s;
    registry_.ReleaseRun(run.run_id());
    return std::nullopt;
  }
  return p;
}

void Coordinator::UpdateGaugesLocked() {
  if (!metrics_) return;
  auto& workers = metrics_->Gauge("dflash_coordinator_workers");
  auto& up = metrics_->Gauge("dflash_coordinator_worker_up");
  auto& last = metrics_->Gauge("dflash_coordinator_worker_last_heartbeat_seconds");
  std::map<std::pair<std::string, std::string>, int> counts;
  for (const char* role : {"target", "drafter"}) {
    for (const char* health : {"up", "down"}) counts[{role, health}] = 0;
  }
  for (const auto& w : registry_.List()) {
    const bool is_up = w.health() == v1::WORKER_HEALTH_UP;
    const std::string role = RoleName(w.role());
    counts[{role, is_up ? "up" : "down"}]++;
    up.Add({{"worker", w.name()}, {"role", role}}).Set(is_up ? 1 : 0);
    last.Add({{"worker", w.name()}, {"role", role}}).Set(w.last_heartbeat_unix_ms() / 1000.0);
  }
  for (const auto& [key, n] : counts) {
    workers.Add({{"role", key.first}, {"health", key.second}}).Set(n);
  }
  auto runs = store_->ListRuns();
  if (!runs.ok()) return;
  std::map<std::string, int> by_state;
  for (int s = v1::RUN_STATE_QUEUED; s <= v1::RUN_STATE_DONE; ++s) {
    by_state[StateName(static_cast<v1::RunState>(s))] = 0;
  }
  auto& step = metrics_->Gauge("dflash_coordinator_run_step");
  for (const auto& r : *runs) {
    by_state[StateName(r.state())]++;
    step.Add({{"run", r.run_id()}}).Set(static_cast<double>(r.step()));
  }
  auto& run_gauge = metrics_->Gauge("dflash_coordinator_runs");
  for (const auto& [state, n] : by_state) run_gauge.Add({{"state", state}}).Set(n);
}

}  // namespace dflash::coordinator
