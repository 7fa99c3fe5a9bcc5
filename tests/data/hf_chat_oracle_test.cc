// Chat templates against Hugging Face transformers: for hundreds of random conversations, our
// rendered string equals apply_chat_template's, our ids equal the HF tokenizer's ids of that
// string, and our loss mask equals the mask hf_chat_oracle.py computes independently (assistant
// character spans + offsets_mapping). ChatML uses the shipped Qwen2 tokenizer_config.json; Llama-3
// a derived tokenizer with Llama-3's special tokens and official template. The script runs once per
// script version into the build tree (DFLASH_DATA_ORACLE_DIR).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/data/chat_template.h"
#include "common/data/prepare.h"
#include "common/data/prepared.h"
#include "nlohmann/json.hpp"
#include "tests/common/python_oracle.h"
#include "tests/data/test_files.h"

namespace dflash::data {

// Test names and failure messages print "chatml" / "llama3".
void PrintTo(ChatTemplate tmpl, std::ostream* os) { *os << ChatTemplateName(tmpl); }

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::ReadFile;

// Runs hf_chat_oracle.py unless its outputs for this script version are already there; returns an
// error text or "". A file lock makes concurrent test processes wait for one run.
std::string GenerateOracle() {
  return dflash::testing::RunPythonOracleOnce(DFLASH_PYTHON, DFLASH_DATA_ORACLE_SCRIPT,
                                              fs::path(DFLASH_DATA_ORACLE_DIR));
}

class HfChatOracleTest : public ::testing::TestWithParam<ChatTemplate> {
 protected:
  void SetUp() override {
    const std::string error = GenerateOracle();
    ASSERT_EQ(error, "");
    const fs::path dir(DFLASH_DATA_ORACLE_DIR);
    const json paths = json::parse(ReadFile(dir / "paths.json"));
    name_ = std::string(ChatTemplateName(GetParam()));
    tokenizer_path_ = paths.at(name_ + "_tokenizer").get<std::string>();
    cases_path_ = dir / (name_ + ".jsonl");
    auto tok = tokenizer::Tokenizer::FromFile(tokenizer_path_);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = *std::move(tok);
    std::ifstream in(cases_path_);
    for (std::string line; std::getline(in, line);) cases_.push_back(json::parse(line));
    ASSERT_GE(cases_.size(), 100u);
  }

  // Prepares the cases with data.chat_template `setting` and compares with the oracle.
  void CheckPrepare(const std::string& setting, const std::string& rendered_with);

  std::string name_;
  fs::path tokenizer_path_;
  fs::path cases_path_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::vector<json> cases_;
};

TEST_P(HfChatOracleTest, AutoUsesTheJinjaTemplateShippedWithTheTokenizer) {
  auto resolved = ResolveChatTemplate("auto", tokenizer_path_);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, ChatTemplate::kJinja);
  EXPECT_TRUE(CheckTemplateTokens(*resolved, *tok_).ok());
  EXPECT_TRUE(CheckTemplateTokens(GetParam(), *tok_).ok());
  // The shipped template and the built-in one end answers with the same token.
  auto jinja_end = EndOfTurnToken(*tok_, *resolved);
  auto builtin_end = EndOfTurnToken(*tok_, GetParam());
  ASSERT_TRUE(jinja_end.ok()) << jinja_end.status();
  ASSERT_TRUE(builtin_end.ok()) << builtin_end.status();
  EXPECT_EQ(*jinja_end, *builtin_end);
}

