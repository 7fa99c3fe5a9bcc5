// The real SmolLM2-135M-Instruct checkpoint through data.chat_template: auto: its
// tokenizer_config.json template (a default system prompt when the first message is not a system
// message) renders, tokenizes and masks exactly as transformers' apply_chat_template + the
// independent mask of jinja_oracle.py; prompts (add_generation_prompt=true) give HF's ids; eval
// prompts need no answer. Also the loss mask's prefix-consistency rule on the Qwen3 fixture.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <variant>

#include "absl/strings/match.h"
#include "common/config/run_spec.h"
#include "common/data/chat_template.h"
#include "common/data/eval_prompts.h"
#include "common/data/jinja_chat.h"
#include "common/data/records.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/common/python_oracle.h"
#include "tests/common/read_file.h"

namespace dflash::data {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::HasSubstr;

fs::path SmolDir() {
  const char* env = std::getenv("DFLASH_MODELS");
  const fs::path models =
      env ? fs::path(env) : fs::path(std::getenv("HOME")) / ".local/share/dflash/models";
  return models / "SmolLM2-135M-Instruct";
}

std::vector<Message> Messages(const json& list) {
  std::vector<Message> out;
  for (const json& m : list) {
    auto parsed = ParseRecord(json{{"messages", json::array({m})}}.dump(), DataFormat::kChat,
                              /*require_assistant_turn=*/false);
    out.push_back(std::get<Record>(parsed).messages.at(0));
  }
  return out;
}

class SmolLM2ChatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(SmolDir() / "tokenizer_config.json"))
        << SmolDir() << " is missing: scripts/setup.sh converts SmolLM2-135M-Instruct there "
        << "(scripts/models/smollm2.sh; DFLASH_MODELS overrides the parent folder)";
    ASSERT_EQ(dflash::testing::RunPythonOracleOnce(DFLASH_PYTHON, DFLASH_JINJA_ORACLE_SCRIPT,
                                                   fs::path(DFLASH_JINJA_ORACLE_DIR)),
              "");
    std::ifstream in(fs::path(DFLASH_JINJA_ORACLE_DIR) / "smollm2.jsonl");
    for (std::string line; std::getline(in, line);) cases_.push_back(json::parse(line));
    ASSERT_GE(cases_.size(), 200u);
    auto tmpl = ResolveChatTemplate("auto", SmolDir() / "tokenizer.json", SmolDir());
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    tmpl_ = *tmpl;
  }

  std::vector<json> cases_;
  ResolvedChatTemplate tmpl_;
};

