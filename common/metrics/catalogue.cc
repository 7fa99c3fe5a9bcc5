#include "common/metrics/catalogue.h"

#include <prometheus/text_serializer.h>

#include <cstdlib>
#include <exception>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/metrics/http_exposer.h"

namespace dflash::metrics {

const std::vector<MetricDef>& Catalogue() {
  using T = MetricType;
  static const std::vector<MetricDef> defs = {
      // Coordinator.
      {"dflash_coordinator_workers", T::kGauge, "coordinator",
       "Registered workers by role and health."},
      {"dflash_coordinator_worker_up", T::kGauge, "coordinator",
       "1 while the worker heartbeats within worker_timeout, else 0."},
      {"dflash_coordinator_worker_last_heartbeat_seconds", T::kGauge, "coordinator",
       "Unix time of the worker's last heartbeat."},
      {"dflash_coordinator_heartbeats_total", T::kCounter, "coordinator",
       "Heartbeats received from workers."},
      {"dflash_coordinator_runs", T::kGauge, "coordinator", "Runs in the store by state."},
      {"dflash_coordinator_run_transitions_total", T::kCounter, "coordinator",
       "Run state transitions, by target state."},
      {"dflash_coordinator_run_step", T::kGauge, "coordinator",
       "Last committed optimizer step of the run."},
      {"dflash_coordinator_plan_peak_bytes", T::kGauge, "coordinator",
       "The memory plan's predicted allocator peak of each worker role of a running run."},
      {"dflash_coordinator_run_oom_splits_total", T::kCounter, "coordinator",
       "Micro-batches the run's drafters trained as halves after running out of device memory."},
      {"dflash_coordinator_run_loss", T::kGauge, "coordinator",
       "Loss of the run's last committed step (docs/method.md §3.6)."},
      {"dflash_coordinator_run_acceptance_length", T::kGauge, "coordinator",
       "Expected acceptance length of the run's last committed step (docs/method.md §3.6)."},
      {"dflash_coordinator_run_measured_acceptance_length", T::kGauge, "coordinator",
       "Acceptance length tau (tokens per target verification) measured by speculative decoding "
       "at the run's newest evaluation (eval.every_steps)."},
      {"dflash_coordinator_run_acceptance_by_position", T::kGauge, "coordinator",
       "Share of verifications that accepted the drafter's proposal at each block position, at "
       "the run's newest evaluation."},
      {"dflash_coordinator_run_acceptance_length_by_context", T::kGauge, "coordinator",
       "Acceptance length tau at the run's newest evaluation by the context length of the "
       "verifications (label context: 0-1023, 1024-4095, 4096-16383, 16384+ tokens; "
       "docs/cli.md#eval)."},
      {"dflash_coordinator_run_eval_tokens_per_second", T::kGauge, "coordinator",
       "Tokens per second of speculative decoding at the run's newest evaluation."},
      {"dflash_coordinator_run_tokens_per_second", T::kGauge, "coordinator",
       "Context tokens per second of the run's last committed step."},
      {"dflash_coordinator_run_epoch", T::kGauge, "coordinator",
       "Epoch of the run's last committed step."},
      {"dflash_coordinator_run_grad_norm", T::kGauge, "coordinator",
       "Global gradient norm (before clipping) of the run's last committed step."},
      {"dflash_coordinator_run_learning_rate", T::kGauge, "coordinator",
       "Learning rate applied at the run's last committed step."},
      {"dflash_coordinator_run_slot_accuracy", T::kGauge, "coordinator",
       "Accuracy of each block slot (label slot) at the run's last committed step."},
      {"dflash_coordinator_run_tokens_total", T::kCounter, "coordinator",
       "Context tokens trained by the run's committed steps."},
      {"dflash_coordinator_run_skipped_steps_total", T::kCounter, "coordinator",
       "Steps not applied (non-finite loss or gradient norm)."},
      // Workers (both roles).
      {"dflash_worker_up", T::kGauge, "worker", "1 while the worker process serves."},
      {"dflash_worker_registered", T::kGauge, "worker",
       "1 while the worker holds a registration with the coordinator."},
      {"dflash_worker_heartbeats_total", T::kCounter, "worker",
       "Heartbeats acknowledged by the coordinator."},
      {"dflash_worker_heartbeat_failures_total", T::kCounter, "worker",
       "Heartbeats that failed (coordinator unreachable or registration lost)."},
      {"dflash_worker_gpu_memory_total_bytes", T::kGauge, "worker",
       "Device memory of the worker's GPU (host memory for a CPU worker)."},
      {"dflash_worker_gpu_memory_used_bytes", T::kGauge, "worker",
       "Device memory in use on the worker's GPU by all processes (host: in use)."},
      {"dflash_worker_gpu_memory_allocated_bytes", T::kGauge, "worker",
       "Bytes held by live tensors in LibTorch's CUDA caching allocator."},
      {"dflash_worker_gpu_memory_reserved_bytes", T::kGauge, "worker",
       "Bytes reserved by LibTorch's CUDA caching allocator."},
      {"dflash_worker_gpu_memory_peak_bytes", T::kGauge, "worker",
       "Peak bytes allocated by LibTorch's CUDA caching allocator over the process's life."},
      {"dflash_worker_gpu_memory_step_peak_bytes", T::kGauge, "worker",
       "Peak bytes allocated by LibTorch's CUDA caching allocator during the last step."},
      {"dflash_worker_host_rss_bytes", T::kGauge, "worker", "Resident set size of the process."},
      {"dflash_worker_oom_splits_total", T::kCounter, "worker",
       "Micro-batches trained as halves after running out of device memory."},
      {"dflash_worker_step", T::kGauge, "worker", "Last step the worker completed for its run."},
      {"dflash_worker_tokens_total", T::kCounter, "worker",
       "Context tokens of the micro-batches the worker completed (target: ran, drafter: trained)."},
      {"dflash_worker_micro_batches_total", T::kCounter, "worker",
       "Micro-batches the worker completed."},
      {"dflash_worker_transport_bytes_total", T::kCounter, "worker",
       "Bytes through the feature channel, by transport (target: messages plus, for cuda_ipc, the "
       "features written in place; drafter: messages received)."},
      {"dflash_worker_transport_wait_seconds_total", T::kCounter, "worker",
       "Seconds blocked on the feature channel (target: waiting for a free slot; drafter: waiting "
       "for the next batch), by transport."},
      {"dflash_worker_feature_queue_depth", T::kGauge, "worker",
       "Feature batches waiting in the channel between target and drafter, the most seen during "
       "the worker's last step (target: after each send; drafter: at each receive); the channel "
       "holds at most 2. Full on the target side means the drafter is the bottleneck."},
  };
  return defs;
}

MetricsServer::~MetricsServer() = default;

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Create(
    const std::string& component, const std::string& listen_address) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->registry_ = std::make_shared<prometheus::Registry>();
  for (const MetricDef& def : Catalogue()) {
    if (component != def.component) continue;
    if (def.type == MetricType::kGauge) {
      auto& family =
          prometheus::BuildGauge().Name(def.name).Help(def.help).Register(*server->registry_);
      server->gauges_.emplace_back(def.name, &family);
    } else {
      auto& family =
          prometheus::BuildCounter().Name(def.name).Help(def.help).Register(*server->registry_);
      server->counters_.emplace_back(def.name, &family);
    }
  }
  if (!listen_address.empty()) {
    MetricsServer* raw = server.get();
    auto exposer = HttpExposer::Start(listen_address, [raw] { return raw->Scrape(); });
    if (!exposer.ok()) {
      return absl::Status(exposer.status().code(),
                          absl::StrCat("metrics_listen: ", exposer.status().message()));
    }
    server->exposer_ = *std::move(exposer);
    server->port_ = server->exposer_->port();
  }
  return server;
}

prometheus::Family<prometheus::Gauge>& MetricsServer::Gauge(const std::string& name) {
  for (auto& [n, f] : gauges_) {
    if (n == name) return *f;
  }
  LOG(ERROR) << "metric not in the catalogue as a gauge: " << name;
  std::abort();
}

prometheus::Family<prometheus::Counter>& MetricsServer::Counter(const std::string& name) {
  for (auto& [n, f] : counters_) {
    if (n == name) return *f;
  }
  LOG(ERROR) << "metric not in the catalogue as a counter: " << name;
  std::abort();
}

std::string MetricsServer::Scrape() const {
  prometheus::TextSerializer serializer;
  return serializer.Serialize(registry_->Collect());
}

}  // namespace dflash::metrics
