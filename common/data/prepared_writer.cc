// PreparedWriter: streams a prepared data set into <path>.tmp and renames it into place.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/data/prepared.h"
#include "common/data/prepared_format.h"

namespace dflash::data {
namespace {

namespace fs = std::filesystem;
namespace pf = prepared_format;

absl::Status Errno(absl::string_view what, const fs::path& path) {
  return absl::InternalError(absl::StrCat(what, " ", path.string(), ": ", std::strerror(errno)));
}

// An append-only file with a write buffer and a running CRC-32 of everything written.
class OutFile {
 public:
  ~OutFile() { Close(); }
  absl::Status Open(const fs::path& path) {
    path_ = path;
    fd_ = ::open(path.c_str(), O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0644);
    if (fd_ < 0) return Errno("cannot create", path);
    buffer_.reserve(kBufferBytes);
    return absl::OkStatus();
  }
  absl::Status Write(const void* data, size_t n) {
    // crc32_z(crc, NULL, 0) returns the initial value, not crc: an empty document (data() of an
    // empty vector may be null) must not reset the running checksum.
    if (n == 0) return absl::OkStatus();
    const auto* p = static_cast<const uint8_t*>(data);
    crc_ = crc32_z(crc_, p, n);
    bytes_ += n;
    if (buffer_.size() + n > kBufferBytes) RETURN_IF_ERROR(Flush());
    if (n >= kBufferBytes) return WriteAll(p, n);
    buffer_.insert(buffer_.end(), p, p + n);
    return absl::OkStatus();
  }
  absl::Status Zeros(size_t n) {
    static const uint8_t kZeros[pf::kSectionAlign] = {};
    while (n > 0) {
      const size_t k = std::min<size_t>(n, sizeof(kZeros));
      RETURN_IF_ERROR(Write(kZeros, k));
      n -= k;
    }
    return absl::OkStatus();
  }
  absl::Status PadTo(uint64_t offset) { return Zeros(offset - bytes_); }
  // Moves the write position to `offset` (an empty file's reserved header); bytes() then counts
  // from the start of the file while the CRC covers only what is written from here on.
  absl::Status SkipTo(uint64_t offset) {
    RETURN_IF_ERROR(Flush());
    if (::lseek(fd_, static_cast<off_t>(offset), SEEK_SET) < 0) return Errno("cannot seek", path_);
    bytes_ = offset;
    return absl::OkStatus();
  }
  absl::Status Flush() {
    RETURN_IF_ERROR(WriteAll(buffer_.data(), buffer_.size()));
    buffer_.clear();
    return absl::OkStatus();
  }
  // Writes `n` bytes at `offset` without touching the running CRC or size (the header).
  absl::Status PWrite(const void* data, size_t n, uint64_t offset) {
    if (::pwrite(fd_, data, n, static_cast<off_t>(offset)) != static_cast<ssize_t>(n)) {
      return Errno("cannot write", path_);
    }
    return absl::OkStatus();
  }
  absl::Status Sync() {
    RETURN_IF_ERROR(Flush());
    if (::fsync(fd_) != 0) return Errno("cannot fsync", path_);
    return absl::OkStatus();
  }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd() const { return fd_; }
  uint64_t bytes() const { return bytes_; }
  uLong crc() const { return crc_; }
  const fs::path& path() const { return path_; }

 private:
  static constexpr size_t kBufferBytes = 4 << 20;
  absl::Status WriteAll(const uint8_t* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return Errno("cannot write", path_);
      p += w;
      n -= static_cast<size_t>(w);
    }
    return absl::OkStatus();
  }

  fs::path path_;
  int fd_ = -1;
  std::vector<uint8_t> buffer_;
  uint64_t bytes_ = 0;
  uLong crc_ = crc32_z(0, nullptr, 0);
};

absl::Status SyncDirectory(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Errno("cannot fsync directory", dir);
  return absl::OkStatus();
}

}  // namespace

// The body of the file (everything after the header) goes to `main`, except the loss masks, which
// are streamed to `mask` and appended at Finish (the sections must be contiguous, and a mask held
// in memory would cost a byte per token of the whole data set).
struct PreparedWriter::Files {
  OutFile main;
  OutFile mask;
  std::vector<int64_t> offsets{0};
};

