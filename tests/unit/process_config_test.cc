// Tests of the coordinator and worker process configuration (common/config/process_config.h):
// strict loading of config files, validation after flags, and host:port parsing.
#include "common/config/process_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/file_mode.h"

namespace dflash::config {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// A fresh directory under /tmp, removed with its contents at the end of the test.
class ProcessConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dflash-process-config-test-XXXXXX";
    char* dir = mkdtemp(tmpl);
    ASSERT_NE(dir, nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  std::string Write(const std::string& name, const std::string& content) {
    std::string path = (fs::path(dir_) / name).string();
    std::ofstream out(path);
    out << content;
    return path;
  }

  std::string dir_;
};

// ---------------------------------------------------------------------------------------------
// LoadCoordinatorConfigFile

TEST_F(ProcessConfigTest, CoordinatorFileSetsFieldsAndKeepsOthers) {
  std::string path = Write("coordinator.yaml",
                           "listen: 0.0.0.0:7171\n"
                           "state_dir: /var/lib/dflash\n"
                           "worker_timeout_ms: 20000\n"
                           "log_level: debug\n");
  CoordinatorConfig c;
  c.log_file = "kept.log";
  ASSERT_TRUE(LoadCoordinatorConfigFile(path, &c).ok());
  EXPECT_EQ(c.listen, "0.0.0.0:7171");
  EXPECT_EQ(c.state_dir, "/var/lib/dflash");
  EXPECT_EQ(c.worker_timeout_ms, 20000);
  EXPECT_EQ(c.log_level, "debug");
  // Absent from the file: unchanged.
  EXPECT_EQ(c.metrics_listen, "127.0.0.1:9470");
  EXPECT_EQ(c.heartbeat_interval_ms, 1000);
  EXPECT_EQ(c.worker_rpc_timeout_ms, 30000);
  EXPECT_EQ(c.log_file, "kept.log");
  EXPECT_TRUE(ValidateCoordinatorConfig(c).ok());
}

TEST_F(ProcessConfigTest, CoordinatorEmptyFileKeepsDefaults) {
  std::string path = Write("empty.yaml", "# nothing set\n");
  CoordinatorConfig c;
  ASSERT_TRUE(LoadCoordinatorConfigFile(path, &c).ok());
  EXPECT_EQ(c.listen, "127.0.0.1:7070");
  EXPECT_EQ(c.worker_timeout_ms, 10000);
}

TEST_F(ProcessConfigTest, CoordinatorUnknownKeyWithHint) {
  std::string path = Write("coordinator.yaml", "worker_timout_ms: 5000\n");
  CoordinatorConfig c;
  absl::Status s = LoadCoordinatorConfigFile(path, &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(path,
                                                  ": worker_timout_ms: unknown field (did you mean "
                                                  "'worker_timeout_ms'?)")));
}

TEST_F(ProcessConfigTest, CoordinatorUnknownKeyWithoutHint) {
  std::string path = Write("coordinator.yaml", "grpc_threads: 4\n");
  CoordinatorConfig c;
  absl::Status s = LoadCoordinatorConfigFile(path, &c);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(path, ": grpc_threads: unknown field")));
  EXPECT_THAT(s.message(), Not(HasSubstr("did you mean")));
}

TEST_F(ProcessConfigTest, CoordinatorStringForInteger) {
  std::string path = Write("coordinator.yaml", "worker_timeout_ms: soon\n");
  CoordinatorConfig c;
  absl::Status s = LoadCoordinatorConfigFile(path, &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat(path, ": worker_timeout_ms: must be an integer, got 'soon'")));
  EXPECT_EQ(c.worker_timeout_ms, 10000);
}

TEST_F(ProcessConfigTest, CoordinatorListForString) {
  std::string path = Write("coordinator.yaml", "listen: [a, b]\n");
  CoordinatorConfig c;
  EXPECT_THAT(LoadCoordinatorConfigFile(path, &c).message(),
              HasSubstr(absl::StrCat(path, ": listen: must be a string, got a list")));
}

TEST_F(ProcessConfigTest, CoordinatorMappingForString) {
  std::string path = Write("coordinator.yaml", "log_level: {level: info}\n");
  CoordinatorConfig c;
  EXPECT_THAT(LoadCoordinatorConfigFile(path, &c).message(),
              HasSubstr(absl::StrCat(path, ": log_level: must be a string, got a mapping")));
}

