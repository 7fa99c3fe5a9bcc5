// The prepared data set: one file holding a tokenized training set, written once by
// `dflashctl prepare` (common/data/prepare.h) and memory-mapped by the coordinator, which packs
// batches from it through batching::DocumentSource. docs/data.md describes it for users.
//
// Layout (all integers little-endian; sections start on 64-byte boundaries, gaps are zero):
//
//   offset 0     header, kPreparedHeaderBytes (8192) bytes:
//                  magic "DFLPREP1" (8 bytes), format_version u32, header_bytes u32,
//                  file_bytes u64 (the whole file, trailer included),
//                  tokenizer_fingerprint char[80] (NUL-padded), vocab_size i64,
//                  data_format char[16], chat_template char[16] ("none" unless format is chat),
//                  block_size i32, reserved u32, max_length i64,
//                  source_bytes i64, source_mtime_ns i64,
//                  num_documents i64, num_tokens i64, num_supervised i64,
//                  sections[4] {offset u64, bytes u64}: tokens, loss_mask, doc_offsets, report,
//                  source_path_bytes u32, source_path char[4096] (PATH_MAX), zero padding.
//   tokens       int32 x num_tokens: every document's ids, concatenated in input order
//   loss_mask    uint8 x num_tokens: 1 = supervised, 0 otherwise
//   doc_offsets  int64 x (num_documents + 1): document i is tokens [off[i], off[i+1])
//   report       the prepare report as UTF-8 JSON (PrepareReport::ToJson)
//   trailer      16 bytes: crc32 u32 (zlib CRC-32 of every byte before the trailer), reserved u32,
//                end magic "DFLPEND1"
//
// The reader refuses (naming the file and what differs): a file shorter than its header or than the
// size the header declares (truncation), a wrong magic (foreign file), another format version,
// sections out of range or inconsistent with the counts, a checksum mismatch, offsets that do not
// start at 0, decrease or end past num_tokens, and (when expected) another tokenizer fingerprint.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/batching/document_source.h"

namespace dflash::data {

inline constexpr char kPreparedMagic[8] = {'D', 'F', 'L', 'P', 'R', 'E', 'P', '1'};
inline constexpr char kPreparedEndMagic[8] = {'D', 'F', 'L', 'P', 'E', 'N', 'D', '1'};
inline constexpr uint32_t kPreparedFormatVersion = 1;
inline constexpr uint32_t kPreparedHeaderBytes = 8192;
inline constexpr uint32_t kPreparedTrailerBytes = 16;

// What the header records besides the counts. The writer takes it; the reader returns it.
struct PreparedMetadata {
  std::string tokenizer_fingerprint;  // Tokenizer::fingerprint() (at most 79 bytes)
  int64_t vocab_size = 0;
  std::string data_format = "chat";    // DataFormatName
  std::string chat_template = "none";  // ChatTemplateName, or "none" for pretokenized/text
  int32_t block_size = 0;
  int64_t max_length = 0;
  std::string source_path;  // the input JSONL as given to prepare (at most 4096 bytes)
  int64_t source_bytes = 0;
  int64_t source_mtime_ns = 0;
  // Filled by the writer at Finish / read from the header:
  int64_t num_documents = 0;
  int64_t num_tokens = 0;
  int64_t num_supervised = 0;
};

// Streams documents into `<path>.tmp` (loss masks go to `<path>.tmp.mask` until Finish), then
// Finish writes the header, checksum and trailer, fsyncs and renames onto `path`: a crash or an
// error never leaves a partial file under the final name. Destroying an unfinished writer removes
// its temporary files.
class PreparedWriter {
 public:
  static absl::StatusOr<std::unique_ptr<PreparedWriter>> Create(const std::filesystem::path& path,
                                                                const PreparedMetadata& metadata);
  ~PreparedWriter();
  PreparedWriter(const PreparedWriter&) = delete;
  PreparedWriter& operator=(const PreparedWriter&) = delete;

  // Appends one document; tokens and loss_mask must have the same length.
  absl::Status Append(absl::Span<const int32_t> tokens, absl::Span<const uint8_t> loss_mask);
  // Writes the report section, header and trailer; fsyncs; renames into place.
  absl::Status Finish(absl::string_view report_json);
  // Removes the temporary files (also done by the destructor when Finish did not succeed).
  void Abandon();

  int64_t num_documents() const { return num_documents_; }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  struct Files;
  PreparedWriter(std::filesystem::path path, PreparedMetadata metadata,
                 std::unique_ptr<Files> files);

  std::filesystem::path path_;
  PreparedMetadata metadata_;
  std::unique_ptr<Files> files_;
  int64_t num_documents_ = 0;
  int64_t num_tokens_ = 0;
  int64_t num_supervised_ = 0;
  bool finished_ = false;
};

struct PreparedOpenOptions {
  // When not empty, a file prepared with another tokenizer is refused (FailedPrecondition).
  std::string expected_fingerprint;
  // Checksum over the whole file, and every id in [0, vocab_size) and mask value in {0, 1}: one
  // sequential pass over the file (about a second per few GB). Structural checks (sizes, offsets)
  // are always made.
  bool verify = true;
};

// A read-only, memory-mapped prepared data set. Document views point into the mapping and stay
// valid as long as this object lives. Thread-safe for concurrent reads.
class PreparedDataset : public batching::DocumentSource {
 public:
  using OpenOptions = PreparedOpenOptions;

  static absl::StatusOr<std::unique_ptr<PreparedDataset>> Open(const std::filesystem::path& path,
                                                               const OpenOptions& options = {});
  ~PreparedDataset() override;
  PreparedDataset(const PreparedDataset&) = delete;
  PreparedDataset& operator=(const PreparedDataset&) = delete;

  int64_t num_documents() const override { return metadata_.num_documents; }
  int64_t length(int64_t i) const override { return offsets_[i + 1] - offsets_[i]; }
  batching::DocumentView document(int64_t i) const override;

  const PreparedMetadata& metadata() const { return metadata_; }
  const std::filesystem::path& path() const { return path_; }
  // The prepare report stored in the file (JSON text; PrepareReport::FromJson parses it).
  absl::string_view report_json() const { return report_json_; }
  absl::Span<const int32_t> all_tokens() const { return tokens_; }
  absl::Span<const uint8_t> all_loss_mask() const { return loss_mask_; }
  absl::Span<const int64_t> offsets() const { return offsets_; }

 private:
  PreparedDataset() = default;

  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  PreparedMetadata metadata_;
  absl::Span<const int32_t> tokens_;
  absl::Span<const uint8_t> loss_mask_;
  absl::Span<const int64_t> offsets_;
  absl::string_view report_json_;
};

}  // namespace dflash::data
