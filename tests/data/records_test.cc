#include "common/data/records.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace dflash::data {
namespace {

using ::testing::HasSubstr;

Record Ok(absl::string_view line, DataFormat format) {
  auto parsed = ParseRecord(line, format);
  const BadRecord* bad = std::get_if<BadRecord>(&parsed);
  EXPECT_EQ(bad, nullptr) << line << " -> " << (bad ? bad->message : "");
  return bad ? Record() : std::get<Record>(std::move(parsed));
}

BadRecord Refused(absl::string_view line, DataFormat format) {
  auto parsed = ParseRecord(line, format);
  const BadRecord* bad = std::get_if<BadRecord>(&parsed);
  EXPECT_NE(bad, nullptr) << line << " was accepted";
  return bad ? *bad : BadRecord();
}

TEST(RecordsTest, OpenAiMessagesWithStringAndTextParts) {
  Record r = Ok(R"({"id": 7, "messages": [{"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": "Hello!"}, {"role": "developer", "content": "x"}]})",
                DataFormat::kChat);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, Role::kSystem);
  EXPECT_EQ(r.messages[1].role, Role::kUser);
  EXPECT_EQ(r.messages[1].content, "Hi there");
  EXPECT_EQ(r.messages[2].role, Role::kAssistant);
  EXPECT_EQ(r.messages[2].content, "Hello!");
  EXPECT_EQ(r.messages[3].role, Role::kSystem);
}

TEST(RecordsTest, ShareGptRolesAreMapped) {
  const std::pair<const char*, Role> cases[] = {
      {"system", Role::kSystem},       {"human", Role::kUser},
      {"user", Role::kUser},           {"gpt", Role::kAssistant},
      {"assistant", Role::kAssistant}, {"chatgpt", Role::kAssistant},
      {"model", Role::kAssistant},     {"bard", Role::kAssistant},
      {"bing", Role::kAssistant},      {"function_call", Role::kAssistant},
      {"tool", Role::kTool},           {"function", Role::kTool},
      {"observation", Role::kTool},    {"ipython", Role::kTool}};
  for (const auto& [from, role] : cases) {
    Record r = Ok(absl::StrCat(R"({"conversations": [{"from": ")", from,
                               R"(", "value": "v"}, {"from": "gpt", "value": "a"}]})"),
                  DataFormat::kChat);
    ASSERT_EQ(r.messages.size(), 2u) << from;
    EXPECT_EQ(r.messages[0].role, role) << from;
  }
}

TEST(RecordsTest, ChatRefusalsNameTheField) {
  struct Case {
    const char* line;
    DropReason reason;
    const char* message;
  };
  const Case cases[] = {
      {R"({"messages": [)", DropReason::kMalformedJson, "not valid JSON"},
      // A number beyond double's range: nlohmann throws out_of_range, not parse_error (fuzzer).
      {R"({"messages": 1e999999})", DropReason::kMalformedJson, "not valid JSON"},
      {R"([1, 2])", DropReason::kWrongType, "(line): expected a JSON object, got array"},
      {R"({"foo": 1})", DropReason::kMissingField, "messages: missing"},
      {R"({"messages": {}})", DropReason::kWrongType, "messages: expected a list, got object"},
      {R"({"messages": []})", DropReason::kEmptyConversation, "messages: empty"},
      {R"({"conversations": []})", DropReason::kEmptyConversation, "conversations: empty"},
      {R"({"messages": [{"role": "user", "content": "q"}]})", DropReason::kNoAssistantTurn,
       "no assistant turn"},
      {R"({"messages": [{"role": "narrator", "content": "q"}]})", DropReason::kUnknownRole,
       "messages[0].role: unknown role 'narrator'"},
      {R"({"conversations": [{"from": "gpt", "value": "a"}, {"from": "Human", "value": "q"}]})",
       DropReason::kUnknownRole, "conversations[1].from: unknown role 'Human'"},
      {R"({"messages": [{"content": "q"}]})", DropReason::kMissingField,
       "messages[0].role: missing"},
      {R"({"messages": [{"role": "assistant"}]})", DropReason::kMissingField,
       "messages[0].content: missing"},
      {R"({"messages": [{"role": 3, "content": "q"}]})", DropReason::kWrongType,
       "messages[0].role: expected a string, got integer"},
      {R"({"messages": [{"role": "assistant", "content": null}]})", DropReason::kWrongType,
       "messages[0].content: expected a string or a list of text parts, got null"},
      {R"({"messages": [{"role": "assistant", "content": [{"type": "image_url", "image_url": {}}]}]})",
       DropReason::kUnsupportedContent,
       "messages[0].content[0].type: unsupported content part 'image_url'"},
      {R"({"messages": [{"role": "assistant", "content": [{"type": "text"}]}]})",
       DropReason::kMissingField, "messages[0].content[0].text: missing"},
      {R"({"messages": [{"role": "assistant", "content": [{"text": "a"}]}]})",
       DropReason::kMissingField, "messages[0].content[0].type: missing"},
      {R"({"conversations": [{"from": "gpt", "value": 1.5}]})", DropReason::kWrongType,
       "conversations[0].value: expected a string, got float"},
      {R"({"messages": [7]})", DropReason::kWrongType, "messages[0]: expected an object"},
  };
  for (const Case& c : cases) {
    BadRecord bad = Refused(c.line, DataFormat::kChat);
    EXPECT_EQ(bad.reason, c.reason) << c.line << " -> " << bad.message;
    EXPECT_THAT(bad.message, HasSubstr(c.message)) << c.line;
  }
}

