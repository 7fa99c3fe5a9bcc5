// dflashctl subcommands. Each returns a process exit code (see ExitCode).
#pragma once

#include <grpcpp/security/credentials.h>

#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include "common/config/run_spec.h"
#include "dflash/v1/coordinator.grpc.pb.h"

namespace dflash::ctl {

// Distinct exit codes so scripts can tell failures apart (documented in docs/cli.md).
enum ExitCode : int {
  kOk = 0,
  kError = 1,          // any other error (run not found, server-side failure)
  kUsage = 2,          // bad command line
  kInvalidConfig = 3,  // run.yaml rejected (locally or by the coordinator)
  kUnreachable = 4,    // coordinator cannot be reached
  kRunFailed = 5,      // a followed run ended failed or cancelled
  kBadData = 6,        // prepare: the data was refused (on_bad_record: fail, wrong tokenizer...)
  kDoesNotFit = 7,     // plan: a worker's predicted memory exceeds its GPU (submit refuses it)
};

// Reads and validates a run.yaml here (as submit, plan and plan --local do), relative paths
// against its folder and every path checked, so that the user sees every problem before anything
// is sent; the spec, or nullopt after printing why not on `err`.
std::optional<config::RunSpec> ParseLocally(const std::string& path, std::ostream& err);

struct GlobalOptions {
  std::string coordinator;  // host:port
  bool json = false;        // --output json
  int64_t timeout_ms = 10000;
  std::string token;  // bearer token for a coordinator that requires one (--token_file)
  std::shared_ptr<grpc::ChannelCredentials> creds;  // TLS (--tls_ca_file); null = plaintext
};

struct EvalArgs {
  std::string run_yaml;  // target and data settings; "" = --target with default data settings
  std::string target;    // overrides target.path
  std::string drafter;   // exported drafter directory
  std::string prompts;   // overrides eval.prompts
  int64_t max_new_tokens = 0, max_prompts = 0;  // 0 = eval.* of the run.yaml (or its default)
  int64_t batch_size = 0;                       // prompts decoded together; 0 = all
  // Override eval.temperature, eval.top_p, eval.top_k, eval.seed of the run.yaml when given.
  std::optional<double> temperature, top_p;
  std::optional<int64_t> top_k, seed;
};

struct RegenArgs {
  std::string run_yaml;  // target and data settings ("" = --target and --input)
  std::string target, input, out;
  int64_t max_new_tokens = 0, max_records = 0, top_k = 0, batch_size = 0;
  double temperature = 0, top_p = 0, repetition_penalty = 0;
  uint64_t seed = 0;
  bool generation_config = false;  // sample as the target's generation_config.json says
};

class Commands {
 public:
  explicit Commands(GlobalOptions opts);
  int Submit(const std::string& path, bool detach, bool dry_run);
  int Status(const std::string& run_id);
  int List();
  int Cancel(const std::string& run_id);
  int Workers();
  int Plan(const std::string& path, bool largest = false);
  // The acceptance length of a drafter by speculative decoding on an idle target worker.
  int Eval(const EvalArgs& args);
  // Regenerates a data set's answers with the target workers (resumable).
  int Regen(const RegenArgs& args);
  // Copies a finished run's serving-format drafter (<run dir>/export) to `out`.
  // best: the snapshot of the run's best held-out evaluation rather than its final export.
  int Export(const std::string& run_id, const std::string& out, bool force, bool best);

 private:
  int Follow(const std::string& run_id);
  // One GetRun with the request deadline.
  grpc::Status GetRun(const std::string& run_id, v1::RunStatus* run);
  // Maps an RPC failure to an exit code and prints it.
  int RpcError(const grpc::Status& s, const std::string& what);

  GlobalOptions opts_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

}  // namespace dflash::ctl
