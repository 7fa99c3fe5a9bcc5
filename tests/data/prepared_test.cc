#include "common/data/prepared.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "common/data/prepared_format.h"
#include "tests/data/test_files.h"

namespace dflash::data {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

struct Doc {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
};

PreparedMetadata Meta() {
  PreparedMetadata m;
  m.tokenizer_fingerprint = std::string(64, 'a');
  m.vocab_size = 1000;
  m.data_format = "chat";
  m.chat_template = "chatml";
  m.block_size = 16;
  m.max_length = 4096;
  m.source_path = "/data/train.jsonl";
  m.source_bytes = 12345;
  m.source_mtime_ns = 1700000000123456789;
  return m;
}

std::vector<Doc> RandomDocs(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Doc> docs(n);
  for (Doc& d : docs) {
    const int len = static_cast<int>(rng() % 50);  // empty documents included
    for (int i = 0; i < len; ++i) {
      d.tokens.push_back(static_cast<int32_t>(rng() % 1000));
      d.mask.push_back(static_cast<uint8_t>(rng() % 2));
    }
  }
  return docs;
}

void Write(const fs::path& path, const std::vector<Doc>& docs, const PreparedMetadata& meta,
           absl::string_view report = R"({"documents": 0})") {
  auto writer = PreparedWriter::Create(path, meta);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (const Doc& d : docs) ASSERT_TRUE((*writer)->Append(d.tokens, d.mask).ok());
  ASSERT_TRUE((*writer)->Finish(report).ok());
}

TEST(PreparedTest, RoundTrip) {
  TempDir dir;
  const fs::path path = dir / "train.dflash";
  const std::vector<Doc> docs = RandomDocs(300, 1);
  Write(path, docs, Meta(), R"({"hello": "report"})");
  EXPECT_FALSE(fs::exists(dir / "train.dflash.tmp"));
  EXPECT_FALSE(fs::exists(dir / "train.dflash.tmp.mask"));

  auto ds = PreparedDataset::Open(path, {Meta().tokenizer_fingerprint, true});
  ASSERT_TRUE(ds.ok()) << ds.status();
  const PreparedDataset& d = **ds;
  ASSERT_EQ(d.num_documents(), 300);
  int64_t tokens = 0, supervised = 0;
  for (int i = 0; i < 300; ++i) {
    const batching::DocumentView v = d.document(i);
    EXPECT_EQ(d.length(i), static_cast<int64_t>(docs[i].tokens.size()));
    EXPECT_EQ(std::vector<int32_t>(v.tokens.begin(), v.tokens.end()), docs[i].tokens) << i;
    EXPECT_EQ(std::vector<uint8_t>(v.loss_mask.begin(), v.loss_mask.end()), docs[i].mask) << i;
    tokens += static_cast<int64_t>(docs[i].tokens.size());
    for (uint8_t m : docs[i].mask) supervised += m;
  }
  const PreparedMetadata& m = d.metadata();
  EXPECT_EQ(m.num_tokens, tokens);
  EXPECT_EQ(m.num_supervised, supervised);
  EXPECT_EQ(m.tokenizer_fingerprint, Meta().tokenizer_fingerprint);
  EXPECT_EQ(m.vocab_size, 1000);
  EXPECT_EQ(m.data_format, "chat");
  EXPECT_EQ(m.chat_template, "chatml");
  EXPECT_EQ(m.block_size, 16);
  EXPECT_EQ(m.max_length, 4096);
  EXPECT_EQ(m.source_path, "/data/train.jsonl");
  EXPECT_EQ(m.source_bytes, 12345);
  EXPECT_EQ(m.source_mtime_ns, 1700000000123456789);
  EXPECT_EQ(d.report_json(), R"({"hello": "report"})");
  // Sections are 64-byte aligned in the mapping, so the spans are aligned for their types.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(d.all_tokens().data()) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(d.offsets().data()) % 64, 0u);
}

TEST(PreparedTest, EmptyDataSetIsValid) {
  TempDir dir;
  Write(dir / "empty.dflash", {}, Meta());
  auto ds = PreparedDataset::Open(dir / "empty.dflash");
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_documents(), 0);
  EXPECT_EQ((*ds)->metadata().num_tokens, 0);
}

TEST(PreparedTest, EveryTruncationIsRefused) {
  TempDir dir;
  const fs::path path = dir / "full.dflash";
  Write(path, RandomDocs(20, 2), Meta());
  const std::string bytes = ReadFile(path);
  const fs::path cut = dir / "cut.dflash";
  // Every length from 0 to the full size minus one: near the header, inside the sections, inside
  // the trailer. Each must be refused, whatever the options.
  for (size_t len = 0; len < bytes.size(); ++len) {
    WriteFile(cut, absl::string_view(bytes).substr(0, len));
    auto ds = PreparedDataset::Open(cut, {"", /*verify=*/false});
    ASSERT_FALSE(ds.ok()) << "a file truncated to " << len << " bytes was accepted";
    EXPECT_THAT(std::string(ds.status().message()), HasSubstr("cut.dflash")) << len;
    if (len >= 8) {
      EXPECT_THAT(std::string(ds.status().message()), HasSubstr("truncated")) << len;
    }
  }
}