TEST_F(ProcessConfigTest, CoordinatorReportsEveryErrorAtOnce) {
  std::string path = Write("coordinator.yaml",
                           "heartbeat_interval_ms: 1.5\n"
                           "state_dir: [x]\n"
                           "metrics: 127.0.0.1:9470\n");
  CoordinatorConfig c;
  EXPECT_THAT(LoadCoordinatorConfigFile(path, &c).message(),
              AllOf(HasSubstr("heartbeat_interval_ms: must be an integer, got '1.5'"),
                    HasSubstr("state_dir: must be a string, got a list"),
                    HasSubstr("metrics: unknown field")));
}

TEST_F(ProcessConfigTest, CoordinatorDocumentNotAMapping) {
  std::string path = Write("coordinator.yaml", "- listen\n");
  CoordinatorConfig c;
  EXPECT_THAT(
      LoadCoordinatorConfigFile(path, &c).message(),
      HasSubstr(absl::StrCat(path, ": (document): must be a mapping of fields, got a list")));
}

TEST_F(ProcessConfigTest, CoordinatorMalformedYamlNamesLineAndColumn) {
  std::string path = Write("coordinator.yaml", "listen: 127.0.0.1:7070\n  bad: indent\n");
  CoordinatorConfig c;
  absl::Status s = LoadCoordinatorConfigFile(path, &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(path, ":2:6: malformed YAML")));
}

TEST_F(ProcessConfigTest, CoordinatorMissingFile) {
  std::string path = (fs::path(dir_) / "missing.yaml").string();
  CoordinatorConfig c;
  absl::Status s = LoadCoordinatorConfigFile(path, &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(path, ": cannot open config file")));
}

// ---------------------------------------------------------------------------------------------
// LoadWorkerConfigFile

TEST_F(ProcessConfigTest, WorkerFileSetsFieldsAndKeepsOthers) {
  std::string path = Write("worker.yaml",
                           "role: drafter\n"
                           "coordinator: coord.example:7070\n"
                           "gpu: 3\n"
                           "name: drafter-a\n"
                           "profile_steps: \"5:3\"\n");
  WorkerConfig w;
  ASSERT_TRUE(LoadWorkerConfigFile(path, &w).ok());
  EXPECT_EQ(w.profile_steps, "5:3");
  EXPECT_EQ(w.role, "drafter");
  EXPECT_EQ(w.coordinator, "coord.example:7070");
  EXPECT_EQ(w.gpu, 3);
  EXPECT_EQ(w.name, "drafter-a");
  EXPECT_EQ(w.listen, "127.0.0.1:0");
  EXPECT_EQ(w.advertise_host, "127.0.0.1");
  EXPECT_EQ(w.log_level, "info");
  EXPECT_TRUE(ValidateWorkerConfig(w).ok());
}

TEST_F(ProcessConfigTest, WorkerUnknownKeyWithHint) {
  std::string path = Write("worker.yaml", "role: target\ngpus: 2\n");
  WorkerConfig w;
  absl::Status s = LoadWorkerConfigFile(path, &w);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat(path, ": gpus: unknown field (did you mean 'gpu'?)")));
}

TEST_F(ProcessConfigTest, WorkerStringForInteger) {
  std::string path = Write("worker.yaml", "gpu: first\n");
  WorkerConfig w;
  EXPECT_THAT(LoadWorkerConfigFile(path, &w).message(),
              HasSubstr(absl::StrCat(path, ": gpu: must be an integer, got 'first'")));
  EXPECT_EQ(w.gpu, -1);
}

TEST_F(ProcessConfigTest, WorkerListForString) {
  std::string path = Write("worker.yaml", "role: [target]\n");
  WorkerConfig w;
  EXPECT_THAT(LoadWorkerConfigFile(path, &w).message(),
              HasSubstr(absl::StrCat(path, ": role: must be a string, got a list")));
}

TEST_F(ProcessConfigTest, WorkerMissingFile) {
  WorkerConfig w;
  absl::Status s = LoadWorkerConfigFile((fs::path(dir_) / "nope.yaml").string(), &w);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("nope.yaml: cannot open config file"));
}

// ---------------------------------------------------------------------------------------------
// ValidateCoordinatorConfig