// Text level, no tokenizer: the rendered string and the supervised byte spans.
TEST_F(SmolLM2ChatTest, AutoRendersAndMarksAnswersAsTransformers) {
  ASSERT_EQ(tmpl_.kind, ChatTemplate::kJinja);
  int compared = 0;
  for (const json& c : cases_) {
    const std::vector<Message> messages = Messages(c.at("messages"));
    SCOPED_TRACE(c.at("messages").dump());
    const std::string want = c.at("text");
    if (c.at("add_generation_prompt")) {
      auto prompt = RenderPromptText(tmpl_, messages);
      ASSERT_TRUE(prompt.ok()) << prompt.status();
      EXPECT_EQ(*prompt, want);
      continue;
    }
    auto pieces = RenderChatPieces(tmpl_, messages);
    ASSERT_TRUE(pieces.ok()) << pieces.status();
    std::string text;
    json spans = json::array();
    for (const TemplatePiece& p : *pieces) {
      if (p.supervised) spans.push_back({text.size(), text.size() + p.text.size()});
      text += p.text;
    }
    EXPECT_EQ(text, want);
    EXPECT_EQ(spans, c.at("spans"));
    ++compared;
  }
  EXPECT_GE(compared, 100);
  // The default system prompt the built-in chatml template does not write.
  auto prompt = RenderPromptText(tmpl_, std::vector<Message>{{Role::kUser, "Hi"}});
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ(*prompt,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

// Token level: ids and masks equal HF's. Needs a tokenizer that reads SmolLM2's tokenizer.json
// (its Digits pre-tokenizer); until common/tokenizer does, this test says so and skips.
TEST_F(SmolLM2ChatTest, AutoTokenizesAndMasksAsTransformers) {
  auto tok = tokenizer::Tokenizer::FromFile(SmolDir() / "tokenizer.json");
  if (!tok.ok() && absl::StrContains(tok.status().message(), "'Digits' is not supported")) {
    GTEST_SKIP() << "common/tokenizer does not read SmolLM2's Digits pre-tokenizer yet: "
                 << tok.status();
  }
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_TRUE(CheckTemplateTokens(tmpl_, **tok).ok());
  for (const json& c : cases_) {
    const std::vector<Message> messages = Messages(c.at("messages"));
    SCOPED_TRACE(c.at("messages").dump());
    const auto want_ids = c.at("ids").get<std::vector<int32_t>>();
    if (c.at("add_generation_prompt")) {
      auto ids = TokenizePrompt(**tok, tmpl_, messages);
      ASSERT_TRUE(ids.ok()) << ids.status();
      EXPECT_EQ(*ids, want_ids);
      continue;
    }
    Record record;
    record.messages = messages;
    auto doc = TokenizeRecord(record, **tok, {DataFormat::kChat, tmpl_, 0});
    ASSERT_TRUE(std::holds_alternative<Document>(doc)) << std::get<BadRecord>(doc).message;
    EXPECT_EQ(std::get<Document>(doc).tokens, want_ids);
    EXPECT_EQ(std::get<Document>(doc).loss_mask, c.at("mask").get<std::vector<uint8_t>>());
  }
}

// Eval prompts from chat records without answers, with the Qwen2 tokenizer and the Jinja template
// of its tokenizer_config.json (data.chat_template: auto).
TEST(EvalPromptsTest, ChatRecordsNeedNoAnswer) {
  const fs::path dir =
      fs::temp_directory_path() / ("dflash_eval_prompts_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const fs::path prompts = dir / "prompts.jsonl";
  std::ofstream(prompts) << R"({"messages": [{"role": "user", "content": "Hi"}]})"
                         << "\n"
                         << R"({"messages": [{"role": "system", "content": "S"}, )"
                         << R"({"role": "user", "content": "Q"}, {"role": "assistant", )"
                         << R"("content": "A"}, {"role": "user", "content": "later"}]})"
                         << "\n"
                         << R"({"messages": [{"role": "assistant", "content": "no prompt"}]})"
                         << "\n";
  config::RunSpec spec;
  spec.target.path = DFLASH_QWEN_ASSETS;
  spec.data.train = prompts.string();
  spec.data.format = "chat";
  spec.drafter.block_size = 16;
  auto loaded = LoadEvalPrompts(spec, prompts.string(), 10, 151936);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto tok = tokenizer::Tokenizer::FromFile(fs::path(DFLASH_QWEN_ASSETS) / "tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto expect = [&](const std::string& text) {
    auto ids = (*tok)->EncodeIds(text);
    return std::vector<int64_t>(ids->begin(), ids->end());
  };
  ASSERT_EQ(loaded->prompts.size(), 2u);
  EXPECT_EQ(loaded->records_read, 3);
  EXPECT_EQ(loaded->records_skipped, 1);
  EXPECT_EQ(loaded->prompts[0], expect("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
  // A record with an answer: the messages before it (the answer and what follows are ignored).
  EXPECT_EQ(loaded->prompts[1], expect("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ"
                                       "<|im_end|>\n<|im_start|>assistant\n"));
  EXPECT_EQ(loaded->stop_token_ids, expect("<|im_end|>"));
  // The built-in template by name renders the same prompts here.
  spec.data.chat_template = "chatml";
  auto builtin = LoadEvalPrompts(spec, prompts.string(), 10, 151936);
  fs::remove_all(dir);
  ASSERT_TRUE(builtin.ok()) << builtin.status();
  EXPECT_EQ(builtin->prompts, loaded->prompts);
  EXPECT_EQ(builtin->stop_token_ids, loaded->stop_token_ids);
}

// data.thinking sets the template's enable_thinking as apply_chat_template(enable_thinking=...)
// does: Qwen3's template writes an empty reasoning block after the assistant header when it is
// false, nothing when true or unset. A template without the switch, or a built-in one, is
// refused naming data.thinking.
TEST(JinjaChatTest, ThinkingSwitch) {
  const fs::path dir = fs::path(::testing::TempDir()) / "thinking";
  fs::create_directories(dir);
  fs::copy_file(fs::path(DFLASH_CHAT_TEMPLATE_FIXTURES) / "qwen3.jinja",
                dir / "chat_template.jinja", fs::copy_options::overwrite_existing);
  const std::vector<Message> chat = {{Role::kUser, "Q"}};
  auto prompt = [&](const char* thinking) {
    auto t = ResolveChatTemplate("auto", dir / "tokenizer.json", dir, thinking);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? RenderPromptText(*t, chat).value_or("") : std::string();
  };
  EXPECT_EQ(prompt("off"),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(prompt("on"), "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(prompt("auto"), prompt("on"));
  EXPECT_EQ(RecordedTemplateName(ChatTemplate::kJinja, "off"), "jinja-think");
  EXPECT_EQ(RecordedThinking("jinja-think"), "off");
  EXPECT_EQ(RecordedThinking("jinja"), "auto");

  const fs::path smollm2 = fs::path(::testing::TempDir()) / "thinking-smollm2";
  fs::create_directories(smollm2);
  fs::copy_file(fs::path(DFLASH_CHAT_TEMPLATE_FIXTURES) / "smollm2.jinja",
                smollm2 / "chat_template.jinja", fs::copy_options::overwrite_existing);
  auto none = ResolveChatTemplate("auto", smollm2 / "tokenizer.json", smollm2, "off");
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(std::string(none.status().message()), ::testing::HasSubstr("data.thinking: off: "));
  EXPECT_THAT(std::string(none.status().message()),
              ::testing::HasSubstr("has no enable_thinking switch"));
  auto builtin = ResolveChatTemplate("chatml", dir / "tokenizer.json", dir, "on");
  ASSERT_FALSE(builtin.ok());
  EXPECT_THAT(std::string(builtin.status().message()),
              ::testing::HasSubstr("the built-in chatml template has no thinking switch"));
}

// Qwen3's template: one answer after the last user message gets its (empty) reasoning block
// supervised; an earlier answer whose reasoning the template drops once a later user message
// follows is not prefix-consistent, and the record is refused naming that message.
TEST(JinjaChatTest, Qwen3MaskAndPrefixConsistency) {
  const std::string source = dflash::testing::ReadFileText(
      (fs::path(DFLASH_CHAT_TEMPLATE_FIXTURES) / "qwen3.jinja").string());
  auto tmpl = JinjaChatTemplate::Create(source, "qwen3.jinja", json{{"eos_token", "<|im_end|>"}});
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  auto pieces =
      (*tmpl)->RenderPieces(std::vector<Message>{{Role::kUser, "Q"}, {Role::kAssistant, "A"}});
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  ASSERT_EQ(pieces->size(), 3u);
  EXPECT_EQ((*pieces)[0].text, "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_FALSE((*pieces)[0].supervised);
  EXPECT_EQ((*pieces)[1].text, "<think>\n\n</think>\n\nA<|im_end|>");
  EXPECT_TRUE((*pieces)[1].supervised);
  EXPECT_EQ((*pieces)[2].text, "\n");

  auto multi = (*tmpl)->RenderPieces(std::vector<Message>{
      {Role::kUser, "Q"}, {Role::kAssistant, "A"}, {Role::kUser, "Q2"}, {Role::kAssistant, "B"}});
  ASSERT_FALSE(multi.ok());
  EXPECT_THAT(std::string(multi.status().message()),
              HasSubstr("qwen3.jinja: not prefix-consistent at messages[1] (an assistant answer)"));
}

}  // namespace
}  // namespace dflash::data
