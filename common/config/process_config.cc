#include "common/config/process_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/file_mode.h"
#include "common/base/status.h"
#include "common/config/yaml_reader.h"

namespace dflash::config {
namespace {

absl::StatusOr<YAML::Node> LoadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open config file"));
  std::stringstream ss;
  ss << in.rdbuf();
  YAML::Node root;
  RETURN_IF_ERROR(ParseYamlText(ss.str(), path, &root));
  return root;
}

void ReadTls(MapReader* parent, TlsOptions* tls) {
  if (!parent->Has("tls")) return;
  MapReader m = parent->Child("tls");
  m.Get("cert_file", &tls->cert_file);
  m.Get("key_file", &tls->key_file);
  m.Get("ca_file", &tls->ca_file);
  m.Get("mutual", &tls->mutual);
  m.Finish();
}

// The combination only; the files are read (and a private key readable by others refused) when
// the process loads them.
void CheckTls(ConfigErrors* e, const TlsOptions& tls) {
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    e->Add(tls.cert_file.empty() ? "tls.cert_file" : "tls.key_file",
           "a certificate and its key go together: set both tls.cert_file and tls.key_file");
  }
  if (tls.mutual && tls.ca_file.empty()) {
    e->Add("tls.ca_file", "required by tls.mutual (the CA peers' certificates must chain to)");
  }
}

void CheckUmask(ConfigErrors* e, const std::string& umask) {
  if (!ParseUmask(umask).ok()) e->Add("umask", "must be an octal mode of at most 0777, e.g. 077");
}

void CheckAddress(ConfigErrors* e, absl::string_view field, const std::string& address) {
  auto port = ParseHostPort(address);
  if (!port.ok()) e->Add(field, port.status().message());
}

void CheckLogLevel(ConfigErrors* e, const std::string& level) {
  CheckOneOf(e, "log_level", level, {"debug", "info", "warning", "error"});
}

bool IsLoopbackHost(std::string host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

// require_auth: a token, and TLS unless only this machine can connect.
void CheckRequiredAuth(ConfigErrors* e, const CoordinatorConfig& c) {
  if (c.auth_token_file.empty()) {
    e->Add("auth_token_file",
           "required by require_auth: a file (mode 600) holding the bearer token that dflashctl "
           "must present");
  }
  const size_t colon = c.listen.rfind(':');
  const std::string host = colon == std::string::npos ? "" : c.listen.substr(0, colon);
  if (c.tls.cert_file.empty() && !IsLoopbackHost(host)) {
    e->Add("listen", absl::StrCat("'", c.listen,
                                  "' accepts connections from the network and tls is not "
                                  "configured: with require_auth the bearer token must not cross "
                                  "the network in clear; set tls.cert_file and tls.key_file, or "
                                  "listen on 127.0.0.1"));
  }
}

}  // namespace

absl::StatusOr<int> ParseHostPort(const std::string& address) {
  size_t colon = address.rfind(':');
  const std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
  // An IPv6 host must be bracketed ([::1]:7070); a bare colon in the host is ambiguous.
  const bool bracketed = host.size() > 2 && host.front() == '[' && host.back() == ']';
  if (host.empty() || (host.find(':') != std::string::npos && !bracketed)) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be host:port (e.g. 127.0.0.1:7070 or [::1]:7070), got '", address, "'"));
  }
  const std::string digits = address.substr(colon + 1);
  int port = -1;
  const bool all_digits = !digits.empty() && digits.size() <= 5 &&
                          digits.find_first_not_of("0123456789") == std::string::npos;
  if (!all_digits || !absl::SimpleAtoi(digits, &port) || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port must be an integer in [0, 65535], got '", address, "'"));
  }
  return port;
}

absl::Status LoadCoordinatorConfigFile(const std::string& path, CoordinatorConfig* c) {
  ASSIGN_OR_RETURN(YAML::Node root, LoadFile(path));
  ConfigErrors e;
  MapReader m(root, "", &e);
  m.Get("listen", &c->listen);
  m.Get("metrics_listen", &c->metrics_listen);
  m.Get("state_dir", &c->state_dir);
  m.Get("worker_timeout_ms", &c->worker_timeout_ms);
  m.Get("heartbeat_interval_ms", &c->heartbeat_interval_ms);
  m.Get("worker_rpc_timeout_ms", &c->worker_rpc_timeout_ms);
  m.Get("log_level", &c->log_level);
  m.Get("log_file", &c->log_file);
  m.Get("umask", &c->umask);
  m.Get("data_roots", &c->data_roots);
  m.Get("auth_token_file", &c->auth_token_file);
  m.Get("require_auth", &c->require_auth);
  ReadTls(&m, &c->tls);
  m.Finish();
  return e.ToStatus(path);
}