TEST(PreparedTest, EveryFlippedByteIsRefusedWhenVerifying) {
  TempDir dir;
  const fs::path path = dir / "full.dflash";
  Write(path, RandomDocs(5, 3), Meta(), R"({"r": 1})");
  const std::string bytes = ReadFile(path);
  const fs::path bad = dir / "bad.dflash";
  std::mt19937 rng(4);
  // Every byte outside the long zero-padded header tail, plus a sample of that tail.
  for (size_t at = 0; at < bytes.size(); ++at) {
    if (at > 4400 && at < kPreparedHeaderBytes && rng() % 64 != 0) continue;
    std::string copy = bytes;
    copy[at] = static_cast<char>(copy[at] ^ (1 << (rng() % 8)));
    WriteFile(bad, copy);
    auto ds = PreparedDataset::Open(bad);
    ASSERT_FALSE(ds.ok()) << "a bit flip at byte " << at << " was accepted";
  }
}

TEST(PreparedTest, ForeignFilesAreRefused) {
  TempDir dir;
  WriteFile(dir / "data.jsonl", std::string(20000, '{'));
  auto ds = PreparedDataset::Open(dir / "data.jsonl");
  ASSERT_FALSE(ds.ok());
  EXPECT_THAT(std::string(ds.status().message()),
              HasSubstr("data.jsonl: not a dflash prepared data set"));
  WriteFile(dir / "empty", "");
  EXPECT_FALSE(PreparedDataset::Open(dir / "empty").ok());
  EXPECT_EQ(PreparedDataset::Open(dir / "missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(PreparedDataset::Open(dir.path()).ok());
}

TEST(PreparedTest, AnotherVersionIsRefusedByName) {
  TempDir dir;
  Write(dir / "v.dflash", RandomDocs(3, 5), Meta());
  std::string bytes = ReadFile(dir / "v.dflash");
  bytes[prepared_format::kVersion] = 2;
  WriteFile(dir / "v.dflash", bytes);
  auto ds = PreparedDataset::Open(dir / "v.dflash", {"", false});
  ASSERT_FALSE(ds.ok());
  EXPECT_THAT(std::string(ds.status().message()), HasSubstr("format version 2"));
}

TEST(PreparedTest, WrongFingerprintIsRefused) {
  TempDir dir;
  Write(dir / "t.dflash", RandomDocs(3, 6), Meta());
  const std::string other(64, 'b');
  auto ds = PreparedDataset::Open(dir / "t.dflash", {other, true});
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(ds.status().message()),
              HasSubstr(absl::StrCat("t.dflash: prepared with tokenizer ", std::string(64, 'a'),
                                     " but the run's tokenizer is ", other)));
  EXPECT_TRUE(PreparedDataset::Open(dir / "t.dflash", {std::string(64, 'a'), true}).ok());
}

// A crafted file whose checksum is valid but whose offsets are not monotonic: the structural
// checks must catch it even with verification off (the checksum only proves the writer's intent).
TEST(PreparedTest, NonMonotonicOffsetsAreRefused) {
  TempDir dir;
  Write(dir / "o.dflash", {{{1, 2, 3}, {1, 1, 1}}, {{4, 5}, {0, 1}}}, Meta());
  std::string bytes = ReadFile(dir / "o.dflash");
  const uint64_t off = prepared_format::GetU64(reinterpret_cast<const uint8_t*>(bytes.data()),
                                               prepared_format::kSections + 16 * 2);
  const int64_t bad_offset = 6;  // offsets 0, 6, 5: document 1 would have length -1
  std::memcpy(&bytes[off + 8], &bad_offset, 8);
  WriteFile(dir / "o.dflash", bytes);
  auto ds = PreparedDataset::Open(dir / "o.dflash", {"", false});
  ASSERT_FALSE(ds.ok());
  EXPECT_THAT(std::string(ds.status().message()), HasSubstr("doc_offsets"));
}

TEST(PreparedTest, AbandonedWriterLeavesNothing) {
  TempDir dir;
  const fs::path path = dir / "x.dflash";
  WriteFile(path, "previous");
  {
    auto writer = PreparedWriter::Create(path, Meta());
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->Append(std::vector<int32_t>{1}, std::vector<uint8_t>{1}).ok());
    EXPECT_TRUE(fs::exists(dir / "x.dflash.tmp"));
  }
  EXPECT_FALSE(fs::exists(dir / "x.dflash.tmp"));
  EXPECT_FALSE(fs::exists(dir / "x.dflash.tmp.mask"));
  EXPECT_EQ(ReadFile(path), "previous");  // the final name is only ever replaced whole
}

TEST(PreparedTest, WriterRefusesMismatchedLengthsAndOversizedMetadata) {
  TempDir dir;
  auto writer = PreparedWriter::Create(dir / "w.dflash", Meta());
  ASSERT_TRUE(writer.ok());
  EXPECT_FALSE((*writer)->Append(std::vector<int32_t>{1, 2}, std::vector<uint8_t>{1}).ok());
  PreparedMetadata m = Meta();
  m.source_path = std::string(5000, 'p');
  EXPECT_FALSE(PreparedWriter::Create(dir / "w2.dflash", m).ok());
}

TEST(PreparedTest, TokenOutOfVocabularyIsRefusedWhenVerifying) {
  TempDir dir;
  Write(dir / "v.dflash", {{{1, 999, 1000}, {1, 1, 1}}}, Meta());  // vocab_size is 1000
  auto ds = PreparedDataset::Open(dir / "v.dflash");
  ASSERT_FALSE(ds.ok());
  EXPECT_THAT(std::string(ds.status().message()), HasSubstr("token 2 has id 1000"));
}

}  // namespace
}  // namespace dflash::data
