// The prepare engine end to end with the real Qwen2 tokenizer: drops counted by reason with line
// numbers, skip vs fail, determinism across thread counts, round trip, progress.
#include "common/data/prepare.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/data/chat_template.h"
#include "common/data/prepared.h"
#include "tests/data/qwen_tokenizer.h"
#include "tests/data/test_files.h"

namespace dflash::data {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::QwenTokenizer;
using testing::QwenTokenizerPath;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

// A conversation whose assistant turn has plenty of supervised tokens for block_size 4.
std::string GoodLine(int i) {
  return absl::StrCat(R"({"messages": [{"role": "user", "content": "Question number )", i,
                      R"(?"}, {"role": "assistant", "content": "Answer number )", i,
                      R"( is a long enough reply with many words in it."}]})");
}

PrepareOptions Options(const TempDir& dir) {
  PrepareOptions o;
  o.input = dir / "in.jsonl";
  o.output = dir / "out.dflash";
  o.tokenizer = QwenTokenizerPath();
  o.block_size = 4;
  o.threads = 2;
  return o;
}

// Line numbers (1-based) of each bad record in MixedInput().
std::string MixedInput() {
  std::vector<std::string> lines = {
      GoodLine(1),                                              // 1
      R"({"messages": [)",                                      // 2 malformed_json
      "",                                                       // 3 blank
      R"({"messages": [{"role": "user", "content": "q"}]})",    // 4 no_assistant_turn
      R"({"messages": [{"role": "wizard", "content": "q"}]})",  // 5 unknown_role
      GoodLine(2),                                              // 6
      R"({"messages": []})",                                    // 7 empty_conversation
      std::string(R"({"messages": [{"role": "assistant", "content": ")") + "\xff" + R"("}]})",
      // 8 invalid_utf8
      R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ok"}]})",
      // 9 too_few_supervised ("ok<|im_end|>" is 2 tokens < 8)
      R"({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": 5}]})",
      // 10 wrong_type
      R"({"text": "not a chat record"})",  // 11 missing_field
      "   \t",                             // 12 blank
      GoodLine(3),                         // 13
      R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
      // 14 unsupported_content
  };
  std::string out;
  for (const std::string& l : lines) absl::StrAppend(&out, l, "\n");
  return out;
}

TEST(PrepareTest, BadRecordsAreCountedByReasonWithLineNumbers) {
  ASSERT_NE(QwenTokenizer(), nullptr);
  TempDir dir;
  WriteFile(dir / "in.jsonl", MixedInput());
  auto report = Prepare(Options(dir), *QwenTokenizer());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->lines_read, 14);
  EXPECT_EQ(report->blank_lines, 2);
  EXPECT_EQ(report->documents, 3);
  EXPECT_EQ(report->dropped_total(), 9);
  const std::string in = (dir / "in.jsonl").string();
  const std::pair<DropReason, int> expected[] = {
      {DropReason::kMalformedJson, 2},      {DropReason::kNoAssistantTurn, 4},
      {DropReason::kUnknownRole, 5},        {DropReason::kEmptyConversation, 7},
      {DropReason::kInvalidUtf8, 8},        {DropReason::kTooFewSupervised, 9},
      {DropReason::kWrongType, 10},         {DropReason::kMissingField, 11},
      {DropReason::kUnsupportedContent, 14}};
  for (const auto& [reason, line] : expected) {
    const DropStats& d = report->drops(reason);
    EXPECT_EQ(d.count, 1) << DropReasonName(reason);
    ASSERT_EQ(d.examples.size(), 1u) << DropReasonName(reason);
    EXPECT_THAT(d.examples[0],
                HasSubstr(absl::StrCat(in, ":", line, ": ", DropReasonName(reason), ": ")));
  }
  auto ds = PreparedDataset::Open(dir / "out.dflash", {QwenTokenizer()->fingerprint(), true});
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_documents(), 3);
  EXPECT_EQ((*ds)->metadata().chat_template, "jinja");  // auto: tokenizer_config.json's template
  // The report stored in the file is the returned one, less output/threads/seconds.
  auto stored = PrepareReport::FromJson(nlohmann::json::parse((*ds)->report_json()));
  ASSERT_TRUE(stored.ok()) << stored.status();
  nlohmann::json want = report->ToJson();
  for (const char* key : {"output", "threads", "seconds"}) want.erase(key);
  nlohmann::json got = stored->ToJson();
  for (const char* key : {"output", "threads", "seconds"}) got.erase(key);
  EXPECT_EQ(got, want);
  EXPECT_THAT(report->ToTable(), HasSubstr("no_assistant_turn"));
}