absl::StatusOr<std::unique_ptr<PreparedWriter>> PreparedWriter::Create(
    const fs::path& path, const PreparedMetadata& metadata) {
  if (metadata.tokenizer_fingerprint.size() >= pf::kFingerprintLen) {
    return absl::InvalidArgumentError("tokenizer fingerprint longer than 79 bytes");
  }
  if (metadata.data_format.size() >= pf::kNameLen ||
      metadata.chat_template.size() >= pf::kNameLen) {
    return absl::InvalidArgumentError("data format or chat template name longer than 15 bytes");
  }
  if (metadata.source_path.size() > pf::kSourcePathMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("source path longer than ", pf::kSourcePathMax, " bytes"));
  }
  auto files = std::make_unique<Files>();
  fs::path tmp = path;
  tmp += ".tmp";
  fs::path mask_tmp = path;
  mask_tmp += ".tmp.mask";
  std::unique_ptr<PreparedWriter> writer(new PreparedWriter(path, metadata, std::move(files)));
  // From here on the destructor removes whatever was created.
  RETURN_IF_ERROR(writer->files_->main.Open(tmp));
  RETURN_IF_ERROR(writer->files_->mask.Open(mask_tmp));
  // The header is written last (it holds the counts); its space is skipped now.
  RETURN_IF_ERROR(writer->files_->main.SkipTo(kPreparedHeaderBytes));
  return writer;
}

PreparedWriter::PreparedWriter(fs::path path, PreparedMetadata metadata,
                               std::unique_ptr<Files> files)
    : path_(std::move(path)), metadata_(std::move(metadata)), files_(std::move(files)) {}

PreparedWriter::~PreparedWriter() {
  if (!finished_) Abandon();
}

void PreparedWriter::Abandon() {
  if (files_ == nullptr) return;
  for (OutFile* f : {&files_->main, &files_->mask}) {
    f->Close();
    std::error_code ec;
    if (!f->path().empty()) fs::remove(f->path(), ec);
  }
}

absl::Status PreparedWriter::Append(absl::Span<const int32_t> tokens,
                                    absl::Span<const uint8_t> loss_mask) {
  if (finished_) return absl::FailedPreconditionError("PreparedWriter: Append after Finish");
  if (tokens.size() != loss_mask.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PreparedWriter: ", tokens.size(), " tokens but ", loss_mask.size(), " loss mask entries"));
  }
  RETURN_IF_ERROR(files_->main.Write(tokens.data(), tokens.size() * sizeof(int32_t)));
  RETURN_IF_ERROR(files_->mask.Write(loss_mask.data(), loss_mask.size()));
  for (uint8_t m : loss_mask) num_supervised_ += m != 0;
  num_tokens_ += static_cast<int64_t>(tokens.size());
  ++num_documents_;
  files_->offsets.push_back(num_tokens_);
  return absl::OkStatus();
}

