// drafter.mask_token_id auto from tokenizer files (common/model/mask_token.h): each rule on files
// shaped like the families it is for, and the real SmolLM2-135M-Instruct checkpoint.
#include "common/model/mask_token.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "tests/checkpoint/test_files.h"

namespace dflash::model {
namespace {

using ::dflash::model::testing::TempDir;
using ::dflash::model::testing::WriteFile;
using ::testing::HasSubstr;

// A tokenizer.json with `vocab` plain tokens (ids 0..vocab-1, BPE) and the given added tokens.
std::string TokenizerJson(int vocab, const std::string& added) {
  std::string v;
  for (int i = 0; i < vocab; ++i)
    v += (i ? "," : "") + ("\"t" + std::to_string(i) + "\":") + std::to_string(i);
  return R"({"model": {"type": "BPE", "vocab": {)" + v + R"(}, "merges": []}, "added_tokens": [)" +
         added + "]}";
}

std::string Added(int id, const std::string& content, bool special = true) {
  return R"({"id": )" + std::to_string(id) + R"(, "content": ")" + content + R"(", "special": )" +
         (special ? "true" : "false") + "}";
}

TEST(MaskTokenTest, TheTokenizersOwnMaskTokenComesFirst) {
  TempDir d;
  WriteFile(d.Join("tokenizer.json"),
            TokenizerJson(4, Added(4, "<s>") + "," + Added(5, "<mask>") + "," + Added(6, "</s>")));
  WriteFile(d.Join("tokenizer_config.json"),
            R"({"mask_token": {"content": "<mask>", "special": true}, "bos_token": "<s>"})");
  auto c = MaskTokenFromTokenizer(d.Join("tokenizer.json"), 16);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->id, 5);
  EXPECT_EQ(c->token, "<mask>");
  EXPECT_EQ(c->rule, "the tokenizer's mask token");
}

// Qwen3: 151669 tokens, 151936 embedding rows; the first row past the tokens is its mask token.
TEST(MaskTokenTest, AnEmbeddingRowPastTheTokensIsTakenBeforeAnySpecialToken) {
  TempDir d;
  WriteFile(d.Join("tokenizer.json"),
            TokenizerJson(5, Added(5, "<|endoftext|>") + "," + Added(6, "<|fim_pad|>")));
  auto c = MaskTokenFromTokenizer(d.Join("tokenizer.json"), 10);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->id, 7);
  EXPECT_EQ(c->token, "");
  EXPECT_THAT(c->rule, HasSubstr("past the tokenizer's 7 tokens"));
}

// Llama-3: the vocabulary is full; <|reserved_special_token_0|> is preferred over a lower special
// token that is merely unused, and bos/eos and template tokens are never taken.
TEST(MaskTokenTest, AReservedSpecialTokenIsPreferredInAFullVocabulary) {
  TempDir d;
  WriteFile(d.Join("tokenizer.json"),
            TokenizerJson(4, Added(4, "<|begin_of_text|>") + "," + Added(5, "<|end_of_text|>") +
                                 "," + Added(6, "<|python_tag|>") + "," +
                                 Added(7, "<|reserved_special_token_0|>") + "," +
                                 Added(8, "<|start_header_id|>") + "," + Added(9, "<|eot_id|>")));
  WriteFile(d.Join("tokenizer_config.json"),
            R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                "chat_template": "{{ '<|start_header_id|>' + m + '<|eot_id|>' }}"})");
  WriteFile(d.Join("generation_config.json"), R"({"eos_token_id": [5, 9]})");
  auto c = MaskTokenFromTokenizer(d.Join("tokenizer.json"), 10);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->id, 7);
  EXPECT_EQ(c->token, "<|reserved_special_token_0|>");
  // Without a reserved token: the lowest special token neither the template nor framing uses.
  WriteFile(
      d.Join("tokenizer.json"),
      TokenizerJson(4, Added(4, "<|begin_of_text|>") + "," + Added(5, "<|end_of_text|>") + "," +
                           Added(6, "plain", /*special=*/false) + "," + Added(7, "<|python_tag|>") +
                           "," + Added(8, "<|start_header_id|>") + "," + Added(9, "<|eot_id|>")));
  c = MaskTokenFromTokenizer(d.Join("tokenizer.json"), 10);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->id, 7);
  EXPECT_EQ(c->token, "<|python_tag|>");
}

TEST(MaskTokenTest, NoUsableTokenIsNotFoundAndSaysWhy) {
  TempDir d;
  WriteFile(d.Join("tokenizer.json"),
            TokenizerJson(4, Added(4, "<|im_start|>") + "," + Added(5, "<|im_end|>")));
  WriteFile(d.Join("tokenizer_config.json"),
            R"({"chat_template": [{"name": "default", "template": "<|im_start|>x<|im_end|>"}]})");
  auto c = MaskTokenFromTokenizer(d.Join("tokenizer.json"), 6);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("names no mask token, its 6 tokens fill the target's 6 embedding rows"));
  EXPECT_EQ(MaskTokenFromTokenizer(d.Join("missing.json"), 6).status().code(),
            absl::StatusCode::kNotFound);
  WriteFile(d.Join("tokenizer_config.json"), "{not json");
  c = MaskTokenFromTokenizer(d.Join("tokenizer.json"), 6);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("tokenizer_config.json: not valid JSON"));
}

// The converted SmolLM2-135M-Instruct (scripts/models/smollm2.sh): 49152 tokens in 49152 rows,
// <|endoftext|> is unk, <|im_start|>/<|im_end|> are bos/eos and in the template: <repo_name>.
TEST(MaskTokenTest, SmolLM2PicksRepoName) {
  const char* models = std::getenv("DFLASH_MODELS");
  const char* home = std::getenv("HOME");
  const std::filesystem::path dir =
      std::filesystem::path(models != nullptr
                                ? models
                                : std::string(home ? home : "") + "/.local/share/dflash/models") /
      "SmolLM2-135M-Instruct";
  if (!std::filesystem::exists(dir / "tokenizer.json")) {
    const std::string venv = std::string(home ? home : "") + "/.local/share/dflash/venv";
    if (std::filesystem::exists(venv)) {
      FAIL() << dir << "/tokenizer.json is missing although " << venv
             << " exists: run scripts/setup.sh (scripts/models/smollm2.sh) to convert it";
    }
    GTEST_SKIP() << dir << " is missing (no venv: scripts/setup.sh has not run)";
  }
  auto c = MaskTokenFromTokenizer(dir / "tokenizer.json", 49152);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->id, 3);
  EXPECT_EQ(c->token, "<repo_name>");
}

}  // namespace
}  // namespace dflash::model