TEST(PrepareTest, PretokenizedAndLongLineDropsCarryLineNumbers) {
  ASSERT_NE(QwenTokenizer(), nullptr);
  TempDir dir;
  const int64_t vocab = QwenTokenizer()->vocab_size();
  const std::string ok =
      R"({"input_ids": [1, 2, 3, 4, 5, 6, 7, 8], "loss_mask": [1, 1, 1, 1, 1, 1, 1, 1]})";
  WriteFile(dir / "in.jsonl",
            absl::StrCat(ok, "\n",                                                            // 1
                         R"({"input_ids": [1, 2], "loss_mask": [1]})", "\n",                  // 2
                         R"({"input_ids": [1, 2], "loss_mask": [1, 3]})", "\n",               // 3
                         R"({"input_ids": [1, )", vocab, R"(], "loss_mask": [1, 1]})", "\n",  // 4
                         R"({"input_ids": [1, 2], "loss_mask": [1, 1]})", "\n",               // 5
                         R"({"input_ids": [)", std::string(300, '1'), "]}\n",                 // 6
                         ok, "\n"));                                                          // 7
  PrepareOptions o = Options(dir);
  o.format = DataFormat::kPretokenized;
  o.max_line_bytes = 200;
  auto report = Prepare(o, *QwenTokenizer());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->documents, 2);
  EXPECT_EQ(report->chat_template, "none");
  const std::pair<DropReason, int> expected[] = {{DropReason::kLengthMismatch, 2},
                                                 {DropReason::kInvalidLossMask, 3},
                                                 {DropReason::kTokenOutOfRange, 4},
                                                 {DropReason::kTooFewSupervised, 5},
                                                 {DropReason::kLineTooLong, 6}};
  for (const auto& [reason, line] : expected) {
    ASSERT_EQ(report->drops(reason).examples.size(), 1u) << DropReasonName(reason);
    EXPECT_THAT(report->drops(reason).examples[0],
                HasSubstr(absl::StrCat(":", line, ": ", DropReasonName(reason), ": ")));
  }
  EXPECT_EQ(report->dropped_total(), 5);
}

TEST(PrepareTest, FailStopsAtTheFirstBadRecordAndWritesNothing) {
  ASSERT_NE(QwenTokenizer(), nullptr);
  TempDir dir;
  WriteFile(dir / "in.jsonl", MixedInput());
  PrepareOptions o = Options(dir);
  o.on_bad_record = OnBadRecord::kFail;
  o.chunk_bytes = 1;  // one line per chunk: the first bad record must win over later chunks
  o.threads = 4;
  auto report = Prepare(o, *QwenTokenizer());
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(std::string(report.status().message()),
              HasSubstr(absl::StrCat((dir / "in.jsonl").string(), ":2: malformed_json: ")));
  EXPECT_FALSE(fs::exists(dir / "out.dflash"));
  EXPECT_FALSE(fs::exists(dir / "out.dflash.tmp"));
  EXPECT_FALSE(fs::exists(dir / "out.dflash.tmp.mask"));
  // A clean file passes under fail.
  WriteFile(dir / "in.jsonl", GoodLine(1) + "\n" + GoodLine(2) + "\n");
  ASSERT_TRUE(Prepare(o, *QwenTokenizer()).ok());
  EXPECT_TRUE(fs::exists(dir / "out.dflash"));
}

TEST(PrepareTest, OutputIsByteIdenticalForAnyThreadCountAndChunkSize) {
  ASSERT_NE(QwenTokenizer(), nullptr);
  TempDir dir;
  std::string input;
  for (int i = 0; i < 400; ++i) {
    absl::StrAppend(&input, i % 37 == 5 ? R"({"messages": "bad"})" : GoodLine(i), "\n");
  }
  WriteFile(dir / "in.jsonl", input);
  std::string reference;
  for (const auto& [threads, chunk] :
       {std::pair<int, int64_t>{1, 1 << 20}, {4, 1 << 20}, {4, 700}, {3, 1}, {1, 1}}) {
    PrepareOptions o = Options(dir);
    o.threads = threads;
    o.chunk_bytes = chunk;
    auto report = Prepare(o, *QwenTokenizer());
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->threads, threads);
    const std::string bytes = ReadFile(o.output);
    if (reference.empty()) {
      reference = bytes;
      EXPECT_EQ(report->drops(DropReason::kWrongType).count, 11);
    } else {
      EXPECT_TRUE(bytes == reference) << threads << " threads, chunk " << chunk;
    }
  }
}

TEST(PrepareTest, DocumentsRoundTripInInputOrder) {
  ASSERT_NE(QwenTokenizer(), nullptr);
  TempDir dir;
  std::vector<std::string> lines;
  for (int i = 0; i < 60; ++i) lines.push_back(GoodLine(i * 7919));
  std::string input;
  for (const std::string& l : lines) absl::StrAppend(&input, l, "\n");
  WriteFile(dir / "in.jsonl", input);
  PrepareOptions o = Options(dir);
  o.chunk_bytes = 300;
  ASSERT_TRUE(Prepare(o, *QwenTokenizer()).ok());
  auto ds = PreparedDataset::Open(o.output);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->num_documents(), 60);
  for (int i = 0; i < 60; ++i) {
    auto parsed = ParseRecord(lines[i], DataFormat::kChat);
    auto want = TokenizeRecord(std::get<Record>(parsed), *QwenTokenizer(),
                               {DataFormat::kChat, ChatTemplate::kChatml, 4});
    const Document& doc = std::get<Document>(want);
    const batching::DocumentView got = (*ds)->document(i);
    EXPECT_EQ(std::vector<int32_t>(got.tokens.begin(), got.tokens.end()), doc.tokens) << i;
    EXPECT_EQ(std::vector<uint8_t>(got.loss_mask.begin(), got.loss_mask.end()), doc.loss_mask);
  }
}

