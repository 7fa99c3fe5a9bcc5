// Configuration of each long-lived process (coordinator, workers): a YAML file and/or flags.
// Precedence: built-in defaults < --config file < explicit flags. Documented in docs/cli.md.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/rpc/tls_options.h"

namespace dflash::config {

struct CoordinatorConfig {
  std::string listen = "127.0.0.1:7070";          // gRPC for dflashctl and workers
  std::string metrics_listen = "127.0.0.1:9470";  // Prometheus /metrics
  std::string state_dir = "dflash-state";         // SQLite run store, run directories
  int64_t worker_timeout_ms = 10000;              // silent this long => worker down
  int64_t heartbeat_interval_ms = 1000;           // told to workers at registration
  int64_t worker_rpc_timeout_ms = 30000;          // deadline of control RPCs to workers
  std::string log_level = "info";
  std::string log_file;
  std::string umask = "077";  // what the process creates: private to its user (octal)
  // Non-empty: every path of a submitted run.yaml must lie, symlinks followed, inside one of
  // these directories (models, data, init_from, eval prompts).
  std::vector<std::string> data_roots;
  // Non-empty: a file holding the bearer token dflashctl must present (the user API only; the
  // workers' registry service is not covered).
  std::string auth_token_file;
  // gRPC transport security (TLS; mutual: workers must present a certificate signed by ca_file).
  TlsOptions tls;
  // A deployment's safety net (the Kubernetes manifests set it): refuse to start without
  // auth_token_file, and with a `listen` address other than loopback unless TLS is configured
  // (the bearer token would otherwise cross the network in clear).
  bool require_auth = false;
};

struct WorkerConfig {
  std::string role;  // target|drafter
  std::string coordinator = "127.0.0.1:7070";
  std::string listen = "127.0.0.1:0";        // control gRPC; port 0 = chosen by the OS
  std::string advertise_host = "127.0.0.1";  // host the coordinator dials back
  std::string metrics_listen = "127.0.0.1:0";
  int64_t gpu = -1;  // -1 = CPU
  std::string name;  // empty = <role>-<hostname>-<gpu|cpu>
  std::string log_level = "info";
  std::string log_file;
  std::string umask = "077";  // checkpoints, exports, logs: private to its user (octal)
  // gRPC transport security (TLS to the coordinator and on the control port; mutual: only
  // clients with a certificate signed by ca_file reach the control port).
  TlsOptions tls;
  // "FIRST:COUNT": steps FIRST .. FIRST+COUNT-1 of each run run under the kernel profiler and
  // log where their time went (docs/operations.md, "Where a step's time goes"); "" = never.
  std::string profile_steps;
};

// profile_steps parsed: the first step and how many; {0, 0} for "".
struct ProfileSteps {
  int64_t first = 0, count = 0;
  bool Covers(int64_t step) const { return count > 0 && step >= first && step < first + count; }
};
absl::StatusOr<ProfileSteps> ParseProfileSteps(const std::string& text);

// Reads a config file into `out` (fields absent from the file keep their value).
absl::Status LoadCoordinatorConfigFile(const std::string& path, CoordinatorConfig* out);
absl::Status LoadWorkerConfigFile(const std::string& path, WorkerConfig* out);

// Range and cross-field checks after flags were applied; errors name the field.
absl::Status ValidateCoordinatorConfig(const CoordinatorConfig& c);
absl::Status ValidateWorkerConfig(const WorkerConfig& c);

// "host:port" with a port in [0, 65535]; returns the port.
absl::StatusOr<int> ParseHostPort(const std::string& address);

}  // namespace dflash::config
