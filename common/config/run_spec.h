// run.yaml: the typed, validated, immutable description of one training run.
// The structs hold the values and defaults; common/config/run_fields.h defines each field once
// (reading, checks, emitting, settings echo); docs/run-spec.md documents them (run_fields_test).
// Flow: YAML text -> RunSpec (defaults filled) -> Normalize (paths, auto values) -> Validate.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dflash::config {

struct TargetSpec {
  std::string path;                               // HF checkpoint dir, or builtin:NAME
  std::optional<std::vector<int64_t>> layer_ids;  // nullopt = auto (method.md §2)
  std::string dtype = "bfloat16";                 // bfloat16|float16|float32
};

struct DrafterSpec {
  int64_t layers = 5;
  int64_t block_size = 16;
  std::optional<int64_t> mask_token_id;  // nullopt = auto (tokenizer's mask token)
  std::string init_from;                 // empty = random init
  std::string recompute = "none";        // none|mlp|layers: activations recomputed in backward
  // Sliding-attention layers (method.md §2.1): their indices; nullopt = auto (drafter.init_from's
  // config, else none). sliding_window: their window; 0 with auto = init_from's.
  std::optional<std::vector<int64_t>> sliding_layers;
  int64_t sliding_window = 0;
  // dflash | dflash2 (docs/method.md §2.2). DFlash2's settings, nullopt = auto (their defaults
  // with dflash2; refused when set with dflash).
  std::string kind = "dflash";
  std::optional<int64_t> conv_kernel_size, conv_group_size, selector_rank, selector_top_k;
  // auto | fp8 (docs/method.md §4.1): auto, the layers' projections in target.dtype; fp8, as e4m3
  // GEMMs with rowwise scales (target.dtype bfloat16, a GPU of compute capability 8.9 or later).
  std::string precision = "auto";
};

struct DataSpec {
  std::string train;                   // JSONL file, or builtin:NAME
  std::string format = "chat";         // chat|pretokenized|text
  std::string tokenizer = "auto";      // auto = the target's tokenizer.json
  std::string chat_template = "auto";  // auto|chatml|llama3
  // auto|on|off: the chat template's enable_thinking for prepare, regen and eval (auto: unset)
  std::string thinking = "auto";
  int64_t max_length = 4096;
  std::string long_documents = "truncate";  // truncate|split: documents over max_length
  std::string on_bad_record = "skip";       // skip|fail: malformed or unusable input records
  std::string prepared = "auto";            // prepared data file; auto = beside data.train
};

struct BatchingSpec {
  int64_t token_budget = 8192;
  int64_t max_anchors = 512;
  int64_t grad_accum = 1;
};

struct OptimSpec {
  double lr = 6.0e-4;
  double warmup_ratio = 0.04;
  std::string schedule = "cosine";  // cosine|linear|constant
  double epochs = 6.0;
  int64_t max_steps = 0;  // 0 = derived from epochs
  double clip = 1.0;      // 0 disables clipping
  double weight_decay = 0.0;
  std::vector<double> betas = {0.9, 0.999};
  double eps = 1e-8;
};

struct LossSpec {
  std::optional<double> gamma;      // nullopt = auto from block_size
  std::string weighting = "decay";  // decay|dpace: how a block's slots weigh (docs/method.md)
  double dpace_alpha = 0.5;         // D-PACE's confidence smoothing, (0, 1]
  double selector_alpha = 1.0;      // drafter.kind dflash2: the selector loss's factor
  // drafter.kind dflash2: the selector loss is off for the first warmup steps, then its factor
  // rises linearly to selector_alpha over ramp steps (docs/method.md §2.2); not 0 with dflash:
  // refused.
  int64_t selector_warmup_steps = 0, selector_ramp_steps = 0;
};

struct PlacementSpec {
  std::optional<int64_t> pairs;    // nullopt = auto: every idle pair
  std::string transport = "auto";  // auto|nccl|cuda_ipc|host
  int64_t target_parallel = 1;     // target processes per pair (tensor parallelism)
};

struct CheckpointSpec {
  int64_t every_steps = 1000;
  int64_t keep = 3;
};

struct EvalSpec {
  int64_t every_steps = 0;  // 0 = no evaluation during training
  // Who decodes the evaluations during training: pair (pair 0's target), reserved (a target
  // group of its own, taken at placement), auto (reserved for a tensor-parallel target on GPUs when
  // an idle group is there, else pair).
  std::string worker = "auto";
  std::string prompts;
  int64_t max_new_tokens = 256;
  int64_t max_prompts = 64;  // prompts decoded per evaluation
  // Decoding of every evaluation (docs/method.md §1.1): temperature 0 is greedy; above it, sampled
  // with top_p (1: off), top_k (0: off) and seed.
  double temperature = 0;
  double top_p = 1.0;
  int64_t top_k = 0;
  int64_t seed = 0;
};

struct RunSpec {
  std::string name;
  int64_t seed = 0;
  TargetSpec target;
  DrafterSpec drafter;
  DataSpec data;
  BatchingSpec batching;
  OptimSpec optim;
  LossSpec loss;
  PlacementSpec placement;
  CheckpointSpec checkpoint;
  EvalSpec eval;
};

struct RunSpecOptions {
  // Relative paths in the file are resolved against this directory (the run.yaml's folder).
  std::string base_dir;
  // Check that every path names something that exists (the coordinator and dflashctl do).
  bool check_paths = true;
  // Non-empty: every path must resolve, symlinks followed, inside one of these directories
  // (the coordinator's `data_roots`); `..` and symlinks that lead out are refused by field.
  std::vector<std::string> data_roots;
};

// Parses, normalizes and validates. The error lists every problem, one "field.path: reason" a line.
absl::StatusOr<RunSpec> ParseRunSpec(absl::string_view yaml_text, absl::string_view source_name,
                                     const RunSpecOptions& options);

// The resolved spec as YAML with every field present; ParseRunSpec(EmitRunSpec(s)) == s.
std::string EmitRunSpec(const RunSpec& spec);

// Names accepted after "builtin:" for target.path and data.train (the embedded CPU demo).
const std::vector<std::string>& BuiltinTargets();
const std::vector<std::string>& BuiltinDatasets();

// drafter.recompute values, each keeping less for the backward than the one before.
const std::vector<std::string>& RecomputeModes();

// Default for loss.gamma given the block size (method.md §3): 7 for 16, 5 for 10, 4 for 8.
std::optional<double> DefaultGamma(int64_t block_size);

// DFlash2's settings as a run applies them (docs/method.md §2.2): with drafter.kind dflash2 each
// one set, or its default when auto (conv kernel 2, group 16, selector rank 256, top-k 16); all 0
// with dflash.
struct Dflash2Settings {
  int64_t conv_kernel_size = 0, conv_group_size = 0, selector_rank = 0, selector_top_k = 0;
};
Dflash2Settings ResolvedDflash2(const DrafterSpec& drafter);

}  // namespace dflash::config
