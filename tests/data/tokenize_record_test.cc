// Record -> document with the real Qwen2 tokenizer: masks, drops and template token checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/data/chat_template.h"
#include "tests/data/qwen_tokenizer.h"

namespace dflash::data {
namespace {

using ::testing::HasSubstr;
using testing::QwenTokenizer;

constexpr int32_t kImStartId = 151644;  // Qwen2's <|im_start|>
constexpr int32_t kImEndId = 151645;    // Qwen2's <|im_end|>

Document MustTokenize(const Record& record, const TokenizeOptions& options) {
  auto result = TokenizeRecord(record, *QwenTokenizer(), options);
  const BadRecord* bad = std::get_if<BadRecord>(&result);
  EXPECT_EQ(bad, nullptr) << (bad ? bad->message : "");
  return bad ? Document() : std::get<Document>(std::move(result));
}

BadRecord MustRefuse(const Record& record, const TokenizeOptions& options) {
  auto result = TokenizeRecord(record, *QwenTokenizer(), options);
  EXPECT_TRUE(std::holds_alternative<BadRecord>(result));
  return std::holds_alternative<BadRecord>(result) ? std::get<BadRecord>(result) : BadRecord();
}

TEST(TokenizeRecordTest, ChatmlMaskCoversAssistantContentAndImEndOnly) {
  ASSERT_NE(QwenTokenizer(), nullptr);
  Record record;
  record.messages = {{Role::kUser, "Say hi"}, {Role::kAssistant, "Hi there friend"}};
  Document doc = MustTokenize(record, {DataFormat::kChat, ChatTemplate::kChatml, 1});
  ASSERT_EQ(doc.tokens.size(), doc.loss_mask.size());
  // Layout: <|im_start|> user \n Say hi <|im_end|> \n <|im_start|> assistant \n Hi there friend
  // <|im_end|> \n. Supervised: the assistant content and its <|im_end|>; not the final newline.
  ASSERT_GE(doc.tokens.size(), 6u);
  EXPECT_EQ(doc.tokens.back(), 198);  // "\n"
  EXPECT_EQ(doc.loss_mask.back(), 0);
  EXPECT_EQ(doc.tokens[doc.tokens.size() - 2], kImEndId);
  EXPECT_EQ(doc.loss_mask[doc.tokens.size() - 2], 1);
  const auto decoded_supervised = [&] {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < doc.tokens.size(); ++i) {
      if (doc.loss_mask[i]) ids.push_back(doc.tokens[i]);
    }
    return *QwenTokenizer()->Decode(ids);
  }();
  EXPECT_EQ(decoded_supervised, "Hi there friend<|im_end|>");
  EXPECT_EQ(doc.tokens[0], kImStartId);
}

TEST(TokenizeRecordTest, TextRecordsAreFullySupervised) {
  ASSERT_NE(QwenTokenizer(), nullptr);
  Record record;
  record.text = "Plain pretraining text, every token counts.";
  Document doc = MustTokenize(record, {DataFormat::kText, ChatTemplate::kChatml, 1});
  EXPECT_EQ(doc.tokens, *QwenTokenizer()->EncodeIds(record.text));
  EXPECT_EQ(doc.num_supervised(), static_cast<int64_t>(doc.tokens.size()));
}

TEST(TokenizeRecordTest, PretokenizedIdsAreCheckedAgainstTheVocabulary) {
  ASSERT_NE(QwenTokenizer(), nullptr);
  const int64_t vocab = QwenTokenizer()->vocab_size();
  Record record;
  record.input_ids = {1, 2, static_cast<int32_t>(vocab - 1)};
  record.loss_mask = {1, 1, 1};
  EXPECT_EQ(MustTokenize(record, {DataFormat::kPretokenized, ChatTemplate::kChatml, 1}).tokens,
            record.input_ids);
  record.input_ids[1] = static_cast<int32_t>(vocab);
  BadRecord bad = MustRefuse(record, {DataFormat::kPretokenized, ChatTemplate::kChatml, 1});
  EXPECT_EQ(bad.reason, DropReason::kTokenOutOfRange);
  EXPECT_THAT(bad.message, HasSubstr(absl::StrCat("input_ids[1]: ", vocab, " is outside")));
}

TEST(TokenizeRecordTest, TooFewSupervisedBoundaryIsTwoBlocks) {
  ASSERT_NE(QwenTokenizer(), nullptr);
  Record record;
  record.input_ids.assign(40, 5);
  record.loss_mask.assign(40, 0);
  for (int i = 0; i < 32; ++i) record.loss_mask[i] = 1;  // exactly 2 * 16
  EXPECT_EQ(
      MustTokenize(record, {DataFormat::kPretokenized, ChatTemplate::kChatml, 16}).num_supervised(),
      32);
  record.loss_mask[0] = 0;  // 31
  BadRecord bad = MustRefuse(record, {DataFormat::kPretokenized, ChatTemplate::kChatml, 16});
  EXPECT_EQ(bad.reason, DropReason::kTooFewSupervised);
  EXPECT_THAT(bad.message, HasSubstr("31 supervised tokens, fewer than 2 * block_size = 32"));
}

TEST(TokenizeRecordTest, TemplateTokensMustExist) {
  ASSERT_NE(QwenTokenizer(), nullptr);
  EXPECT_TRUE(CheckTemplateTokens(ChatTemplate::kChatml, *QwenTokenizer()).ok());
  absl::Status status = CheckTemplateTokens(ChatTemplate::kLlama3, *QwenTokenizer());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("<|begin_of_text|>"));
}

}  // namespace
}  // namespace dflash::data
