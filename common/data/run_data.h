// How a run finds and checks its data: the glue between run.yaml (common/config) and the data
// libraries, shared by `dflashctl prepare` and the coordinator so both resolve paths the same way.
//
//   tokenizer   data.tokenizer, or (auto) <target.path>/tokenizer.json
//   prepared    data.train itself when it is a prepared file (by its magic); else data.prepared,
//               or (auto) data.train with its extension replaced by ".dfdata"
//
// OpenRunData refuses, naming the field: a missing prepared file (with the command that makes it),
// a truncated or foreign one, one prepared with another tokenizer, format or chat template, and
// one whose JSONL source changed (size or mtime) since it was prepared.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/batching/batcher.h"
#include "common/config/run_spec.h"
#include "common/data/prepare.h"
#include "common/data/prepared.h"

namespace dflash::data {

struct RunDataPaths {
  std::filesystem::path train;      // data.train as configured (absolute)
  std::filesystem::path prepared;   // the prepared file training reads
  std::filesystem::path tokenizer;  // tokenizer.json
  // data.chat_template: auto reads the template here: target.path (the checkpoint), or empty for a
  // built-in target (then the tokenizer's directory).
  std::filesystem::path chat_template_dir;
  bool train_is_prepared = false;  // data.train is itself a prepared file
};

// True when the file starts with the prepared-data magic (a missing file is not prepared).
bool LooksPrepared(const std::filesystem::path& path);

// The run's packing settings (data.max_length, data.long_documents, batching.*, seed) for
// `num_pairs` data-parallel pairs; INVALID_ARGUMENT naming the field.
absl::StatusOr<batching::BatchingOptions> BatchingOptionsFor(const config::RunSpec& spec,
                                                             int64_t num_pairs);

// Errors: data.tokenizer auto on a target without tokenizer.json; builtin data (nothing to read).
absl::StatusOr<RunDataPaths> ResolveRunDataPaths(const config::RunSpec& spec);

// What `dflashctl prepare run.yaml` runs: the run's data settings as prepare options.
absl::StatusOr<PrepareOptions> PrepareOptionsFor(const config::RunSpec& spec,
                                                 const RunDataPaths& paths);

// What the coordinator reports about a run's data (RunStatus.data; docs/data.md).
struct RunDataSummary {
  std::string prepared_path;
  std::string tokenizer_fingerprint;
  int64_t documents = 0;
  int64_t tokens = 0;
  int64_t supervised_tokens = 0;
  int64_t records_read = 0;
  int64_t records_skipped = 0;
  std::map<std::string, int64_t> skipped_by_reason;
  int64_t documents_over_max_length = 0;  // truncated or split by the packer
  int64_t pairs = 1;                      // the plan below is for this many pairs
  int64_t micro_batches_per_epoch = 0;    // per pair
  int64_t steps_per_epoch = 0;
  double fill_ratio = 0;
  int64_t total_steps = 0;  // optim.max_steps, or ceil(optim.epochs * steps_per_epoch)
};

struct RunData {
  RunDataPaths paths;                                 // empty for builtin data
  std::unique_ptr<PreparedDataset> dataset;           // prepared file data, or null
  std::unique_ptr<batching::DocumentSource> builtin;  // data.train: builtin:NAME, or null
  RunDataSummary summary;
  // What training reads: the prepared file, or the built-in data set.
  const batching::DocumentSource& source() const {
    return dataset ? static_cast<const batching::DocumentSource&>(*dataset) : *builtin;
  }
};

// Opens and checks the run's prepared data and plans epoch 0 for the summary. `verify` also reads
// the whole file once for its checksum (PreparedOpenOptions::verify). data.train builtin:NAME opens
// the generated data set (builtin_data.h) instead; its summary has no prepared path or tokenizer.
absl::StatusOr<RunData> OpenRunData(const config::RunSpec& spec, bool verify = true);

// Refuses (FAILED_PRECONDITION naming data.prepared, the file, both vocabulary sizes and
// target.path) prepared data whose tokenizer's vocabulary is not the target's: more tokens than
// the target has embedding rows (`target_vocab_size`), or, when data.tokenizer names another file
// than the target's own tokenizer.json, a different number of tokens than that tokenizer.json.
// (Fewer tokens than embedding rows is normal: Qwen3's 151669 tokens in 151936 rows.) Built-in
// data is not checked. The coordinator calls it at submit and when the run starts, the target
// worker when it prepares the run: before any step.
absl::Status CheckDataVocabulary(const config::RunSpec& spec, const RunData& data,
                                 int64_t target_vocab_size);

}  // namespace dflash::data