TEST(PrepareTest, LengthStatisticsAndProgress) {
  ASSERT_NE(QwenTokenizer(), nullptr);
  TempDir dir;
  std::string input;
  for (int i = 0; i < 50; ++i) {
    std::string words;
    for (int w = 0; w < i * 4; ++w) words += " word";
    absl::StrAppend(&input, R"({"text": "start)", words, R"("})", "\n");
  }
  WriteFile(dir / "in.jsonl", input);
  PrepareOptions o = Options(dir);
  o.format = DataFormat::kText;
  o.max_length = 100;
  o.chunk_bytes = 512;
  std::vector<PrepareProgress> progress;
  auto report =
      Prepare(o, *QwenTokenizer(), [&](const PrepareProgress& p) { progress.push_back(p); });
  ASSERT_TRUE(report.ok()) << report.status();
  // "start" + i*4 " word" tokens = 1 + 4i tokens; kept iff >= 8 supervised (block 4): i >= 2.
  EXPECT_EQ(report->documents, 48);
  EXPECT_EQ(report->drops(DropReason::kTooFewSupervised).count, 2);
  EXPECT_EQ(report->longest_document, 1 + 4 * 49);
  int64_t over = 0, tokens = 0, histogram_total = 0;
  for (int i = 2; i < 50; ++i) {
    over += 1 + 4 * i > 100;
    tokens += 1 + 4 * i;
  }
  EXPECT_EQ(report->over_max_length, over);
  EXPECT_EQ(report->tokens, tokens);
  EXPECT_EQ(report->supervised_tokens, tokens);
  for (int64_t c : report->length_histogram) histogram_total += c;
  EXPECT_EQ(histogram_total, 48);
  // 9..15 -> bucket 3 (i = 2, 3), 16..31 -> bucket 4 (i = 4..7), ..., 128..197 -> bucket 7.
  EXPECT_THAT(report->length_histogram, ElementsAre(0, 0, 0, 2, 4, 8, 16, 18));
  ASSERT_GT(progress.size(), 3u);
  for (size_t i = 1; i < progress.size(); ++i) {
    EXPECT_GE(progress[i].bytes_read, progress[i - 1].bytes_read);
    EXPECT_GE(progress[i].documents, progress[i - 1].documents);
  }
  EXPECT_EQ(progress.back().bytes_read, static_cast<int64_t>(input.size()));
  EXPECT_EQ(progress.back().total_bytes, static_cast<int64_t>(input.size()));
  EXPECT_EQ(progress.back().documents, 48);
  EXPECT_EQ(progress.back().tokens, tokens);
}

TEST(PrepareTest, ExamplesAreCappedButCountsAreNot) {
  ASSERT_NE(QwenTokenizer(), nullptr);
  TempDir dir;
  std::string input;
  for (int i = 0; i < 20; ++i) input += "nope\n";
  WriteFile(dir / "in.jsonl", input);
  PrepareOptions o = Options(dir);
  o.max_examples_per_reason = 3;
  auto report = Prepare(o, *QwenTokenizer());
  ASSERT_TRUE(report.ok()) << report.status();
  const DropStats& d = report->drops(DropReason::kMalformedJson);
  EXPECT_EQ(d.count, 20);
  ASSERT_EQ(d.examples.size(), 3u);
  EXPECT_THAT(d.examples[2], HasSubstr(":3: malformed_json"));
  EXPECT_EQ(report->documents, 0);
}

TEST(PrepareTest, OptionErrors) {
  ASSERT_NE(QwenTokenizer(), nullptr);
  TempDir dir;
  WriteFile(dir / "in.jsonl", GoodLine(1) + "\n");
  PrepareOptions o = Options(dir);
  o.output = o.input;
  EXPECT_FALSE(Prepare(o, *QwenTokenizer()).ok());
  o = Options(dir);
  o.input = dir / "missing.jsonl";
  EXPECT_FALSE(Prepare(o, *QwenTokenizer()).ok());
  o = Options(dir);
  o.chat_template = "llama3";  // the Qwen tokenizer has no <|begin_of_text|>
  auto wrong = Prepare(o, *QwenTokenizer());
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(std::string(wrong.status().message()), HasSubstr("<|begin_of_text|>"));
  o = Options(dir);
  o.block_size = 0;
  EXPECT_FALSE(Prepare(o, *QwenTokenizer()).ok());
  EXPECT_FALSE(fs::exists(dir / "out.dflash"));
}

TEST(PrepareTest, LoadsTheTokenizerFromItsPath) {
  TempDir dir;
  WriteFile(dir / "in.jsonl", GoodLine(1) + "\n");
  auto report = Prepare(Options(dir));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->documents, 1);
  PrepareOptions o = Options(dir);
  o.tokenizer = dir / "nope.json";
  EXPECT_FALSE(Prepare(o).ok());
}

}  // namespace
}  // namespace dflash::data
