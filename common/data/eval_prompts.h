// The prompts of an acceptance-length evaluation (eval.prompts, `dflashctl eval`). Chat records:
// the messages before the first assistant answer (all messages of a record without one) rendered
// with add_generation_prompt=true, as inference renders them; an answer, if present, is not used.
// Text and pretokenized records: the tokens before the first supervised token.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/run_spec.h"

namespace dflash::data {

struct EvalPrompts {
  std::vector<std::vector<int64_t>> prompts;
  // Where each prompt came from, for errors: "FILE:LINE", or "builtin:NAME document I".
  std::vector<std::string> origins;
  // Chat data: the template's end-of-turn token (EndOfTurnToken), so that generation stops where
  // an answer ends; empty for other formats and built-in data.
  std::vector<int64_t> stop_token_ids;
  int64_t records_read = 0;
  int64_t records_skipped = 0;  // unusable records; text / pretokenized without prompt or answer
};

// `path` (builtin:NAME or a JSONL file in data.format) as at most `max_prompts` prompts.
// builtin:NAME: the data set's last documents (built-in sets have no held-out split). JSONL: the
// first usable records, with data.tokenizer and data.chat_template (pretokenized records need no
// tokenizer and are checked against `vocab_size`). Errors name the file and line of a record that
// cannot be read when no prompt is usable.
absl::StatusOr<EvalPrompts> LoadEvalPrompts(const config::RunSpec& spec, const std::string& path,
                                            int64_t max_prompts, int64_t vocab_size);

}  // namespace dflash::data
