// The target worker's speculative-decoding evaluation: plain C++ structs (no protobuf,
// no LibTorch), converted from EvaluateRequest by WorkerCore, like step_runner.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/run_spec.h"

namespace dflash::worker {

// This worker's rank of a tensor-parallel target's decoding group (v1::DecodeGroup): world 1 is
// the whole target on this worker.
struct DecodeGroupWork {
  int rank = 0, world = 1;
  std::string collective;      // host | nccl
  std::string name;            // host: the shared-memory name
  std::string nccl_unique_id;  // nccl: made by rank 0's OpenDecodeGroup
};

struct EvalWork {
  config::RunSpec spec;  // its target decodes
  int gpu = -1;          // the worker's device, -1 for the CPU
  std::string drafter_dir;
  std::vector<std::vector<int64_t>> prompts;
  int64_t max_new_tokens = 256;
  std::vector<int64_t> stop_token_ids;
  int64_t batch_size = 0;  // 0: all prompts together
  std::string run_id;      // log lines
  int64_t step = -1;
  bool measure_baseline = false;  // also time plain greedy decoding of the same prompts
  DecodeGroupWork group;
};

// One context-length bucket of an evaluation (common/spec AcceptanceStats::by_context).
struct EvalContextCounts {
  int64_t min_tokens = 0, max_tokens = 0;  // max 0: no upper bound
  int64_t verifications = 0, accepted = 0, emitted = 0;
  std::vector<int64_t> accepted_at;
};

struct EvalReport {
  int64_t prompts = 0, new_tokens = 0, verifications = 0, accepted = 0, block_size = 0;
  std::vector<int64_t> accepted_at;
  // The reference package's view (common/spec AcceptanceStats): tokens emitted by verifications,
  // verifications by tokens emitted (0..B), prompts verified and the sum of their taus.
  int64_t emitted = 0, prompts_verified = 0;
  std::vector<int64_t> emitted_histogram;
  double prompt_tau_sum = 0;
  double seconds = 0, load_seconds = 0;
  double baseline_seconds = 0;
  int64_t baseline_tokens = 0;
  int64_t baseline_identical = 0;  // prompts decoded alike by both (measure_baseline)
  std::vector<EvalContextCounts> by_context;
  double temperature = 0, top_p = 1;  // the decoding applied (0: greedy)
  int64_t top_k = 0, seed = 0;
};

struct GenerateWork {
  config::RunSpec spec;  // its target generates
  int gpu = -1;
  std::vector<std::vector<int64_t>> prompts;
  std::vector<int64_t> max_new_tokens;  // per prompt
  std::vector<int64_t> stop_token_ids;
  double temperature = 0, top_p = 1;
  int64_t top_k = 0;
  double repetition_penalty = 1;
  uint64_t seed = 0;
  int64_t max_batch = 0;  // sequences decoded together; 0: all
  DecodeGroupWork group;
};

struct GenerateReport {
  std::vector<std::vector<int64_t>> outputs;
  std::vector<bool> stopped;
  double seconds = 0;
};

// The target worker's decoding work outside training steps; keeps the full target loaded between
// calls for the same target, dtype and device.
class Evaluator {
 public:
  virtual ~Evaluator() = default;
  virtual absl::StatusOr<EvalReport> Evaluate(const EvalWork& work) = 0;
  virtual absl::StatusOr<GenerateReport> Generate(const GenerateWork& work) = 0;
  // Rank 0 of a decoding group on `collective` nccl: a fresh NCCL unique id (its bootstrap root
  // lives in this process until the group has formed), for every rank's Evaluate or Generate.
  virtual absl::StatusOr<std::string> OpenDecodeGroup(const std::string& collective, int gpu) {
    return absl::UnimplementedError("this worker does not decode in groups");
  }
};

using EvaluatorFactory = std::function<std::unique_ptr<Evaluator>()>;

// The target worker's evaluator (LibTorch); a worker built without LibTorch answers UNIMPLEMENTED.
std::unique_ptr<Evaluator> NewTargetEvaluator();

}  // namespace dflash::worker
