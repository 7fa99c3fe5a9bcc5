// PreparedDataset: the memory-mapped reader of the prepared data set (layout in prepared.h). The
// file is untrusted input: every size, offset and count is checked before a span is formed.
#include "common/data/prepared.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/data/prepared_format.h"

namespace dflash::data {
namespace {

namespace fs = std::filesystem;
namespace pf = prepared_format;

// "<file>: <what>": every refusal names the file.
absl::Status Refuse(const fs::path& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path.string(), ": ", what));
}

// zlib's crc32_z takes size_t, so one call covers a multi-GB mapping.
uint32_t Crc32(const uint8_t* data, size_t n) {
  return static_cast<uint32_t>(crc32_z(crc32_z(0, nullptr, 0), data, n));
}

PreparedMetadata ReadMetadata(const uint8_t* h) {
  PreparedMetadata m;
  m.tokenizer_fingerprint = pf::GetText(h, pf::kFingerprint, pf::kFingerprintLen);
  m.vocab_size = static_cast<int64_t>(pf::GetU64(h, pf::kVocabSize));
  m.data_format = pf::GetText(h, pf::kDataFormat, pf::kNameLen);
  m.chat_template = pf::GetText(h, pf::kChatTemplate, pf::kNameLen);
  m.block_size = static_cast<int32_t>(pf::GetU32(h, pf::kBlockSize));
  m.max_length = static_cast<int64_t>(pf::GetU64(h, pf::kMaxLength));
  m.source_bytes = static_cast<int64_t>(pf::GetU64(h, pf::kSourceBytes));
  m.source_mtime_ns = static_cast<int64_t>(pf::GetU64(h, pf::kSourceMtimeNs));
  m.num_documents = static_cast<int64_t>(pf::GetU64(h, pf::kNumDocuments));
  m.num_tokens = static_cast<int64_t>(pf::GetU64(h, pf::kNumTokens));
  m.num_supervised = static_cast<int64_t>(pf::GetU64(h, pf::kNumSupervised));
  const uint32_t path_bytes = std::min<uint32_t>(pf::GetU32(h, pf::kSourcePathBytes),
                                                 static_cast<uint32_t>(pf::kSourcePathMax));
  m.source_path.assign(reinterpret_cast<const char*>(h + pf::kSourcePath), path_bytes);
  return m;
}

// Magic, version and declared size: what tells a foreign, newer or truncated file apart.
absl::Status CheckIdentity(const fs::path& path, const uint8_t* base, uint64_t size) {
  if (size < sizeof(kPreparedMagic) && std::memcmp(base, kPreparedMagic, size) == 0) {
    return Refuse(path, absl::StrCat("truncated: ", size, " bytes, shorter than the header"));
  }
  if (size < 8 || std::memcmp(base + pf::kMagic, kPreparedMagic, sizeof(kPreparedMagic)) != 0) {
    return Refuse(path, "not a dflash prepared data set (bad magic); run dflashctl prepare");
  }
  if (size < kPreparedHeaderBytes + kPreparedTrailerBytes) {
    return Refuse(path, absl::StrCat("truncated: ", size, " bytes, shorter than the header"));
  }
  const uint32_t version = pf::GetU32(base, pf::kVersion);
  if (version != kPreparedFormatVersion) {
    return Refuse(path, absl::StrCat("format version ", version, ", this build reads version ",
                                     kPreparedFormatVersion, "; prepare the data again"));
  }
  const uint32_t header_bytes = pf::GetU32(base, pf::kHeaderBytes);
  if (header_bytes != kPreparedHeaderBytes) {
    return Refuse(path,
                  absl::StrCat("header size ", header_bytes, ", expected ", kPreparedHeaderBytes));
  }
  const uint64_t file_bytes = pf::GetU64(base, pf::kFileBytes);
  if (file_bytes != size) {
    return Refuse(
        path, absl::StrCat(size < file_bytes ? "truncated" : "has trailing bytes",
                           ": the header declares ", file_bytes, " bytes but the file has ", size));
  }
  const uint8_t* trailer = base + size - kPreparedTrailerBytes;
  if (std::memcmp(trailer + 8, kPreparedEndMagic, sizeof(kPreparedEndMagic)) != 0 ||
      pf::GetU32(trailer, 4) != 0) {
    return Refuse(path, "bad end marker (the file was not completely written)");
  }
  return absl::OkStatus();
}

// Section table against the counts and the file size.
absl::Status CheckSections(const fs::path& path, const uint8_t* base, uint64_t size,
                           const PreparedMetadata& m, uint64_t sections[][2]) {
  if (m.num_documents < 0 || m.num_tokens < 0 || m.num_supervised < 0 ||
      m.num_supervised > m.num_tokens || m.vocab_size <= 0 || m.vocab_size > INT32_MAX) {
    return Refuse(path, "header counts out of range");
  }
  const uint64_t docs = static_cast<uint64_t>(m.num_documents);
  const uint64_t toks = static_cast<uint64_t>(m.num_tokens);
  // Counts are < 2^62 after these checks, so the products below cannot overflow.
  if (docs > (uint64_t{1} << 58) || toks > (uint64_t{1} << 60)) {
    return Refuse(path, "header counts out of range");
  }
  const uint64_t expected[pf::kNumSections] = {toks * 4, toks, (docs + 1) * 8, 0};
  uint64_t end = kPreparedHeaderBytes;
  for (size_t s = 0; s < pf::kNumSections; ++s) {
    const uint64_t off = pf::GetU64(base, pf::kSections + 16 * s);
    const uint64_t bytes = pf::GetU64(base, pf::kSections + 16 * s + 8);
    const uint64_t limit = size - kPreparedTrailerBytes;
    // In order, non-overlapping, aligned, inside the file.
    if (off < end || off % pf::kSectionAlign != 0 || off > limit || bytes > limit - off) {
      return Refuse(path, absl::StrCat("section ", pf::kSectionNames[s], " [", off, ", +", bytes,
                                       ") lies outside the file or overlaps another"));
    }
    if (s != pf::kReport && bytes != expected[s]) {
      return Refuse(path, absl::StrCat("section ", pf::kSectionNames[s], " has ", bytes,
                                       " bytes, the counts require ", expected[s]));
    }
    sections[s][0] = off;
    sections[s][1] = bytes;
    end = off + bytes;
  }
  return absl::OkStatus();
}

