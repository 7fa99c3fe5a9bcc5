// gRPC over TLS and mutual TLS between the real processes: a drafter trains over TLS;
// plaintext clients, clients trusting another CA, workers without a certificate and callers of a
// worker's control port without the coordinator's certificate are all refused; a private key
// readable by others stops the process at start.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dflash/v1/registry.grpc.pb.h"
#include "dflash/v1/worker.grpc.pb.h"
#include "tests/integration/cluster.h"

namespace dflash::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
using ms = std::chrono::milliseconds;

std::string Pem(const std::string& path) { return ReadFile(path); }

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    certs_ = dir_ + "/certs";
    rogue_ = dir_ + "/rogue";
    // The project's own script (scripts/make-dev-certs.sh): a CA and certificates for loopback.
    for (const std::string& d : {certs_, rogue_}) {
      const std::string cmd = std::string(DFLASH_SOURCE_DIR) + "/scripts/make-dev-certs.sh " + d +
                              " 127.0.0.1 >" + dir_ + "/certs.log 2>&1";
      ASSERT_EQ(std::system(cmd.c_str()), 0) << ReadFile(dir_ + "/certs.log");
    }
  }
  void TearDown() override {
    workers_.clear();
    coordinator_.reset();
    if (!HasFailure())
      std::filesystem::remove_all(dir_);
    else
      std::cerr << "logs kept in " << dir_ << "\n";
  }

  std::vector<std::string> Tls(const std::string& who, const std::string& ca_dir,
                               bool mutual) const {
    std::vector<std::string> a = {"--tls_cert_file", certs_ + "/" + who + ".crt",
                                  "--tls_key_file",  certs_ + "/" + who + ".key",
                                  "--tls_ca_file",   ca_dir + "/ca.crt"};
    if (mutual) a.push_back("--tls_mutual");
    return a;
  }

  void StartCoordinator(const std::vector<std::string>& tls) {
    const std::string ready = dir_ + "/coordinator.ready";
    std::vector<std::string> args = {"--listen",
                                     "127.0.0.1:0",
                                     "--metrics_listen",
                                     "127.0.0.1:0",
                                     "--state_dir",
                                     dir_ + "/state",
                                     "--heartbeat_interval_ms",
                                     "100",
                                     "--worker_timeout_ms",
                                     "1000",
                                     "--ready_file",
                                     ready};
    args.insert(args.end(), tls.begin(), tls.end());
    coordinator_ = std::make_unique<Process>(BinDir() + "/coordinator/dflash-coordinator", args,
                                             dir_ + "/coordinator.log");
    const int port = ReadReadyPort(ready, "grpc_port", ms(20000));
    ASSERT_GT(port, 0) << ReadFile(dir_ + "/coordinator.log");
    address_ = "127.0.0.1:" + std::to_string(port);
  }

  // Starts a worker; returns its control port (0 if it did not come up).
  int StartWorker(const std::string& role, const std::string& name,
                  const std::vector<std::string>& tls) {
    const std::string ready = dir_ + "/" + name + ".ready";
    std::vector<std::string> args = {"--coordinator", address_, "--name", name,
                                     "--ready_file",  ready};
    args.insert(args.end(), tls.begin(), tls.end());
    workers_.push_back(
        std::make_unique<Process>(BinDir() + "/" + role + "_worker/dflash-" + role + "-worker",
                                  args, dir_ + "/" + name + ".log"));
    return ReadReadyPort(ready, "grpc_port", ms(30000));
  }

  CtlResult Ctl(std::vector<std::string> args, bool with_ca = true) {
    if (with_ca) {
      args.insert(args.begin(), {"--tls_ca_file", certs_ + "/ca.crt"});
    }
    return RunCtl(address_, args);
  }

  size_t RegisteredWorkers() {
    CtlResult r = Ctl({"workers", "-o", "json"});
    return r.exit_code == 0 ? json::parse(r.out).value("workers", json::array()).size() : 0;
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& address, const std::string& ca,
                                         const std::string& cert_prefix) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = Pem(ca);
    if (!cert_prefix.empty()) {
      o.pem_cert_chain = Pem(cert_prefix + ".crt");
      o.pem_private_key = Pem(cert_prefix + ".key");
    }
    return grpc::CreateChannel(address, grpc::SslCredentials(o));
  }

  std::string dir_, certs_, rogue_, address_;
  std::unique_ptr<Process> coordinator_;
  std::vector<std::unique_ptr<Process>> workers_;
};