TEST(ValidateProcessConfigTest, UmaskIsAnOctalModeAndDefaultsToPrivate) {
  CoordinatorConfig c;
  WorkerConfig w;
  w.role = "target";
  EXPECT_EQ(c.umask, "077");
  EXPECT_EQ(w.umask, "077");
  for (const char* bad : {"", "8", "0778", "1777", "abc"}) {
    c.umask = w.umask = bad;
    absl::Status s = ValidateCoordinatorConfig(c);
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("umask: must be an octal mode"))
        << bad;
    EXPECT_FALSE(ValidateWorkerConfig(w).ok()) << bad;
  }
  c.umask = "022";
  EXPECT_TRUE(ValidateCoordinatorConfig(c).ok());
}

TEST(ValidateCoordinatorConfigTest, DefaultsAreValid) {
  EXPECT_TRUE(ValidateCoordinatorConfig(CoordinatorConfig{}).ok());
}

TEST(ValidateCoordinatorConfigTest, HeartbeatMoreThanHalfTheTimeoutIsRejected) {
  CoordinatorConfig c;
  c.worker_timeout_ms = 10000;
  c.heartbeat_interval_ms = 6000;
  absl::Status s = ValidateCoordinatorConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("heartbeat_interval_ms: must be at most half of worker_timeout_ms (10000) "
                        "so one lost heartbeat does not mark a worker down, got 6000"));
}

TEST(ValidateCoordinatorConfigTest, HeartbeatExactlyHalfTheTimeoutIsAccepted) {
  CoordinatorConfig c;
  c.worker_timeout_ms = 10000;
  c.heartbeat_interval_ms = 5000;
  EXPECT_TRUE(ValidateCoordinatorConfig(c).ok());
}

TEST(ValidateCoordinatorConfigTest, ListenWithoutPort) {
  CoordinatorConfig c;
  c.listen = "localhost";
  EXPECT_THAT(
      ValidateCoordinatorConfig(c).message(),
      HasSubstr("listen: must be host:port (e.g. 127.0.0.1:7070 or [::1]:7070), got 'localhost'"));
}

TEST(ValidateCoordinatorConfigTest, ListenPortOutOfRange) {
  CoordinatorConfig c;
  c.listen = "127.0.0.1:99999";
  EXPECT_THAT(ValidateCoordinatorConfig(c).message(),
              HasSubstr("listen: port must be an integer in [0, 65535], got '127.0.0.1:99999'"));
}

TEST(ValidateCoordinatorConfigTest, MetricsListenWithoutHost) {
  CoordinatorConfig c;
  c.metrics_listen = ":9470";
  EXPECT_THAT(
      ValidateCoordinatorConfig(c).message(),
      HasSubstr(
          "metrics_listen: must be host:port (e.g. 127.0.0.1:7070 or [::1]:7070), got ':9470'"));
}

TEST(ValidateCoordinatorConfigTest, RangesAndEnums) {
  CoordinatorConfig c;
  c.state_dir = "";
  c.worker_timeout_ms = 50;
  c.heartbeat_interval_ms = 5;
  c.worker_rpc_timeout_ms = 0;
  c.log_level = "verbose";
  absl::Status s = ValidateCoordinatorConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      s.message(),
      AllOf(HasSubstr("state_dir: must not be empty"),
            HasSubstr("worker_timeout_ms: must be >= 100, got 50"),
            HasSubstr("heartbeat_interval_ms: must be >= 10, got 5"),
            HasSubstr("worker_rpc_timeout_ms: must be >= 100, got 0"),
            HasSubstr("log_level: must be one of debug|info|warning|error, got 'verbose'")));
}

TEST_F(ProcessConfigTest, LoadedHeartbeatIsRejectedByValidation) {
  std::string path = Write("coordinator.yaml",
                           "worker_timeout_ms: 3000\n"
                           "heartbeat_interval_ms: 2000\n");
  CoordinatorConfig c;
  ASSERT_TRUE(LoadCoordinatorConfigFile(path, &c).ok());
  EXPECT_THAT(ValidateCoordinatorConfig(c).message(),
              HasSubstr("heartbeat_interval_ms: must be at most half of worker_timeout_ms (3000)"));
}

// ---------------------------------------------------------------------------------------------
// ValidateWorkerConfig

WorkerConfig ValidWorker() {
  WorkerConfig w;
  w.role = "target";
  w.gpu = 0;
  return w;
}

