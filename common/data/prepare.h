// The prepare engine: JSONL in, prepared data set (common/data/prepared.h) out.
//
// The input is streamed (never loaded whole): the calling thread reads it in blocks and cuts it
// into chunks of whole lines; `threads` workers parse and tokenize the chunks; the calling thread
// writes the chunks' documents strictly in input order, so the output is byte-identical whatever
// the thread count. At most 2 * threads + 2 chunks are in flight, which bounds memory.
//
// Bad records are dropped and counted by reason (on_bad_record = skip), or stop the run at the
// first one in input order with "file:line: reason: message" and no output file (fail). Blank
// lines (only whitespace) are skipped and counted separately; they are not errors. Documents longer
// than max_length are kept whole and only counted: the packer truncates or splits them.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/data/records.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace dflash::data {

enum class OnBadRecord { kSkip = 0, kFail = 1 };
absl::string_view OnBadRecordName(OnBadRecord mode);  // "skip", "fail"
absl::StatusOr<OnBadRecord> ParseOnBadRecord(absl::string_view name);

struct PrepareOptions {
  std::filesystem::path input;      // JSONL
  std::filesystem::path output;     // prepared data set; written via <output>.tmp
  std::filesystem::path tokenizer;  // tokenizer.json (its directory is searched for the template)
  DataFormat format = DataFormat::kChat;
  std::string chat_template = "auto";  // auto | chatml | llama3 (chat format only)
  // Where "auto" looks for the template (the target checkpoint); empty: the tokenizer's directory.
  std::filesystem::path chat_template_dir;
  std::string thinking = "auto";  // data.thinking: the template's enable_thinking (auto | on | off)
  int block_size = 16;            // drop documents with < 2 * block_size supervised tokens
  int64_t max_length = 4096;      // only counted (over_max_length)
  OnBadRecord on_bad_record = OnBadRecord::kSkip;
  int threads = 0;                     // 0 = std::thread::hardware_concurrency()
  int max_examples_per_reason = 5;     // "file:line: message" examples kept per drop reason
  int64_t chunk_bytes = 1 << 20;       // input bytes per work item
  int64_t max_line_bytes = 256 << 20;  // longer lines are dropped as line_too_long
};

// Passed to the progress callback after each chunk is written (on the calling thread).
struct PrepareProgress {
  int64_t bytes_read = 0;   // input bytes consumed so far
  int64_t total_bytes = 0;  // input size
  int64_t lines = 0;
  int64_t documents = 0;  // documents kept so far
  int64_t tokens = 0;     // tokens kept so far
};
using ProgressFn = std::function<void(const PrepareProgress&)>;

struct DropStats {
  int64_t count = 0;
  std::vector<std::string> examples;  // first few "file:line: message"
};

struct PrepareReport {
  std::string input;
  std::string output;
  std::string format;         // DataFormatName
  std::string chat_template;  // ChatTemplateName or "none"
  std::string tokenizer_fingerprint;
  int threads = 0;
  int64_t input_bytes = 0;
  int64_t lines_read = 0;  // all lines, blank ones included
  int64_t blank_lines = 0;
  int64_t documents = 0;                           // kept
  std::array<DropStats, kNumDropReasons> dropped;  // indexed by DropReason
  int64_t over_max_length = 0;                     // kept documents longer than max_length
  int64_t max_length = 0;
  int64_t tokens = 0;  // in kept documents
  int64_t supervised_tokens = 0;
  int64_t longest_document = 0;
  // Bucket k counts kept documents whose length n satisfies 2^k <= n < 2^(k+1) (bucket 0 also
  // holds n = 0, which cannot occur for kept documents). Trailing empty buckets are trimmed.
  std::vector<int64_t> length_histogram;
  double seconds = 0;

  int64_t dropped_total() const;
  const DropStats& drops(DropReason reason) const { return dropped[static_cast<size_t>(reason)]; }

  // {"input", "output", ..., "dropped": {"<reason>": {"count", "examples"}} (non-zero reasons),
  //  "length_histogram": [{"min", "max", "count"}], ...}; field names are stable.
  nlohmann::json ToJson() const;
  // Also reads the copy stored in a prepared file (PreparedDataset::report_json()), which leaves
  // out "output", "threads" and "seconds" so that the file is the same for any thread count.
  static absl::StatusOr<PrepareReport> FromJson(const nlohmann::json& json);
  // A human-readable multi-line table (counts, drops with examples, histogram).
  std::string ToTable() const;
};

// Loads the tokenizer from options.tokenizer, resolves the chat template and runs the engine.
absl::StatusOr<PrepareReport> Prepare(const PrepareOptions& options,
                                      const ProgressFn& progress = nullptr);
// Same with an already loaded tokenizer (options.tokenizer is then only used to find the chat
// template when options.chat_template is "auto").
absl::StatusOr<PrepareReport> Prepare(const PrepareOptions& options,
                                      const tokenizer::Tokenizer& tok,
                                      const ProgressFn& progress = nullptr);

}  // namespace dflash::data
