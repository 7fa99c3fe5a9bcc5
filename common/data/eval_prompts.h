// The prompts of an acceptance-length evaluation (issue 9: eval.prompts, `dflashctl eval`): each
// document's tokens before its first supervised token, i.e. the conversation up to the first
// assistant answer, which the target then generates.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/run_spec.h"

namespace dflash::data {

struct EvalPrompts {
  std::vector<std::vector<int64_t>> prompts;
  // Chat data: the token that closes each first answer (the template's end-of-turn token), so that
  // generation stops where the answer would; empty for other formats and built-in data.
  std::vector<int64_t> stop_token_ids;
  int64_t records_read = 0;
  int64_t records_skipped = 0;  // unusable records, or documents without a prompt or an answer
};

// `path` (builtin:NAME or a JSONL file in data.format) as at most `max_prompts` prompts.
// builtin:NAME: the data set's last documents (built-in sets have no held-out split). JSONL: the
// first usable records, tokenized as training tokenizes them (data.tokenizer, data.chat_template;
// pretokenized records need no tokenizer and are checked against `vocab_size`). Errors name the
// file and line of a record that cannot be read when no prompt is usable.
absl::StatusOr<EvalPrompts> LoadEvalPrompts(const config::RunSpec& spec, const std::string& path,
                                            int64_t max_prompts, int64_t vocab_size);

}  // namespace dflash::data