absl::Status LoadWorkerConfigFile(const std::string& path, WorkerConfig* c) {
  ASSIGN_OR_RETURN(YAML::Node root, LoadFile(path));
  ConfigErrors e;
  MapReader m(root, "", &e);
  m.Get("role", &c->role);
  m.Get("coordinator", &c->coordinator);
  m.Get("listen", &c->listen);
  m.Get("advertise_host", &c->advertise_host);
  m.Get("metrics_listen", &c->metrics_listen);
  m.Get("gpu", &c->gpu);
  m.Get("name", &c->name);
  m.Get("log_level", &c->log_level);
  m.Get("log_file", &c->log_file);
  m.Get("umask", &c->umask);
  m.Get("profile_steps", &c->profile_steps);
  ReadTls(&m, &c->tls);
  m.Finish();
  return e.ToStatus(path);
}

absl::StatusOr<ProfileSteps> ParseProfileSteps(const std::string& text) {
  ProfileSteps out;
  if (text.empty()) return out;
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &out.first) ||
      !absl::SimpleAtoi(parts[1], &out.count)) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be FIRST:COUNT (e.g. 5:3, steps 5, 6 and 7), got '", text, "'"));
  }
  if (out.first < 0 || out.count < 1 || out.count > 1000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FIRST must be at least 0 and COUNT in [1, 1000] (each profiled step is slower), got '",
        text, "'"));
  }
  return out;
}

absl::Status ValidateCoordinatorConfig(const CoordinatorConfig& c) {
  ConfigErrors e;
  CheckAddress(&e, "listen", c.listen);
  CheckAddress(&e, "metrics_listen", c.metrics_listen);
  if (c.state_dir.empty()) e.Add("state_dir", "must not be empty");
  CheckRange(&e, "worker_timeout_ms", c.worker_timeout_ms, 100, 3'600'000);
  CheckRange(&e, "heartbeat_interval_ms", c.heartbeat_interval_ms, 10, 600'000);
  const bool in_range = c.heartbeat_interval_ms >= 10 && c.heartbeat_interval_ms <= 600'000 &&
                        c.worker_timeout_ms >= 100 && c.worker_timeout_ms <= 3'600'000;
  if (in_range && c.heartbeat_interval_ms * 2 > c.worker_timeout_ms) {
    e.Add("heartbeat_interval_ms",
          absl::StrCat("must be at most half of worker_timeout_ms (", c.worker_timeout_ms,
                       ") so one lost heartbeat does not mark a worker down, got ",
                       c.heartbeat_interval_ms));
  }
  CheckRange(&e, "worker_rpc_timeout_ms", c.worker_rpc_timeout_ms, 100, 3'600'000);
  CheckLogLevel(&e, c.log_level);
  for (size_t k = 0; k < c.data_roots.size(); ++k) {
    std::error_code ec;
    if (!std::filesystem::is_directory(c.data_roots[k], ec)) {
      e.Add(absl::StrCat("data_roots[", k, "]"),
            absl::StrCat("not a directory: '", c.data_roots[k], "'"));
    }
  }
  CheckUmask(&e, c.umask);
  CheckTls(&e, c.tls);
  if (c.tls.mutual && c.tls.cert_file.empty()) {
    e.Add("tls.cert_file",
          "required by tls.mutual (client certificates are asked for over TLS only)");
  }
  if (!c.tls.ca_file.empty() && c.tls.cert_file.empty()) {
    e.Add("tls.cert_file",
          "required with tls.ca_file (a coordinator that verifies workers serves TLS itself)");
  }
  if (c.require_auth) CheckRequiredAuth(&e, c);
  return e.ToStatus("");
}

absl::Status ValidateWorkerConfig(const WorkerConfig& c) {
  ConfigErrors e;
  if (c.role.empty())
    e.Add("role", "required field is missing (target or drafter)");
  else
    CheckOneOf(&e, "role", c.role, {"target", "drafter"});
  CheckAddress(&e, "coordinator", c.coordinator);
  CheckAddress(&e, "listen", c.listen);
  CheckAddress(&e, "metrics_listen", c.metrics_listen);
  if (c.advertise_host.empty()) e.Add("advertise_host", "must not be empty");
  CheckRange(&e, "gpu", c.gpu, -1, 1023);
  CheckLogLevel(&e, c.log_level);
  CheckUmask(&e, c.umask);
  if (absl::StatusOr<ProfileSteps> p = ParseProfileSteps(c.profile_steps); !p.ok()) {
    e.Add("profile_steps", p.status().message());
  } else if (p->count > 0 && c.gpu < 0) {
    e.Add("profile_steps", "profiles device kernels; this worker has no GPU (gpu is -1)");
  }
  CheckTls(&e, c.tls);
  // The coordinator dials back over TLS when it serves TLS, so a worker that reaches it over TLS
  // serves its control port over TLS too.
  if (!c.tls.ca_file.empty() && c.tls.cert_file.empty()) {
    e.Add("tls.cert_file",
          "required with tls.ca_file (a TLS coordinator dials the worker's control port over TLS)");
  }
  if (c.tls.mutual && c.tls.cert_file.empty()) {
    e.Add("tls.cert_file", "required by tls.mutual (the control port serves TLS)");
  }
  return e.ToStatus("");
}

}  // namespace dflash::config
