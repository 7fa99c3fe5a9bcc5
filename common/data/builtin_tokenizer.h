// Tokenizers of the built-in targets (run.yaml `target.path: builtin:NAME`), so that file data made
// for them (pretokenized JSONL, e.g. `dflashctl regen` of builtin:tiny-chat) can be prepared and
// checked like any other: `data.tokenizer: auto` with a built-in target is "builtin:NAME".
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace dflash::data {

// "builtin:tiny-qwen3": a byte-level BPE without merges over the target's 512 ids (the 256
// byte-level symbols, placeholder tokens "<|tiny_N|>", and ChatML's <|im_start|> <|im_end|>
// <|endoftext|> as special tokens 509-511): it fixes the vocabulary and the fingerprint; text
// encodes byte by byte; chat data renders with data.chat_template chatml. Any other path:
// Tokenizer::FromFile.
absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> LoadTokenizer(
    const std::filesystem::path& path);

// The tokenizer.json text of builtin:tiny-qwen3 (tests write it beside checkpoints of the same
// 512-token vocabulary).
std::string TinyQwen3TokenizerJson();

}  // namespace dflash::data