namespace {

// Copies the finished mask file onto the end of `out`.
absl::Status AppendFile(OutFile& src, OutFile& out) {
  RETURN_IF_ERROR(src.Flush());
  if (::lseek(src.fd(), 0, SEEK_SET) < 0) return Errno("cannot seek", src.path());
  std::vector<uint8_t> buffer(4 << 20);
  for (;;) {
    const ssize_t n = ::read(src.fd(), buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("cannot read", src.path());
    if (n == 0) break;
    RETURN_IF_ERROR(out.Write(buffer.data(), static_cast<size_t>(n)));
  }
  return absl::OkStatus();
}

std::vector<uint8_t> BuildHeader(const PreparedMetadata& m, const uint64_t sections[][2],
                                 uint64_t file_bytes) {
  std::vector<uint8_t> h(kPreparedHeaderBytes, 0);
  uint8_t* p = h.data();
  std::memcpy(p + pf::kMagic, kPreparedMagic, sizeof(kPreparedMagic));
  pf::PutU32(p, pf::kVersion, kPreparedFormatVersion);
  pf::PutU32(p, pf::kHeaderBytes, kPreparedHeaderBytes);
  pf::PutU64(p, pf::kFileBytes, file_bytes);
  pf::PutText(p, pf::kFingerprint, pf::kFingerprintLen, m.tokenizer_fingerprint);
  pf::PutU64(p, pf::kVocabSize, static_cast<uint64_t>(m.vocab_size));
  pf::PutText(p, pf::kDataFormat, pf::kNameLen, m.data_format);
  pf::PutText(p, pf::kChatTemplate, pf::kNameLen, m.chat_template);
  pf::PutU32(p, pf::kBlockSize, static_cast<uint32_t>(m.block_size));
  pf::PutU64(p, pf::kMaxLength, static_cast<uint64_t>(m.max_length));
  pf::PutU64(p, pf::kSourceBytes, static_cast<uint64_t>(m.source_bytes));
  pf::PutU64(p, pf::kSourceMtimeNs, static_cast<uint64_t>(m.source_mtime_ns));
  pf::PutU64(p, pf::kNumDocuments, static_cast<uint64_t>(m.num_documents));
  pf::PutU64(p, pf::kNumTokens, static_cast<uint64_t>(m.num_tokens));
  pf::PutU64(p, pf::kNumSupervised, static_cast<uint64_t>(m.num_supervised));
  for (size_t s = 0; s < pf::kNumSections; ++s) {
    pf::PutU64(p, pf::kSections + 16 * s, sections[s][0]);
    pf::PutU64(p, pf::kSections + 16 * s + 8, sections[s][1]);
  }
  pf::PutU32(p, pf::kSourcePathBytes, static_cast<uint32_t>(m.source_path.size()));
  pf::PutText(p, pf::kSourcePath, pf::kSourcePathMax, m.source_path);
  return h;
}

}  // namespace

absl::Status PreparedWriter::Finish(absl::string_view report_json) {
  if (finished_) return absl::FailedPreconditionError("PreparedWriter: Finish called twice");
  OutFile& out = files_->main;
  uint64_t sections[pf::kNumSections][2];
  sections[pf::kTokens][0] = kPreparedHeaderBytes;
  sections[pf::kTokens][1] = out.bytes() - kPreparedHeaderBytes;
  RETURN_IF_ERROR(out.PadTo(pf::AlignUp(out.bytes())));
  sections[pf::kLossMask][0] = out.bytes();
  RETURN_IF_ERROR(AppendFile(files_->mask, out));
  sections[pf::kLossMask][1] = out.bytes() - sections[pf::kLossMask][0];
  RETURN_IF_ERROR(out.PadTo(pf::AlignUp(out.bytes())));
  sections[pf::kDocOffsets][0] = out.bytes();
  sections[pf::kDocOffsets][1] = files_->offsets.size() * sizeof(int64_t);
  RETURN_IF_ERROR(out.Write(files_->offsets.data(), sections[pf::kDocOffsets][1]));
  RETURN_IF_ERROR(out.PadTo(pf::AlignUp(out.bytes())));
  sections[pf::kReport][0] = out.bytes();
  sections[pf::kReport][1] = report_json.size();
  RETURN_IF_ERROR(out.Write(report_json.data(), report_json.size()));

  metadata_.num_documents = num_documents_;
  metadata_.num_tokens = num_tokens_;
  metadata_.num_supervised = num_supervised_;
  const uint64_t file_bytes = out.bytes() + kPreparedTrailerBytes;
  const std::vector<uint8_t> header = BuildHeader(metadata_, sections, file_bytes);
  // CRC(header || body) from the two parts: the body was checksummed while it streamed.
  const uLong crc = crc32_combine(crc32_z(crc32_z(0, nullptr, 0), header.data(), header.size()),
                                  out.crc(), static_cast<z_off_t>(out.bytes() - header.size()));
  uint8_t trailer[kPreparedTrailerBytes] = {};
  pf::PutU32(trailer, 0, static_cast<uint32_t>(crc));
  std::memcpy(trailer + 8, kPreparedEndMagic, sizeof(kPreparedEndMagic));
  RETURN_IF_ERROR(out.Write(trailer, sizeof(trailer)));
  RETURN_IF_ERROR(out.Flush());
  RETURN_IF_ERROR(out.PWrite(header.data(), header.size(), 0));
  RETURN_IF_ERROR(out.Sync());
  out.Close();
  if (::rename(out.path().c_str(), path_.c_str()) != 0) return Errno("cannot rename onto", path_);
  finished_ = true;
  files_->mask.Close();
  std::error_code ec;
  fs::remove(files_->mask.path(), ec);
  return SyncDirectory(path_.parent_path());
}

}  // namespace dflash::data
