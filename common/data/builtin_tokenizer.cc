#include "common/data/builtin_tokenizer.h"

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/config/builtins.h"
#include "common/tokenizer/byte_level.h"

namespace dflash::data {

std::string TinyQwen3TokenizerJson() {
  nlohmann::json vocab = nlohmann::json::object();
  const auto& bytes = tokenizer::byte_level::ByteStrings();
  for (int b = 0; b < 256; ++b) vocab[bytes[b]] = b;
  // ChatML's markers as special tokens, so that chat data can be rendered for the built-in target.
  // Added tokens take the ids after the vocabulary, as in HF tokenizers: the last three.
  const std::vector<const char*> specials = {"<|im_start|>", "<|im_end|>", "<|endoftext|>"};
  const int64_t first_special = config::TinyQwen3::kVocabSize - 3;
  for (int64_t id = 256; id < first_special; ++id) vocab[absl::StrCat("<|tiny_", id, "|>")] = id;
  nlohmann::json added = nlohmann::json::array();
  int64_t id = first_special;
  for (const char* special : specials) {
    added.push_back({{"id", id++},
                     {"content", special},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  nlohmann::json j = {{"version", "1.0"},
                      {"added_tokens", added},
                      {"normalizer", nullptr},
                      {"pre_tokenizer",
                       {{"type", "ByteLevel"},
                        {"add_prefix_space", false},
                        {"trim_offsets", true},
                        {"use_regex", true}}},
                      {"post_processor", nullptr},
                      {"decoder",
                       {{"type", "ByteLevel"},
                        {"add_prefix_space", false},
                        {"trim_offsets", true},
                        {"use_regex", true}}},
                      {"model",
                       {{"type", "BPE"},
                        {"dropout", nullptr},
                        {"unk_token", nullptr},
                        {"continuing_subword_prefix", nullptr},
                        {"end_of_word_suffix", nullptr},
                        {"fuse_unk", false},
                        {"byte_fallback", false},
                        {"vocab", vocab},
                        {"merges", nlohmann::json::array()}}}};
  return j.dump();
}

absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> LoadTokenizer(
    const std::filesystem::path& path) {
  const std::string p = path.string();
  if (!absl::StartsWith(p, "builtin:")) return tokenizer::Tokenizer::FromFile(path);
  if (p != "builtin:tiny-qwen3") {
    return absl::NotFoundError(
        absl::StrCat("no built-in tokenizer '", p, "' (known: builtin:tiny-qwen3)"));
  }
  return tokenizer::Tokenizer::FromJson(TinyQwen3TokenizerJson(), p);
}

}  // namespace dflash::data
