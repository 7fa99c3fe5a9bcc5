// dflash-coordinator: owns runs, the worker registry and placement. See
// services/coordinator/README.md.
#include <CLI/CLI.hpp>
#include <condition_variable>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/base/file_mode.h"
#include "common/base/logging.h"
#include "common/config/process_config.h"
#include "common/metrics/catalogue.h"
#include "common/rpc/process.h"
#include "common/rpc/tls.h"
#include "services/coordinator/coordinator.h"
#include "services/coordinator/coordinator_service.h"

namespace {

using dflash::config::CoordinatorConfig;

int Fail(const std::string& what, const absl::Status& s) {
  std::cerr << "dflash-coordinator: " << what << ": " << s.message() << "\n";
  return 2;
}

constexpr int kContinue = -1;  // ParseArgs: go on (any other value: exit with it)

// The config file, then the flags given over it. kContinue, or the exit code (--help, a bad
// flag: CLI11's; a bad config: 2).
int ParseArgs(int argc, char** argv, CoordinatorConfig* cfg, std::string* ready_file) {
  CLI::App app{"dflash coordinator: runs, worker registry, placement"};
  std::string config_file;
  CoordinatorConfig flags;
  app.add_option("--config", config_file, "YAML config file (flags override it)");
  auto* o_listen = app.add_option("--listen", flags.listen, "gRPC host:port");
  auto* o_metrics = app.add_option("--metrics_listen", flags.metrics_listen, "/metrics host:port");
  auto* o_state = app.add_option("--state_dir", flags.state_dir, "run store and run directories");
  auto* o_timeout = app.add_option("--worker_timeout_ms", flags.worker_timeout_ms,
                                   "a worker silent this long is marked down");
  auto* o_hb = app.add_option("--heartbeat_interval_ms", flags.heartbeat_interval_ms,
                              "heartbeat period told to workers");
  auto* o_rpc = app.add_option("--worker_rpc_timeout_ms", flags.worker_rpc_timeout_ms,
                               "deadline of control RPCs to workers");
  auto* o_level = app.add_option("--log_level", flags.log_level, "debug|info|warning|error");
  auto* o_log = app.add_option("--log_file", flags.log_file, "also append logs here");
  auto* o_token = app.add_option("--auth_token_file", flags.auth_token_file,
                                 "require this bearer token from dflashctl (file, one line)");
  auto* o_require = app.add_flag("--require_auth", flags.require_auth,
                                 "refuse to start without --auth_token_file, or on a network "
                                 "address without TLS");
  auto* o_roots = app.add_option("--data_root", flags.data_roots,
                                 "run.yaml paths must lie inside one of these (repeatable)");
  auto* o_umask = app.add_option("--umask", flags.umask,
                                 "octal umask for what it writes (default 077: private)");
  auto* o_cert = app.add_option("--tls_cert_file", flags.tls.cert_file,
                                "serve gRPC over TLS with this PEM certificate chain");
  auto* o_key = app.add_option("--tls_key_file", flags.tls.key_file,
                               "the certificate's PEM private key (mode 600)");
  auto* o_ca = app.add_option("--tls_ca_file", flags.tls.ca_file,
                              "PEM CA bundle that workers' certificates must chain to");
  auto* o_mutual = app.add_flag("--tls_mutual", flags.tls.mutual,
                                "workers must present a certificate signed by --tls_ca_file");
  app.add_option("--ready_file", *ready_file,
                 "write {\"grpc_port\":..,\"metrics_port\":..} here once serving");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!config_file.empty()) {
    if (auto s = dflash::config::LoadCoordinatorConfigFile(config_file, cfg); !s.ok()) {
      return Fail("config", s);
    }
  }
  if (*o_listen) cfg->listen = flags.listen;
  if (*o_metrics) cfg->metrics_listen = flags.metrics_listen;
  if (*o_state) cfg->state_dir = flags.state_dir;
  if (*o_timeout) cfg->worker_timeout_ms = flags.worker_timeout_ms;
  if (*o_hb) cfg->heartbeat_interval_ms = flags.heartbeat_interval_ms;
  if (*o_rpc) cfg->worker_rpc_timeout_ms = flags.worker_rpc_timeout_ms;
  if (*o_umask) cfg->umask = flags.umask;
  if (*o_roots) cfg->data_roots = flags.data_roots;
  if (*o_token) cfg->auth_token_file = flags.auth_token_file;
  if (*o_require) cfg->require_auth = flags.require_auth;
  if (*o_cert) cfg->tls.cert_file = flags.tls.cert_file;
  if (*o_key) cfg->tls.key_file = flags.tls.key_file;
  if (*o_ca) cfg->tls.ca_file = flags.tls.ca_file;
  if (*o_mutual) cfg->tls.mutual = flags.tls.mutual;
  if (*o_level) cfg->log_level = flags.log_level;
  if (*o_log) cfg->log_file = flags.log_file;
  if (auto s = dflash::config::ValidateCoordinatorConfig(*cfg); !s.ok()) return Fail("config", s);
  return kContinue;
}