TEST(RecordsTest, InvalidUtf8IsItsOwnReason) {
  std::string line = R"({"text": "ab)";
  line += '\xC3';  // a lead byte without its continuation
  line += R"("})";
  BadRecord bad = Refused(line, DataFormat::kText);
  EXPECT_EQ(bad.reason, DropReason::kInvalidUtf8);
  EXPECT_THAT(bad.message, HasSubstr("byte 12"));
}

TEST(RecordsTest, Utf8Validator) {
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"));  // é € 😀
  size_t at = 99;
  EXPECT_FALSE(IsValidUtf8("a\xC0\x80", &at));  // overlong NUL
  EXPECT_EQ(at, 1u);
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // surrogate U+D800
  EXPECT_FALSE(IsValidUtf8("\xE0\x80\xAF"));      // overlong 3-byte
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xF0\x9F\x98"));      // truncated
  EXPECT_FALSE(IsValidUtf8("\x80"));              // lone continuation
}

TEST(RecordsTest, TrailingCarriageReturnIsTolerated) {
  Record r = Ok("{\"text\": \"x\"}\r", DataFormat::kText);
  EXPECT_EQ(r.text, "x");
}

TEST(RecordsTest, Pretokenized) {
  Record r =
      Ok(R"({"input_ids": [1, 2, 151000], "loss_mask": [0, 1, 1]})", DataFormat::kPretokenized);
  EXPECT_EQ(r.input_ids, (std::vector<int32_t>{1, 2, 151000}));
  EXPECT_EQ(r.loss_mask, (std::vector<uint8_t>{0, 1, 1}));

  struct Case {
    const char* line;
    DropReason reason;
    const char* message;
  };
  const Case cases[] = {
      {R"({"input_ids": [1, 2], "loss_mask": [1]})", DropReason::kLengthMismatch,
       "loss_mask: has 1 entries but input_ids has 2"},
      {R"({"input_ids": [1, 2], "loss_mask": [1, 2]})", DropReason::kInvalidLossMask,
       "loss_mask[1]: 2 is outside [0, 1]"},
      {R"({"input_ids": [1, -2], "loss_mask": [1, 1]})", DropReason::kTokenOutOfRange,
       "input_ids[1]: -2"},
      {R"({"input_ids": [1, 18446744073709551615], "loss_mask": [1, 1]})",
       DropReason::kTokenOutOfRange, "input_ids[1]"},
      {R"({"input_ids": [1, 2.0], "loss_mask": [1, 1]})", DropReason::kWrongType,
       "input_ids[1]: expected an integer, got float"},
      {R"({"input_ids": "1 2", "loss_mask": [1, 1]})", DropReason::kWrongType,
       "input_ids: expected a list of integers, got string"},
      {R"({"loss_mask": [1]})", DropReason::kMissingField, "input_ids: missing"},
      {R"({"input_ids": [1]})", DropReason::kMissingField, "loss_mask: missing"},
  };
  for (const Case& c : cases) {
    BadRecord bad = Refused(c.line, DataFormat::kPretokenized);
    EXPECT_EQ(bad.reason, c.reason) << c.line << " -> " << bad.message;
    EXPECT_THAT(bad.message, HasSubstr(c.message)) << c.line;
  }
}

TEST(RecordsTest, Text) {
  EXPECT_EQ(Ok(R"({"text": "hello\nworld", "meta": 1})", DataFormat::kText).text, "hello\nworld");
  EXPECT_EQ(Refused(R"({"txt": "x"})", DataFormat::kText).reason, DropReason::kMissingField);
  EXPECT_EQ(Refused(R"({"text": ["x"]})", DataFormat::kText).reason, DropReason::kWrongType);
}

TEST(RecordsTest, DropReasonNamesAreStableAndRoundTrip) {
  // These names are part of the report's JSON; changing one is a breaking change.
  EXPECT_EQ(DropReasonName(DropReason::kMalformedJson), "malformed_json");
  EXPECT_EQ(DropReasonName(DropReason::kTooFewSupervised), "too_few_supervised");
  EXPECT_EQ(DropReasonName(DropReason::kTokenOutOfRange), "token_out_of_range");
  EXPECT_EQ(DropReasonName(DropReason::kTokenizerError), "tokenizer_error");
  for (int i = 0; i < kNumDropReasons; ++i) {
    const auto reason = static_cast<DropReason>(i);
    EXPECT_EQ(ParseDropReason(DropReasonName(reason)), reason) << i;
  }
  EXPECT_EQ(ParseDropReason("nope"), std::nullopt);
}

TEST(RecordsTest, FormatNames) {
  for (DataFormat f : {DataFormat::kChat, DataFormat::kPretokenized, DataFormat::kText}) {
    EXPECT_EQ(*ParseDataFormat(DataFormatName(f)), f);
  }
  EXPECT_FALSE(ParseDataFormat("sharegpt").ok());
}

}  // namespace
}  // namespace dflash::data