TEST_F(TlsTest, MutualTlsTrainsAndRefusesEveryoneElse) {
  StartCoordinator(Tls("coordinator", certs_, /*mutual=*/true));
  EXPECT_THAT(ReadFile(dir_ + "/coordinator.log"), HasSubstr("serving gRPC (mutual TLS)"));
  const int t0 = StartWorker("target", "t0", Tls("worker", certs_, true));
  ASSERT_GT(t0, 0) << ReadFile(dir_ + "/t0.log");
  ASSERT_GT(StartWorker("drafter", "d0", Tls("worker", certs_, true)), 0)
      << ReadFile(dir_ + "/d0.log");
  ASSERT_TRUE(WaitFor([&] { return RegisteredWorkers() == 2; }, ms(10000)))
      << ReadFile(dir_ + "/t0.log");

  // A short run end to end: the coordinator dials both workers' control ports over mutual TLS.
  const std::string run_yaml = dir_ + "/run.yaml";
  std::ofstream(run_yaml) << "name: tls\nseed: 1\n"
                             "target: {path: \"builtin:tiny-qwen3\", dtype: float32}\n"
                             "drafter: {layers: 1, block_size: 8}\n"
                             "data: {train: \"builtin:tiny-chat\", max_length: 256}\n"
                             "batching: {token_budget: 512, max_anchors: 32}\n"
                             "optim: {max_steps: 3}\n"
                             "placement: {pairs: 1, transport: host}\n";
  CtlResult run = Ctl({"submit", run_yaml});
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err << ReadFile(dir_ + "/coordinator.log");
  EXPECT_THAT(run.out, HasSubstr("running -> done: trained 3 steps"));

  // dflashctl in plaintext, or trusting another CA, does not reach it.
  CtlResult plain = Ctl({"list"}, /*with_ca=*/false);
  EXPECT_EQ(plain.exit_code, 4) << plain.err;
  CtlResult rogue = RunCtl(address_, {"--tls_ca_file", rogue_ + "/ca.crt", "list"});
  EXPECT_EQ(rogue.exit_code, 4) << rogue.err;

  // The registry: TLS without a client certificate is refused by tls.mutual; a certificate from
  // another CA fails the handshake.
  {
    auto stub = v1::Registry::NewStub(Channel(address_, certs_ + "/ca.crt", ""));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::RegisterRequest req;
    req.mutable_worker()->set_name("intruder");
    v1::RegisterResponse resp;
    grpc::Status s = stub->Register(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("tls.mutual"));
  }
  {
    auto stub = v1::Registry::NewStub(Channel(address_, certs_ + "/ca.crt", rogue_ + "/worker"));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::RegisterRequest req;
    v1::RegisterResponse resp;
    EXPECT_EQ(stub->Register(&ctx, req, &resp).error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  // A worker whose certificate another CA signed never registers.
  StartWorker("target", "t-rogue",
              {"--tls_cert_file", rogue_ + "/worker.crt", "--tls_key_file", rogue_ + "/worker.key",
               "--tls_ca_file", certs_ + "/ca.crt"});
  EXPECT_TRUE(WaitFor(
      [&] {
        return ReadFile(dir_ + "/t-rogue.log").find("register with coordinator") !=
               std::string::npos;
      },
      ms(10000)));
  EXPECT_EQ(RegisteredWorkers(), 2u);

  // The worker's control port (tls.mutual) admits only certificates of its CA: the coordinator's.
  const std::string control = "127.0.0.1:" + std::to_string(t0);
  auto status_call = [&](const std::string& cert_prefix) {
    auto stub = v1::TargetWorker::NewStub(Channel(control, certs_ + "/ca.crt", cert_prefix));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::WorkerStatusRequest req;
    v1::WorkerStatusResponse resp;
    return stub->GetStatus(&ctx, req, &resp).error_code();
  };
  EXPECT_EQ(status_call(""), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(status_call(rogue_ + "/coordinator"), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(status_call(certs_ + "/coordinator"), grpc::StatusCode::OK);
}

TEST_F(TlsTest, PlaintextWorkersCannotJoinATlsCoordinator) {
  StartCoordinator(Tls("coordinator", certs_, /*mutual=*/false));
  StartWorker("target", "t0", {});
  EXPECT_TRUE(WaitFor(
      [&] {
        return ReadFile(dir_ + "/t0.log").find("register with coordinator") != std::string::npos;
      },
      ms(10000)));
  EXPECT_EQ(RegisteredWorkers(), 0u);
  // Without tls.mutual a worker with a certificate joins; dflashctl needs only the CA.
  ASSERT_GT(StartWorker("target", "t1", Tls("worker", certs_, false)), 0);
  EXPECT_TRUE(WaitFor([&] { return RegisteredWorkers() == 1; }, ms(10000)))
      << ReadFile(dir_ + "/t1.log");
}

TEST_F(TlsTest, BadTlsSettingsStopTheProcessNamingTheField) {
  auto start = [&](const std::string& binary, std::vector<std::string> args) {
    args.insert(args.begin(), {"--listen", "127.0.0.1:0", "--metrics_listen", "127.0.0.1:0"});
    Process p(BinDir() + binary, args, dir_ + "/bad.log");
    const int code = p.Wait();
    return std::make_pair(code, ReadFile(dir_ + "/bad.log"));
  };
  const std::string coordinator = "/coordinator/dflash-coordinator";
  const std::string state = dir_ + "/state-bad";
  // A private key readable by other users.
  const std::string open_key = dir_ + "/open.key";
  std::filesystem::copy_file(certs_ + "/coordinator.key", open_key);
  std::filesystem::permissions(open_key, std::filesystem::perms::others_read,
                               std::filesystem::perm_options::add);
  auto [code, log] = start(coordinator, {"--state_dir", state, "--tls_cert_file",
                                         certs_ + "/coordinator.crt", "--tls_key_file", open_key});
  EXPECT_EQ(code, 2);
  EXPECT_THAT(log, HasSubstr("tls.key_file: "));
  EXPECT_THAT(log, HasSubstr("readable by others; chmod 600"));
  // A certificate without its key; mutual without a CA; a file that is not PEM.
  std::tie(code, log) =
      start(coordinator, {"--state_dir", state, "--tls_cert_file", certs_ + "/coordinator.crt"});
  EXPECT_EQ(code, 2);
  EXPECT_THAT(log, HasSubstr("tls.key_file"));
  std::tie(code, log) =
      start(coordinator, {"--state_dir", state, "--tls_cert_file", certs_ + "/coordinator.crt",
                          "--tls_key_file", certs_ + "/coordinator.key", "--tls_mutual"});
  EXPECT_EQ(code, 2);
  EXPECT_THAT(log, HasSubstr("tls.ca_file: required by tls.mutual"));
  std::tie(code, log) =
      start(coordinator,
            {"--state_dir", state, "--tls_cert_file", certs_ + "/coordinator.crt", "--tls_key_file",
             certs_ + "/coordinator.key", "--tls_ca_file", certs_ + "/ca.srl"});
  EXPECT_EQ(code, 2);
  EXPECT_THAT(log, HasSubstr("tls.ca_file: "));
  EXPECT_THAT(log, HasSubstr("is not PEM"));
  // A worker that dials a TLS coordinator must serve TLS itself.
  std::tie(code, log) =
      start("/target_worker/dflash-target-worker",
            {"--coordinator", "127.0.0.1:1", "--tls_ca_file", certs_ + "/ca.crt"});
  EXPECT_EQ(code, 2);
  EXPECT_THAT(log, HasSubstr("tls.cert_file: required with tls.ca_file"));
  // dflashctl names its flag.
  CtlResult ctl = RunCtl("127.0.0.1:1", {"--tls_cert_file", certs_ + "/worker.crt", "list"});
  EXPECT_EQ(ctl.exit_code, 2);
  EXPECT_THAT(ctl.err, HasSubstr("--tls_key_file"));
}

}  // namespace
}  // namespace dflash::testing