// The umask (before any thread or file: the run store, run directories and logs are private by
// default) and the log. kContinue or the exit code.
int SetUpProcess(const CoordinatorConfig& cfg) {
  if (auto s = dflash::ApplyUmask(cfg.umask); !s.ok()) return Fail("config", s);
  dflash::SetLogProcessName("coordinator");
  dflash::LogLevel level;
  dflash::ParseLogLevel(cfg.log_level, &level);
  dflash::SetLogMinLevel(level);
  if (!dflash::SetLogFile(cfg.log_file)) {
    return Fail("log_file", absl::UnavailableError("cannot open " + cfg.log_file));
  }
  return kContinue;
}

// The tick thread: sweeps heartbeats and places runs every `period` until destroyed. Its period
// bounds how late a dead worker is noticed: at most worker_timeout + tick.
class Ticker {
 public:
  Ticker(dflash::coordinator::Coordinator* c, std::chrono::milliseconds period)
      : thread_([this, c, period] {
          std::unique_lock<std::mutex> lock(mu_);
          while (!cv_.wait_for(lock, period, [&] { return stopping_; })) {
            lock.unlock();
            c->Tick();
            lock.lock();
          }
        }) {}
  ~Ticker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;  // last: started once the members above exist
};

// The coordinator's bearer token (empty: none required).
absl::StatusOr<std::string> Token(const CoordinatorConfig& cfg) {
  if (cfg.auth_token_file.empty()) return std::string();
  return dflash::ReadTokenFile(cfg.auth_token_file);
}

int Serve(const CoordinatorConfig& cfg, const std::string& ready_file) {
  std::error_code ec;
  std::filesystem::create_directories(cfg.state_dir, ec);
  if (ec) return Fail("state_dir", absl::UnavailableError(cfg.state_dir + ": " + ec.message()));
  auto store = dflash::coordinator::RunStore::Open(cfg.state_dir + "/runs.sqlite");
  if (!store.ok()) return Fail("run store", store.status());
  auto metrics = dflash::metrics::MetricsServer::Create("coordinator", cfg.metrics_listen);
  if (!metrics.ok()) return Fail("metrics", metrics.status());
  auto security = dflash::TransportSecurity::Load(cfg.tls, "tls.");
  if (!security.ok()) return Fail("config", security.status());
  dflash::coordinator::GrpcWorkerControl worker_control(cfg.worker_rpc_timeout_ms,
                                                        security->ChannelCredentials());
  dflash::coordinator::CoordinatorOptions options;
  options.heartbeat_interval_ms = cfg.heartbeat_interval_ms;
  options.worker_timeout_ms = cfg.worker_timeout_ms;
  options.state_dir = cfg.state_dir;
  options.data_roots = cfg.data_roots;
  auto coordinator = dflash::coordinator::Coordinator::Create(
      options, *std::move(store), dflash::RealClock::Get(), &worker_control, metrics->get());
  if (!coordinator.ok()) return Fail("recovery", coordinator.status());
  absl::StatusOr<std::string> token = Token(cfg);
  if (!token.ok()) return Fail("auth_token_file", token.status());
  dflash::coordinator::CoordinatorService user_api(coordinator->get(), *token);
  dflash::coordinator::RegistryService registry_api(coordinator->get(), security->mutual());
  int port = 0;
  // Client certificates are asked for (and verified) but not required at the handshake: dflashctl
  // connects without one; the registry checks the workers' (tls.mutual).
  auto server = dflash::StartGrpcServer(cfg.listen, {&user_api, &registry_api}, &port,
                                        security->ServerCredentials(/*require_client_cert=*/false));
  if (!server.ok()) return Fail("listen", server.status());
  {
    Ticker ticker(coordinator->get(),
                  std::chrono::milliseconds(std::max<int64_t>(10, cfg.heartbeat_interval_ms / 4)));
    LOG(INFO) << "serving gRPC (" << security->Describe() << ") on "
              << dflash::WithPort(cfg.listen, port) << ", /metrics on "
              << dflash::WithPort(cfg.metrics_listen, (*metrics)->port()) << ", state in "
              << cfg.state_dir;
    if (!ready_file.empty()) {
      nlohmann::json ready = {{"grpc_port", port},
                              {"metrics_port", (*metrics)->port()},
                              {"pid", static_cast<int64_t>(getpid())}};
      if (auto s = dflash::WriteFileAtomically(ready_file, ready.dump()); !s.ok()) {
        return Fail("ready_file", s);  // the ticker stops and joins first
      }
    }
    int sig = dflash::WaitForTerminationSignal();
    LOG(INFO) << "signal " << sig << ": shutting down";
  }
  (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  LOG(INFO) << "stopped";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  dflash::BlockTerminationSignals();
  CoordinatorConfig cfg;
  std::string ready_file;
  if (int code = ParseArgs(argc, argv, &cfg, &ready_file); code != kContinue) return code;
  if (int code = SetUpProcess(cfg); code != kContinue) return code;
  return Serve(cfg, ready_file);
}
