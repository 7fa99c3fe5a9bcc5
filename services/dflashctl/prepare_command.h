// `dflashctl prepare`: tokenizes a JSONL data set once into the prepared (memory-mapped) file that
// training reads (docs/data.md). Runs locally: no coordinator is needed.
#pragma once

#include <string>

namespace dflash::ctl {

struct PrepareArgs {
  // Either a run.yaml (its data, tokenizer and settings are used) ...
  std::string run_yaml;
  // ... or everything given explicitly (run_yaml empty).
  std::string data;
  std::string tokenizer;
  std::string out;  // default: data with its extension replaced by .dfdata
  std::string format = "chat";
  std::string chat_template = "auto";
  std::string thinking = "auto";  // the template's enable_thinking: auto|on|off
  int block_size = 16;
  int64_t max_length = 4096;
  std::string on_bad_record = "skip";
  // Both modes.
  int threads = 0;     // 0 = all cores
  bool force = false;  // prepare again even when the output is up to date
  bool json = false;   // --output json: the report as JSON on stdout, no progress bar
};

// Returns a process exit code (commands.h ExitCode).
int RunPrepare(const PrepareArgs& args);

}  // namespace dflash::ctl