TEST(ValidateWorkerConfigTest, ValidRolesAndGpus) {
  EXPECT_TRUE(ValidateWorkerConfig(ValidWorker()).ok());
  WorkerConfig cpu_drafter = ValidWorker();
  cpu_drafter.role = "drafter";
  cpu_drafter.gpu = -1;
  EXPECT_TRUE(ValidateWorkerConfig(cpu_drafter).ok());
  WorkerConfig last_gpu = ValidWorker();
  last_gpu.gpu = 1023;
  EXPECT_TRUE(ValidateWorkerConfig(last_gpu).ok());
}

TEST(ValidateWorkerConfigTest, MissingRole) {
  absl::Status s = ValidateWorkerConfig(WorkerConfig{});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("role: required field is missing (target or drafter)"));
}

TEST(ValidateWorkerConfigTest, BadRole) {
  WorkerConfig w = ValidWorker();
  w.role = "trainer";
  EXPECT_THAT(ValidateWorkerConfig(w).message(),
              HasSubstr("role: must be one of target|drafter, got 'trainer'"));
}

TEST(ValidateWorkerConfigTest, GpuBelowMinusOne) {
  WorkerConfig w = ValidWorker();
  w.gpu = -2;
  EXPECT_THAT(ValidateWorkerConfig(w).message(), HasSubstr("gpu: must be >= -1, got -2"));
}

TEST(ValidateWorkerConfigTest, ProfileStepsIsFirstColonCount) {
  absl::StatusOr<ProfileSteps> p = ParseProfileSteps("5:3");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->first, 5);
  EXPECT_EQ(p->count, 3);
  EXPECT_FALSE(p->Covers(4));
  EXPECT_TRUE(p->Covers(5));
  EXPECT_TRUE(p->Covers(7));
  EXPECT_FALSE(p->Covers(8));
  absl::StatusOr<ProfileSteps> off = ParseProfileSteps("");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->Covers(0));
  WorkerConfig w = ValidWorker();
  w.profile_steps = "5:3";
  EXPECT_TRUE(ValidateWorkerConfig(w).ok());
  for (const char* bad : {"5", "5:", ":3", "a:3", "5:3:1", "-1:3", "5:0", "5:1001"}) {
    w.profile_steps = bad;
    EXPECT_THAT(ValidateWorkerConfig(w).message(), HasSubstr("profile_steps: ")) << bad;
  }
  w.profile_steps = "5:3";
  w.gpu = -1;
  EXPECT_THAT(ValidateWorkerConfig(w).message(),
              HasSubstr("profile_steps: profiles device kernels; this worker has no GPU"));
}

TEST(ValidateWorkerConfigTest, GpuTooHigh) {
  WorkerConfig w = ValidWorker();
  w.gpu = 1024;
  EXPECT_THAT(ValidateWorkerConfig(w).message(), HasSubstr("gpu: must be <= 1023, got 1024"));
}

TEST(ValidateWorkerConfigTest, AddressesAndHost) {
  WorkerConfig w = ValidWorker();
  w.coordinator = "nowhere";
  w.listen = "0.0.0.0:-1";
  w.metrics_listen = "0.0.0.0:http";
  w.advertise_host = "";
  w.log_level = "trace";
  EXPECT_THAT(
      ValidateWorkerConfig(w).message(),
      AllOf(
          HasSubstr(
              "coordinator: must be host:port (e.g. 127.0.0.1:7070 or [::1]:7070), got 'nowhere'"),
          HasSubstr("listen: port must be an integer in [0, 65535], got '0.0.0.0:-1'"),
          HasSubstr("metrics_listen: port must be an integer in [0, 65535], got '0.0.0.0:http'"),
          HasSubstr("advertise_host: must not be empty"),
          HasSubstr("log_level: must be one of debug|info|warning|error, got 'trace'")));
}

// ---------------------------------------------------------------------------------------------
// ParseHostPort

TEST(ParseHostPortTest, ValidAddresses) {
  auto p = ParseHostPort("127.0.0.1:7070");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, 7070);
  p = ParseHostPort("localhost:0");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, 0);
  p = ParseHostPort("coord.example.com:65535");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, 65535);
  p = ParseHostPort("[::1]:8080");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, 8080);
}

TEST(ParseHostPortTest, MissingColonOrHost) {
  for (const std::string address : {"", "localhost", ":7070"}) {
    auto p = ParseHostPort(address);
    ASSERT_FALSE(p.ok()) << address;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(p.status().message(),
                HasSubstr(absl::StrCat(
                    "must be host:port (e.g. 127.0.0.1:7070 or [::1]:7070), got '", address, "'")));
  }
}

