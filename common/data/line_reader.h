// Cuts a JSONL file into chunks of whole lines without ever holding more than about one chunk plus
// one line limit of it in memory. Used by the prepare engine (prepare.cc); separate so tests can
// drive it with odd inputs (no final newline, CRLF, over-long lines at chunk boundaries).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dflash::data {

// A run of consecutive input lines.
struct LineChunk {
  struct Line {
    size_t begin = 0;       // into `bytes`
    size_t size = 0;        // without the '\n'
    bool too_long = false;  // longer than the limit; its bytes were discarded (size is 0)
  };
  int64_t index = 0;       // 0, 1, 2, ... in input order
  int64_t first_line = 1;  // 1-based line number of lines[0]
  int64_t end_offset = 0;  // input bytes consumed up to the end of this chunk
  std::string bytes;
  std::vector<Line> lines;

  absl::string_view line(size_t i) const {
    return absl::string_view(bytes).substr(lines[i].begin, lines[i].size);
  }
};

class LineReader {
 public:
  // chunk_bytes: a chunk closes once it holds at least this many bytes (whole lines only).
  // max_line_bytes: a longer line is reported as too_long and skipped without buffering it.
  static absl::StatusOr<std::unique_ptr<LineReader>> Open(const std::filesystem::path& path,
                                                          int64_t chunk_bytes,
                                                          int64_t max_line_bytes);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // Fills *chunk with the next lines; returns false at the end of the input (chunk left empty).
  absl::StatusOr<bool> Next(LineChunk* chunk);

  // Size of the input when it was opened (0 when it is not a regular file).
  int64_t total_bytes() const { return total_bytes_; }

 private:
  LineReader() = default;
  void EmitLine(LineChunk* chunk, absl::string_view line, bool too_long);
  // Moves complete lines from pending_ into *chunk until it is full; returns true when full.
  bool Carve(LineChunk* chunk);
  absl::Status Fill();

  std::filesystem::path path_;
  int fd_ = -1;
  int64_t chunk_bytes_ = 0;
  int64_t max_line_bytes_ = 0;
  int64_t total_bytes_ = 0;
  std::string pending_;    // read, not yet assigned; starts at a line start unless skipping_
  bool skipping_ = false;  // inside a too-long line, discarding until its '\n'
  bool eof_ = false;
  int64_t next_line_ = 1;
  int64_t next_index_ = 0;
  int64_t consumed_ = 0;  // bytes assigned to chunks (or discarded from too-long lines)
};

}  // namespace dflash::data
