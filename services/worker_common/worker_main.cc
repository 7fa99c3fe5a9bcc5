#include "services/worker_common/worker_main.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/base/file_mode.h"
#include "common/base/logging.h"
#include "common/config/process_config.h"
#include "common/device/device_probe.h"
#include "common/rpc/process.h"
#include "common/rpc/tls.h"
#include "dflash/v1/worker.grpc.pb.h"
#include "services/worker_common/worker_service.h"

namespace dflash::worker {
namespace {

std::string RoleName(v1::WorkerRole role) {
  return role == v1::WORKER_ROLE_TARGET ? "target" : "drafter";
}

int Fail(const std::string& process, const std::string& what, const absl::Status& s) {
  std::cerr << process << ": " << what << ": " << s.message() << "\n";
  return 2;
}

}  // namespace

int RunWorkerMain(int argc, char** argv, v1::WorkerRole role, StepRunnerFactory runners,
                  EvaluatorFactory evaluators) {
  BlockTerminationSignals();
  const std::string process = absl::StrCat("dflash-", RoleName(role), "-worker");
  CLI::App app{absl::StrCat("dflash ", RoleName(role), " worker")};
  std::string config_file, ready_file;
  config::WorkerConfig f;
  app.add_option("--config", config_file, "YAML config file (flags override it)");
  auto* o_coord = app.add_option("--coordinator", f.coordinator, "coordinator host:port");
  auto* o_listen =
      app.add_option("--listen", f.listen, "control gRPC host:port (port 0: OS picks)");
  auto* o_adv = app.add_option("--advertise_host", f.advertise_host, "host the coordinator dials");
  auto* o_metrics = app.add_option("--metrics_listen", f.metrics_listen, "/metrics host:port");
  auto* o_gpu = app.add_option("--gpu", f.gpu, "GPU ordinal, -1 for CPU");
  auto* o_name = app.add_option("--name", f.name, "stable worker name");
  auto* o_level = app.add_option("--log_level", f.log_level, "debug|info|warning|error");
  auto* o_log = app.add_option("--log_file", f.log_file, "also append logs here");
  auto* o_umask =
      app.add_option("--umask", f.umask, "octal umask for what it writes (default 077: private)");
  auto* o_cert = app.add_option("--tls_cert_file", f.tls.cert_file,
                                "serve the control port over TLS with this PEM certificate chain "
                                "(also presented to the coordinator)");
  auto* o_key = app.add_option("--tls_key_file", f.tls.key_file,
                               "the certificate's PEM private key (mode 600)");
  auto* o_ca =
      app.add_option("--tls_ca_file", f.tls.ca_file,
                     "dial the coordinator over TLS, verifying it with this PEM CA bundle");
  auto* o_mutual =
      app.add_flag("--tls_mutual", f.tls.mutual,
                   "the control port admits only certificates signed by --tls_ca_file");
  auto* o_profile = app.add_option("--profile_steps", f.profile_steps,
                                   "FIRST:COUNT: steps FIRST..FIRST+COUNT-1 of each run log their "
                                   "device time by kernel category");
  std::string role_flag;
  app.add_option("--role", role_flag, "must be " + RoleName(role) + " if given");
  app.add_option("--ready_file", ready_file, "write ports as JSON here once serving");
  CLI11_PARSE(app, argc, argv);

  config::WorkerConfig cfg;
  cfg.role = RoleName(role);
  if (!config_file.empty()) {
    if (auto s = config::LoadWorkerConfigFile(config_file, &cfg); !s.ok()) {
      return Fail(process, "config", s);
    }
  }
  if (!role_flag.empty()) cfg.role = role_flag;
  if (cfg.role != RoleName(role)) {
    return Fail(process, "role",
                absl::InvalidArgumentError(absl::StrCat("this binary is the ", RoleName(role),
                                                        " worker, got role '", cfg.role, "'")));
  }
  if (*o_coord) cfg.coordinator = f.coordinator;
  if (*o_listen) cfg.listen = f.listen;
  if (*o_adv) cfg.advertise_host = f.advertise_host;
  if (*o_metrics) cfg.metrics_listen = f.metrics_listen;
  if (*o_gpu) cfg.gpu = f.gpu;
  if (*o_name) cfg.name = f.name;
  if (*o_level) cfg.log_level = f.log_level;
  if (*o_log) cfg.log_file = f.log_file;
  if (*o_umask) cfg.umask = f.umask;
  if (*o_cert) cfg.tls.cert_file = f.tls.cert_file;
  if (*o_key) cfg.tls.key_file = f.tls.key_file;
  if (*o_ca) cfg.tls.ca_file = f.tls.ca_file;
  if (*o_mutual) cfg.tls.mutual = f.tls.mutual;
  if (*o_profile) cfg.profile_steps = f.profile_steps;
  if (auto s = config::ValidateWorkerConfig(cfg); !s.ok()) return Fail(process, "config", s);
  // Before any thread or file: checkpoints, exports and logs are private by default.
  if (auto s = ApplyUmask(cfg.umask); !s.ok()) return Fail(process, "config", s);

  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  if (cfg.name.empty()) {
    cfg.name =
        absl::StrCat(cfg.role, "-", host, "-", cfg.gpu < 0 ? "cpu" : absl::StrCat("gpu", cfg.gpu));
  }
  SetLogProcessName(absl::StrCat(cfg.role, "-worker[", cfg.name, "]"));
  LogLevel level;
  ParseLogLevel(cfg.log_level, &level);
  SetLogMinLevel(level);
  if (!SetLogFile(cfg.log_file)) {
    return Fail(process, "log_file", absl::UnavailableError("cannot open " + cfg.log_file));
  }

  auto security = TransportSecurity::Load(cfg.tls, "tls.");
  if (!security.ok()) return Fail(process, "config", security.status());
  auto device = device::Probe(static_cast<int>(cfg.gpu));
  if (!device.ok()) return Fail(process, "gpu", device.status());
  auto metrics = metrics::MetricsServer::Create("worker", cfg.metrics_listen);
  if (!metrics.ok()) return Fail(process, "metrics", metrics.status());

  v1::WorkerInfo self;
  self.set_name(cfg.name);
  self.set_role(role);
  self.set_pid(getpid());
  self.set_version(DFLASH_VERSION);
  v1::DeviceInfo* d = self.mutable_device();
  d->set_kind(device->kind);
  d->set_index(device->index);
  d->set_name(device->name);
  d->set_total_bytes(device->total_bytes);
  d->set_free_bytes(device->free_bytes);
  d->set_compute_capability(device->compute_capability);
  self.set_metrics_address(WithPort(cfg.metrics_listen, (*metrics)->port()));

  WorkerCore core(self, std::move(runners), metrics->get());
  if (evaluators) core.SetEvaluator(evaluators());
  core.SetProfileSteps(*config::ParseProfileSteps(cfg.profile_steps));  // validated above
  TargetWorkerService target_service(&core);
  WorkerControlService<v1::DrafterWorker::Service> drafter_service(&core);
  grpc::Service* service = role == v1::WORKER_ROLE_TARGET
                               ? static_cast<grpc::Service*>(&target_service)
                               : static_cast<grpc::Service*>(&drafter_service);
  int port = 0;
  auto server =
      StartGrpcServer(cfg.listen, {service}, &port,
                      security->ServerCredentials(/*require_client_cert=*/cfg.tls.mutual));
  if (!server.ok()) return Fail(process, "listen", server.status());
  // The address the coordinator dials: advertise_host plus the port actually bound.
  core.SetControlAddress(absl::StrCat(cfg.advertise_host, ":", port));

  (*metrics)->Gauge("dflash_worker_up").Add({{"worker", cfg.name}, {"role", cfg.role}}).Set(1);
  CoordinatorLink link(cfg.coordinator, &core, metrics->get(), security->ChannelCredentials());
  link.Start();
  LOG(INFO) << "serving control (" << security->Describe() << ") on " << cfg.advertise_host << ":"
            << port << ", /metrics on " << self.metrics_address() << ", device " << device->kind
            << " " << device->name;
  if (!ready_file.empty()) {
    nlohmann::json ready = {{"grpc_port", port},
                            {"metrics_port", (*metrics)->port()},
                            {"pid", static_cast<int64_t>(getpid())},
                            {"name", cfg.name}};
    if (auto s = WriteFileAtomically(ready_file, ready.dump()); !s.ok()) {
      return Fail(process, "ready_file", s);
    }
  }
  int sig = WaitForTerminationSignal();
  LOG(INFO) << "signal " << sig << ": shutting down";
  link.Stop();
  (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  LOG(INFO) << "stopped";
  return 0;
}

}  // namespace dflash::worker