TEST(ParseHostPortTest, BadPort) {
  for (const std::string address :
       {"host:", "host:65536", "host:-1", "host:http", "host:80x", "host:99999999999"}) {
    auto p = ParseHostPort(address);
    ASSERT_FALSE(p.ok()) << address;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(
        p.status().message(),
        HasSubstr(absl::StrCat("port must be an integer in [0, 65535], got '", address, "'")));
  }
}

TEST(ParseHostPortStrictTest, RefusesAmbiguousHostsAndLoosePorts) {
  for (const char* bad : {"::1", "host: 80", "host:+80", "host:123456", "host:"}) {
    EXPECT_FALSE(ParseHostPort(bad).ok()) << bad;
  }
  EXPECT_EQ(*ParseHostPort("[::1]:7070"), 7070);
  EXPECT_EQ(*ParseHostPort("0.0.0.0:0"), 0);
}

TEST(ValidateCoordinatorConfigStrictTest, HugeValuesDoNotOverflowTheCrossCheck) {
  CoordinatorConfig c;
  c.heartbeat_interval_ms = INT64_MAX;
  absl::Status s = ValidateCoordinatorConfig(c);
  EXPECT_THAT(std::string(s.message()), HasSubstr("heartbeat_interval_ms: must be <= 600000"));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("at most half")));
}

}  // namespace
}  // namespace dflash::config

namespace dflash::config {
namespace {

// The tls block: read from both files, the combination checked naming the field.
TEST_F(ProcessConfigTest, TlsBlockIsReadStrictly) {
  CoordinatorConfig c;
  ASSERT_TRUE(
      LoadCoordinatorConfigFile(
          Write("c.yaml",
                "tls: {cert_file: c.crt, key_file: c.key, ca_file: ca.crt, mutual: true}\n"),
          &c)
          .ok());
  EXPECT_EQ(c.tls.cert_file, "c.crt");
  EXPECT_EQ(c.tls.key_file, "c.key");
  EXPECT_EQ(c.tls.ca_file, "ca.crt");
  EXPECT_TRUE(c.tls.mutual);
  EXPECT_TRUE(ValidateCoordinatorConfig(c).ok());
  WorkerConfig w;
  absl::Status s = LoadWorkerConfigFile(Write("w.yaml", "tls: {cert: w.crt}\n"), &w);
  EXPECT_THAT(std::string(s.message()), HasSubstr("tls.cert"));
  ASSERT_TRUE(
      LoadWorkerConfigFile(Write("w2.yaml", "role: target\ntls: {ca_file: ca.crt}\n"), &w).ok());
  EXPECT_THAT(std::string(ValidateWorkerConfig(w).message()),
              HasSubstr("tls.cert_file: required with tls.ca_file"));
}

TEST(ValidateProcessConfigTest, TlsCombinations) {
  CoordinatorConfig c;
  c.tls.cert_file = "c.crt";
  EXPECT_THAT(std::string(ValidateCoordinatorConfig(c).message()),
              HasSubstr("tls.key_file: a certificate and its key go together"));
  c.tls.key_file = "c.key";
  EXPECT_TRUE(ValidateCoordinatorConfig(c).ok());  // TLS without client certificates
  c.tls.mutual = true;
  EXPECT_THAT(std::string(ValidateCoordinatorConfig(c).message()),
              HasSubstr("tls.ca_file: required by tls.mutual"));
  c.tls = {};
  c.tls.ca_file = "ca.crt";
  EXPECT_THAT(std::string(ValidateCoordinatorConfig(c).message()),
              HasSubstr("tls.cert_file: required with tls.ca_file"));
  WorkerConfig w;
  w.role = "drafter";
  w.tls.mutual = true;
  w.tls.ca_file = "ca.crt";
  const std::string m(ValidateWorkerConfig(w).message());
  EXPECT_THAT(m, HasSubstr("tls.cert_file: required by tls.mutual"));
  w.tls.cert_file = "w.crt";
  w.tls.key_file = "w.key";
  EXPECT_TRUE(ValidateWorkerConfig(w).ok());
}

// ---------------------------------------------------------------------------------------------
// require_auth (the Kubernetes manifests' setting) and secret files' modes

TEST_F(ProcessConfigTest, RequireAuthNeedsATokenAndTlsOffLoopback) {
  CoordinatorConfig c;
  c.require_auth = true;
  c.listen = "0.0.0.0:7070";
  absl::Status s = ValidateCoordinatorConfig(c);
  EXPECT_THAT(s.message(), HasSubstr("auth_token_file: required by require_auth"));
  EXPECT_THAT(s.message(), HasSubstr("listen: '0.0.0.0:7070' accepts connections from the "
                                     "network and tls is not configured"));
  c.auth_token_file = Write("token", "t\n");
  EXPECT_THAT(ValidateCoordinatorConfig(c).message(), HasSubstr("set tls.cert_file"));
  for (const char* loopback : {"127.0.0.1:7070", "localhost:0", "[::1]:7070"}) {
    c.listen = loopback;
    EXPECT_TRUE(ValidateCoordinatorConfig(c).ok()) << loopback;
  }
  // Off loopback with TLS configured (the certificate and key are read when the process starts).
  c.listen = "0.0.0.0:7070";
  c.tls.cert_file = Write("c.crt", "x");
  c.tls.key_file = Write("c.key", "x");
  EXPECT_THAT(ValidateCoordinatorConfig(c).message(), Not(HasSubstr("listen:")));
  // Read from the file as the manifests write it.
  CoordinatorConfig f;
  ASSERT_TRUE(LoadCoordinatorConfigFile(Write("c.yaml", "require_auth: true\n"), &f).ok());
  EXPECT_TRUE(f.require_auth);
}

TEST_F(ProcessConfigTest, SecretFilesMayBeReadByTheProcesssOwnGroupOnly) {
  const std::string path = Write("secret", "s3cret\n");
  auto mode = [&](fs::perms p) { fs::permissions(path, p, fs::perm_options::replace); };
  using P = fs::perms;
  mode(P::owner_read | P::owner_write);
  EXPECT_TRUE(ReadSecretFile(path, "token file").ok());
  // 0440 with this process's group: how Kubernetes mounts a Secret for the pod's fsGroup.
  ASSERT_EQ(::chown(path.c_str(), static_cast<uid_t>(-1), ::getegid()), 0);
  mode(P::owner_read | P::group_read);
  EXPECT_TRUE(ReadSecretFile(path, "token file").ok());
  for (P open : {P::owner_read | P::others_read, P::owner_read | P::group_read | P::group_write}) {
    mode(open);
    EXPECT_THAT(ReadSecretFile(path, "token file").status().message(),
                HasSubstr("readable by others; chmod 600"));
  }
  // Group-readable by another group: refused (only root can hand the file to another group).
  if (::geteuid() == 0) {
    const gid_t other = ::getegid() == 1 ? 2 : 1;
    ASSERT_EQ(::chown(path.c_str(), static_cast<uid_t>(-1), other), 0);
    mode(P::owner_read | P::group_read);
    EXPECT_THAT(ReadSecretFile(path, "token file").status().message(),
                HasSubstr("readable by others; chmod 600"));
  }
}

}  // namespace
}  // namespace dflash::config

