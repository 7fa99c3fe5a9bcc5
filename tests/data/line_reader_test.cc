#include "common/data/line_reader.h"

#include <gtest/gtest.h>

#include "tests/data/test_files.h"

namespace dflash::data {
namespace {

using testing::TempDir;
using testing::WriteFile;

struct ReadLine {
  int64_t number;
  std::string text;  // "<too long>" for dropped lines
  bool operator==(const ReadLine& o) const { return number == o.number && text == o.text; }
};

std::vector<ReadLine> ReadAll(const std::filesystem::path& path, int64_t chunk_bytes,
                              int64_t max_line, int64_t* end_offset = nullptr) {
  auto reader = LineReader::Open(path, chunk_bytes, max_line);
  EXPECT_TRUE(reader.ok()) << reader.status();
  std::vector<ReadLine> out;
  LineChunk chunk;
  int64_t expected_index = 0;
  for (;;) {
    auto more = (*reader)->Next(&chunk);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) break;
    EXPECT_EQ(chunk.index, expected_index++);
    EXPECT_EQ(chunk.first_line, out.empty() ? 1 : out.back().number + 1);
    for (size_t i = 0; i < chunk.lines.size(); ++i) {
      out.push_back({chunk.first_line + static_cast<int64_t>(i),
                     chunk.lines[i].too_long ? "<too long>" : std::string(chunk.line(i))});
    }
    if (end_offset) *end_offset = chunk.end_offset;
  }
  return out;
}

TEST(LineReaderTest, LinesNumbersAndOffsetsForEveryChunkSize) {
  TempDir dir;
  const std::string text = "one\n\ntwo two\r\nthree\nlast without newline";
  WriteFile(dir / "in.jsonl", text);
  const std::vector<ReadLine> want = {
      {1, "one"}, {2, ""}, {3, "two two\r"}, {4, "three"}, {5, "last without newline"}};
  for (int64_t chunk = 1; chunk <= 50; ++chunk) {
    int64_t end = 0;
    EXPECT_EQ(ReadAll(dir / "in.jsonl", chunk, 1000, &end), want) << "chunk " << chunk;
    EXPECT_EQ(end, static_cast<int64_t>(text.size()));
  }
}

TEST(LineReaderTest, TooLongLinesAreDroppedWithoutBufferingAtAnyBoundary) {
  TempDir dir;
  const std::string long_line(10000, 'x');
  WriteFile(dir / "in.jsonl", "ok\n" + long_line + "\nfine\n" + long_line);
  const std::vector<ReadLine> want = {{1, "ok"}, {2, "<too long>"}, {3, "fine"}, {4, "<too long>"}};
  for (int64_t chunk : {1, 2, 3, 7, 100, 5000, 20000}) {
    EXPECT_EQ(ReadAll(dir / "in.jsonl", chunk, 100), want) << "chunk " << chunk;
  }
  // A line exactly at the limit is kept.
  WriteFile(dir / "edge.jsonl", std::string(100, 'y') + "\n" + std::string(101, 'z') + "\n");
  auto lines = ReadAll(dir / "edge.jsonl", 1, 100);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].text, std::string(100, 'y'));
  EXPECT_EQ(lines[1].text, "<too long>");
}

TEST(LineReaderTest, EmptyFileAndMissingFile) {
  TempDir dir;
  WriteFile(dir / "empty.jsonl", "");
  EXPECT_TRUE(ReadAll(dir / "empty.jsonl", 10, 10).empty());
  WriteFile(dir / "newline.jsonl", "\n");
  EXPECT_EQ(ReadAll(dir / "newline.jsonl", 10, 10), (std::vector<ReadLine>{{1, ""}}));
  auto missing = LineReader::Open(dir / "missing.jsonl", 10, 10);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("missing.jsonl"), std::string::npos);
  EXPECT_FALSE(LineReader::Open(dir.path(), 10, 10).ok());  // a directory
}

}  // namespace
}  // namespace dflash::data
