// Rendering and template resolution (no tokenizer needed); tokenization is in
// tokenize_record_test.cc and the Hugging Face parity in hf_chat_oracle_test.cc.
#include "common/data/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/data/test_files.h"

namespace dflash::data {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;
using testing::WriteFile;

std::vector<Message> Conversation() {
  return {{Role::kSystem, "Be brief."},
          {Role::kUser, "What is 2+2?"},
          {Role::kAssistant, "4"},
          {Role::kTool, "ok"}};
}

TEST(ChatTemplateTest, ChatmlRendersQwenString) {
  EXPECT_EQ(RenderChatText(ChatTemplate::kChatml, Conversation()),
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>tool\nok<|im_end|>\n");
}

TEST(ChatTemplateTest, ChatmlPiecesSuperviseAssistantContentAndEndToken) {
  const std::vector<TemplatePiece> pieces =
      RenderChat(ChatTemplate::kChatml, {{Role::kUser, "q"}, {Role::kAssistant, "a"}});
  // Adjacent pieces with the same label are merged.
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].text, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_FALSE(pieces[0].supervised);
  EXPECT_EQ(pieces[1].text, "a<|im_end|>");
  EXPECT_TRUE(pieces[1].supervised);
  EXPECT_EQ(pieces[2].text, "\n");
  EXPECT_FALSE(pieces[2].supervised);
}

TEST(ChatTemplateTest, Llama3RendersOfficialStringWithTrim) {
  const std::vector<Message> messages = {{Role::kSystem, "  sys \n"},
                                         {Role::kUser, "\t hi"},
                                         {Role::kAssistant, "\xC2\xA0 hello \xE3\x80\x80\n"}};
  // Python's str.strip() also removes U+00A0 and U+3000.
  EXPECT_EQ(RenderChatText(ChatTemplate::kLlama3, messages),
            "<|begin_of_text|>"
            "<|start_header_id|>system<|end_header_id|>\n\nsys<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nhello<|eot_id|>");
  const std::vector<TemplatePiece> pieces = RenderChat(ChatTemplate::kLlama3, messages);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[1].text, "hello<|eot_id|>");
  EXPECT_TRUE(pieces[1].supervised);
}

TEST(ChatTemplateTest, Llama3TrimKeepsInnerWhitespaceAndAllSpaceContent) {
  EXPECT_EQ(RenderChatText(ChatTemplate::kLlama3, {{Role::kAssistant, " \n "}}),
            "<|begin_of_text|><|start_header_id|>assistant<|end_header_id|>\n\n<|eot_id|>");
  EXPECT_EQ(RenderChatText(ChatTemplate::kLlama3, {{Role::kAssistant, " a \n b "}}),
            "<|begin_of_text|><|start_header_id|>assistant<|end_header_id|>\n\na \n b<|eot_id|>");
}

TEST(ChatTemplateTest, DetectByMarkers) {
  EXPECT_EQ(*DetectChatTemplate("{{'<|im_start|>' + m + '<|im_end|>'}}"), ChatTemplate::kChatml);
  EXPECT_EQ(*DetectChatTemplate("<|start_header_id|>{{r}}<|end_header_id|>{{c}}<|eot_id|>"),
            ChatTemplate::kLlama3);
  EXPECT_FALSE(DetectChatTemplate("[INST] {{ c }} [/INST]").ok());
  EXPECT_FALSE(DetectChatTemplate("<|im_start|><|im_end|><|start_header_id|><|eot_id|>").ok());
}

TEST(ChatTemplateTest, ResolveExplicitNames) {
  EXPECT_EQ(*ResolveChatTemplate("chatml", "/nonexistent/tokenizer.json"), ChatTemplate::kChatml);
  EXPECT_EQ(*ResolveChatTemplate("llama3", "/nonexistent/tokenizer.json"), ChatTemplate::kLlama3);
  EXPECT_FALSE(ResolveChatTemplate("mistral", "/nonexistent/tokenizer.json").ok());
}

// The text an "auto" template renders for a one-message conversation.
std::string AutoRender(const std::filesystem::path& tokenizer_json,
                       const std::filesystem::path& template_dir = {}) {
  auto resolved = ResolveChatTemplate("auto", tokenizer_json, template_dir);
  if (!resolved.ok()) return std::string(resolved.status().message());
  EXPECT_EQ(resolved->kind, ChatTemplate::kJinja);
  auto text = RenderPromptText(*resolved, std::vector<Message>{{Role::kUser, "hi"}});
  return text.ok() ? *text : std::string(text.status().message());
}

TEST(ChatTemplateTest, ResolveAutoRendersTheCheckpointsOwnTemplate) {
  TempDir dir;
  WriteFile(dir / "tokenizer_config.json",
            R"({"bos_token": {"content": "<s>", "special": true},
                "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{% endfor %}"})");
  EXPECT_EQ(AutoRender(dir / "tokenizer.json"), "<s>[user]");
  // The list form of newer tokenizer_config.json files: the "default" entry counts.
  WriteFile(dir / "tokenizer_config.json",
            R"({"chat_template": [{"name": "tool_use", "template": "tools"},
                {"name": "default", "template": "default{{ add_generation_prompt }}"}]})");
  EXPECT_EQ(AutoRender(dir / "tokenizer.json"), "defaultTrue");
  // chat_template.jinja (what transformers >= 4.43 saves) wins over tokenizer_config.json.
  WriteFile(dir / "chat_template.jinja", "jinja file{{ messages | length }}\n");
  EXPECT_EQ(AutoRender(dir / "tokenizer.json"), "jinja file1");
  // The target checkpoint's directory, when given, is where the template is read.
  TempDir target;
  WriteFile(target / "chat_template.jinja", "target");
  EXPECT_EQ(AutoRender(dir / "tokenizer.json", target.path()), "target");
  // Built-in names stay explicit choices.
  EXPECT_EQ(*ResolveChatTemplate("chatml", dir / "tokenizer.json", target.path()),
            ChatTemplate::kChatml);
}

TEST(ChatTemplateTest, ResolveAutoErrorsTellTheUserWhatToSet) {
  TempDir dir;
  auto none = ResolveChatTemplate("auto", dir / "tokenizer.json");
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("set data.chat_template"));
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("tokenizer_config.json"));

  WriteFile(dir / "tokenizer_config.json", R"({"eos_token": "</s>"})");
  auto missing = ResolveChatTemplate("auto", dir / "tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("has no chat_template"));

  // Syntax the interpreter does not support: the file, line and column.
  WriteFile(dir / "tokenizer_config.json",
            R"({"chat_template": "{% for m in messages %}\n  {% include 'x' %}{% endfor %}"})");
  auto unsupported = ResolveChatTemplate("auto", dir / "tokenizer.json");
  ASSERT_FALSE(unsupported.ok());
  EXPECT_THAT(
      std::string(unsupported.status().message()),
      HasSubstr("tokenizer_config.json:chat_template:2:3: unsupported statement 'include'"));
  EXPECT_THAT(std::string(unsupported.status().message()), HasSubstr("set data.chat_template"));

  // A list entry whose name is not a string is skipped, not a crash (the file is not ours).
  WriteFile(dir / "tokenizer_config.json",
            R"({"chat_template": [{"name": 5, "template": "<|im_start|><|im_end|>"}]})");
  auto odd = ResolveChatTemplate("auto", dir / "tokenizer.json");
  ASSERT_FALSE(odd.ok());
  EXPECT_THAT(std::string(odd.status().message()), HasSubstr("neither a string nor a list"));
}

}  // namespace
}  // namespace dflash::data