namespace dflash::config {
namespace {

// The Kubernetes manifests ship the coordinator's config with require_auth and a network
// listener: as shipped (no TLS yet) it must refuse to start, naming listen; with TLS added and
// the token file mounted it passes.
TEST_F(ProcessConfigTest, TheKubernetesCoordinatorConfigRefusesToRunOpen) {
  const YAML::Node map =
      YAML::LoadFile(std::string(DFLASH_SOURCE_DIR) + "/deploy/k8s/configmap.yaml");
  ASSERT_TRUE(map["data"]["coordinator.yaml"]) << "configmap.yaml lost its coordinator.yaml";
  CoordinatorConfig c;
  ASSERT_TRUE(LoadCoordinatorConfigFile(
                  Write("coordinator.yaml", map["data"]["coordinator.yaml"].as<std::string>()), &c)
                  .ok());
  EXPECT_TRUE(c.require_auth);
  EXPECT_EQ(c.auth_token_file, "/etc/dflash-auth/token");
  c.state_dir = dir_;
  absl::Status shipped = ValidateCoordinatorConfig(c);
  EXPECT_THAT(shipped.message(), HasSubstr("listen: '0.0.0.0:7070' accepts connections"));
  c.tls.cert_file = "/etc/dflash-tls/coordinator.crt";
  c.tls.key_file = "/etc/dflash-tls/coordinator.key";
  EXPECT_THAT(ValidateCoordinatorConfig(c).message(), Not(HasSubstr("listen")));
}

}  // namespace
}  // namespace dflash::config