TEST_P(HfChatOracleTest, TextIdsAndMaskMatchHuggingFace) {
  int mismatches = 0;
  int64_t tokens = 0, supervised = 0;
  for (size_t i = 0; i < cases_.size(); ++i) {
    const json& c = cases_[i];
    // Both the OpenAI and the ShareGPT form of the conversation must give the same messages.
    for (const char* form : {"messages", "conversations"}) {
      auto parsed = ParseRecord(json{{form, c.at(form)}}.dump(), DataFormat::kChat);
      if (const auto* bad = std::get_if<BadRecord>(&parsed)) {
        // Conversations without an assistant turn cannot occur in the generator.
        ADD_FAILURE() << name_ << " case " << i << " (" << form << "): " << bad->message;
        continue;
      }
      const Record& record = std::get<Record>(parsed);
      const std::vector<TemplatePiece> pieces = RenderChat(GetParam(), record.messages);
      EXPECT_EQ(RenderChatText(GetParam(), record.messages), c.at("text").get<std::string>())
          << name_ << " case " << i;
      auto doc = TokenizePieces(*tok_, pieces);
      ASSERT_TRUE(doc.ok()) << doc.status();
      const auto want_ids = c.at("ids").get<std::vector<int32_t>>();
      const auto want_mask = c.at("mask").get<std::vector<uint8_t>>();
      if (doc->tokens != want_ids || doc->loss_mask != want_mask) {
        if (++mismatches <= 3) {
          EXPECT_EQ(doc->tokens, want_ids) << name_ << " case " << i << ": " << c.dump();
          EXPECT_EQ(doc->loss_mask, want_mask) << name_ << " case " << i << ": " << c.dump();
        }
      }
      tokens += static_cast<int64_t>(want_ids.size());
      supervised += doc->num_supervised();
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << 2 * cases_.size() << " conversations";
  // The generator must produce real work: many tokens, a fair share supervised.
  EXPECT_GT(tokens, 50000);
  EXPECT_GT(supervised, tokens / 5);
}

// The whole engine on the oracle's file: every kept document equals the oracle's, in order, and
// the dropped ones are exactly those with fewer than 2 * block_size supervised tokens.
// The built-in template by name, and "auto" (the Jinja template shipped with the tokenizer, through
// the interpreter and the prefix-rendering loss mask) give the oracle's ids and masks.
TEST_P(HfChatOracleTest, PrepareMatchesTheOracle) {
  for (const std::string setting : {name_, std::string("auto")}) {
    SCOPED_TRACE(setting);
    CheckPrepare(setting, setting == "auto" ? "jinja" : name_);
  }
}

void HfChatOracleTest::CheckPrepare(const std::string& setting, const std::string& rendered_with) {
  testing::TempDir dir;
  PrepareOptions o;
  o.input = cases_path_;
  o.output = dir / "out.dflash";
  o.tokenizer = tokenizer_path_;
  o.chat_template = setting;
  o.block_size = 8;
  o.threads = 3;
  o.chunk_bytes = 4096;
  auto report = Prepare(o, *tok_);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->chat_template, rendered_with);
  auto ds = PreparedDataset::Open(o.output, {tok_->fingerprint(), true});
  ASSERT_TRUE(ds.ok()) << ds.status();
  int64_t kept = 0, dropped = 0;
  for (const json& c : cases_) {
    const auto want_mask = c.at("mask").get<std::vector<uint8_t>>();
    int64_t supervised = 0;
    for (uint8_t m : want_mask) supervised += m;
    if (supervised < 16) {
      ++dropped;
      continue;
    }
    ASSERT_LT(kept, (*ds)->num_documents());
    const batching::DocumentView v = (*ds)->document(kept++);
    EXPECT_EQ(std::vector<int32_t>(v.tokens.begin(), v.tokens.end()),
              c.at("ids").get<std::vector<int32_t>>());
    EXPECT_EQ(std::vector<uint8_t>(v.loss_mask.begin(), v.loss_mask.end()), want_mask);
  }
  EXPECT_EQ(kept, (*ds)->num_documents());
  EXPECT_EQ(report->drops(DropReason::kTooFewSupervised).count, dropped);
  EXPECT_EQ(report->dropped_total(), dropped);
}

INSTANTIATE_TEST_SUITE_P(Templates, HfChatOracleTest,
                         ::testing::Values(ChatTemplate::kChatml, ChatTemplate::kLlama3),
                         [](const auto& info) {
                           return std::string(ChatTemplateName(info.param));
                         });

}  // namespace
}  // namespace dflash::data