// Offsets start at 0, never decrease and end at num_tokens: what makes every document span safe.
absl::Status CheckOffsets(const fs::path& path, absl::Span<const int64_t> offsets,
                          int64_t num_tokens) {
  if (offsets.front() != 0) return Refuse(path, "doc_offsets[0] is not 0");
  for (size_t i = 1; i < offsets.size(); ++i) {
    if (offsets[i] < offsets[i - 1]) {
      return Refuse(path, absl::StrCat("doc_offsets[", i, "] = ", offsets[i],
                                       " is below doc_offsets[", i - 1, "] = ", offsets[i - 1]));
    }
  }
  if (offsets.back() != num_tokens) {
    return Refuse(path, absl::StrCat("doc_offsets ends at ", offsets.back(), ", not at num_tokens ",
                                     num_tokens));
  }
  return absl::OkStatus();
}

// Checksum, then the contents the checksum cannot vouch for when the writer itself was wrong.
absl::Status Verify(const fs::path& path, const uint8_t* base, uint64_t size,
                    const PreparedMetadata& m, absl::Span<const int32_t> tokens,
                    absl::Span<const uint8_t> mask) {
  const uint32_t stored = pf::GetU32(base + size - kPreparedTrailerBytes, 0);
  const uint32_t actual = Crc32(base, size - kPreparedTrailerBytes);
  if (stored != actual) {
    return Refuse(path, absl::StrCat("checksum mismatch (stored ", absl::Hex(stored), ", computed ",
                                     absl::Hex(actual), "): the file is corrupt"));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= m.vocab_size) {
      return Refuse(path, absl::StrCat("token ", i, " has id ", tokens[i], ", outside [0, ",
                                       m.vocab_size, ")"));
    }
  }
  int64_t supervised = 0;
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i] > 1) return Refuse(path, absl::StrCat("loss_mask[", i, "] is ", int{mask[i]}));
    supervised += mask[i];
  }
  if (supervised != m.num_supervised) {
    return Refuse(path, absl::StrCat("loss mask has ", supervised,
                                     " supervised tokens, the header says ", m.num_supervised));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PreparedDataset>> PreparedDataset::Open(const fs::path& path,
                                                                       const OpenOptions& options) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat(path.string(), ": cannot open: ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Refuse(path, "not a regular file");
  }
  std::unique_ptr<PreparedDataset> ds(new PreparedDataset());
  ds->path_ = path;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return Refuse(path, "empty file (not a dflash prepared data set)");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file
  if (map == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(path.string(), ": mmap: ", std::strerror(errno)));
  }
  ds->map_ = map;
  ds->map_bytes_ = size;
  const auto* base = static_cast<const uint8_t*>(map);
  RETURN_IF_ERROR(CheckIdentity(path, base, size));
  ds->metadata_ = ReadMetadata(base);
  const PreparedMetadata& m = ds->metadata_;
  if (!options.expected_fingerprint.empty() &&
      m.tokenizer_fingerprint != options.expected_fingerprint) {
    return absl::FailedPreconditionError(
        absl::StrCat(path.string(), ": prepared with tokenizer ", m.tokenizer_fingerprint,
                     " but the run's tokenizer is ", options.expected_fingerprint,
                     "; prepare the data again with the run's tokenizer"));
  }
  uint64_t sections[pf::kNumSections][2];
  RETURN_IF_ERROR(CheckSections(path, base, size, m, sections));
  ds->tokens_ = absl::MakeConstSpan(
      reinterpret_cast<const int32_t*>(base + sections[pf::kTokens][0]), m.num_tokens);
  ds->loss_mask_ = absl::MakeConstSpan(base + sections[pf::kLossMask][0], m.num_tokens);
  ds->offsets_ = absl::MakeConstSpan(
      reinterpret_cast<const int64_t*>(base + sections[pf::kDocOffsets][0]), m.num_documents + 1);
  ds->report_json_ = absl::string_view(
      reinterpret_cast<const char*>(base + sections[pf::kReport][0]), sections[pf::kReport][1]);
  if (options.verify) RETURN_IF_ERROR(Verify(path, base, size, m, ds->tokens_, ds->loss_mask_));
  RETURN_IF_ERROR(CheckOffsets(path, ds->offsets_, m.num_tokens));
  return ds;
}

PreparedDataset::~PreparedDataset() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

batching::DocumentView PreparedDataset::document(int64_t i) const {
  const int64_t begin = offsets_[i];
  const int64_t n = offsets_[i + 1] - begin;
  return {tokens_.subspan(begin, n), loss_mask_.subspan(begin, n)};
}

}  // namespace dflash::data
