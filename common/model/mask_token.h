// drafter.mask_token_id `auto` from the target's tokenizer files: which token id the drafter
// writes into block slots 1..B-1 (method.md §3.2), picked by a fixed rule from tokenizer.json and
// the files beside it (tokenizer_config.json, chat_template.jinja, config.json,
// generation_config.json), so that every process that applies the rule to the same files gets the
// same id, and the id is never one the model writes in ordinary text. docs/run-spec.md has the
// rule for users. Plain JSON reading, no LibTorch (the coordinator and the planner use it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "absl/status/statusor.h"

namespace dflash::model {

struct MaskTokenChoice {
  int64_t id = 0;
  std::string token;  // the token's text, or "" for an embedding row no token uses
  std::string rule;   // which rule picked it, e.g. "an unused special token"
};

// In order, the first that gives an id below `vocab_size` (the target's embedding rows):
//   1. tokenizer_config.json's "mask_token" (a string or {"content": ...}), found in
//   tokenizer.json;
//   2. the first embedding row past the tokenizer's tokens, when the embedding has more rows than
//      the tokenizer has tokens (Qwen3: 151669 of 151936 rows);
//   3. the lowest-id added token marked special whose name contains "reserved" or "unused"
//      (Llama-3: <|reserved_special_token_0|>), else the lowest-id other special added token,
//      among those the chat template never writes and that are not the bos, eos, pad, unk, sep
//      or cls token of tokenizer_config.json, config.json or generation_config.json (SmolLM2:
//      <repo_name>, id 3).
// NOT_FOUND, saying what was looked at, when no rule gives an id (or tokenizer.json is missing);
// INVALID_ARGUMENT naming the file for a file that is not valid JSON.
absl::StatusOr<MaskTokenChoice> MaskTokenFromTokenizer(const std::filesystem::path& tokenizer_json,
                                                       int64_t vocab_size);

}  // namespace dflash::model
