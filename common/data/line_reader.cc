#include "common/data/line_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace dflash::data {

absl::StatusOr<std::unique_ptr<LineReader>> LineReader::Open(const std::filesystem::path& path,
                                                             int64_t chunk_bytes,
                                                             int64_t max_line_bytes) {
  if (chunk_bytes < 1 || max_line_bytes < 1) {
    return absl::InvalidArgumentError("LineReader: chunk_bytes and max_line_bytes must be >= 1");
  }
  std::unique_ptr<LineReader> r(new LineReader());
  r->path_ = path;
  r->chunk_bytes_ = chunk_bytes;
  r->max_line_bytes_ = max_line_bytes;
  r->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (r->fd_ < 0) {
    return absl::NotFoundError(
        absl::StrCat(path.string(), ": cannot open: ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(r->fd_, &st) != 0) {
    return absl::InternalError(absl::StrCat(path.string(), ": stat: ", std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": is a directory"));
  }
  if (S_ISREG(st.st_mode)) r->total_bytes_ = st.st_size;
  ::posix_fadvise(r->fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
  return r;
}

LineReader::~LineReader() {
  if (fd_ >= 0) ::close(fd_);
}

void LineReader::EmitLine(LineChunk* chunk, absl::string_view line, bool too_long) {
  LineChunk::Line entry;
  entry.begin = chunk->bytes.size();
  entry.too_long = too_long;
  if (!too_long) {
    entry.size = line.size();
    chunk->bytes.append(line.data(), line.size());
  }
  chunk->lines.push_back(entry);
  ++next_line_;
}

bool LineReader::Carve(LineChunk* chunk) {
  size_t pos = 0;
  bool full = false;
  while (!(full = static_cast<int64_t>(chunk->bytes.size()) >= chunk_bytes_)) {
    const size_t nl = pending_.find('\n', pos);
    if (nl == std::string::npos) {
      // An unfinished line already over the limit is dropped now so that memory stays bounded.
      if (!skipping_ && static_cast<int64_t>(pending_.size() - pos) > max_line_bytes_) {
        skipping_ = true;
      }
      if (skipping_) {
        consumed_ += static_cast<int64_t>(pending_.size() - pos);
        pos = pending_.size();
      }
      break;
    }
    const size_t len = nl - pos;
    const bool too_long = skipping_ || static_cast<int64_t>(len) > max_line_bytes_;
    EmitLine(chunk, absl::string_view(pending_).substr(pos, len), too_long);
    skipping_ = false;
    consumed_ += static_cast<int64_t>(len + 1);
    pos = nl + 1;
  }
  pending_.erase(0, pos);
  return full;
}

absl::Status LineReader::Fill() {
  // Reads of at least 4 KiB even for tiny test chunks; at most 8 MiB beyond the pending bytes.
  const size_t block =
      static_cast<size_t>(std::max<int64_t>(4096, std::min<int64_t>(chunk_bytes_, 8 << 20)));
  const size_t old = pending_.size();
  pending_.resize(old + block);
  for (;;) {
    const ssize_t n = ::read(fd_, pending_.data() + old, block);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      pending_.resize(old);
      return absl::InternalError(absl::StrCat(path_.string(), ": read: ", std::strerror(errno)));
    }
    pending_.resize(old + static_cast<size_t>(n));
    if (n == 0) eof_ = true;
    return absl::OkStatus();
  }
}

absl::StatusOr<bool> LineReader::Next(LineChunk* chunk) {
  chunk->bytes.clear();
  chunk->lines.clear();
  chunk->first_line = next_line_;
  for (;;) {
    if (Carve(chunk)) break;
    if (eof_) {
      // The last line may lack its '\n'.
      if (skipping_ || !pending_.empty()) {
        const bool too_long = skipping_ || static_cast<int64_t>(pending_.size()) > max_line_bytes_;
        consumed_ += static_cast<int64_t>(pending_.size());
        EmitLine(chunk, pending_, too_long);
        pending_.clear();
        skipping_ = false;
      }
      break;
    }
    RETURN_IF_ERROR(Fill());
  }
  chunk->end_offset = consumed_;
  if (chunk->lines.empty()) return false;
  chunk->index = next_index_++;
  return true;
}

}  // namespace dflash::data
