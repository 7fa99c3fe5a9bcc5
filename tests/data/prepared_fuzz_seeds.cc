// Writes the generated seeds of fuzz_corpus_prepared/ (the gen_* files) with PreparedWriter, the
// writer `dflashctl prepare` uses, plus corrupted variants with a valid checksum (so that the
// reader's structural checks, not the checksum, refuse them). The other seeds are `chat`, the
// output of `dflashctl prepare` with the Qwen2 tokenizer on a tiny JSONL file, and `magic_only`.
//   prepared_fuzz_seeds --write DIR   writes the gen_* seeds into DIR
//   prepared_fuzz_seeds --check DIR   fails unless DIR holds exactly what --write would write
// ctest runs --check on the checked-in corpus, so that a change of the file format that leaves the
// seeds stale (and the fuzzer starting from refused files) fails the build's tests.
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "common/data/prepared.h"
#include "common/data/prepared_format.h"

namespace {

namespace fs = std::filesystem;
namespace pf = dflash::data::prepared_format;
using Bytes = std::vector<uint8_t>;

// The fingerprint of the chat seed, and prepared_fuzz.cc's expected one.
constexpr char kSeedFingerprint[] =
    "dfffcf8580104f11ce2a955140e88215f656ff419c5ed67e3029165e31de16b6";

struct Document {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
};

bool Fail(const std::string& what) {
  std::fprintf(stderr, "prepared_fuzz_seeds: %s\n", what.c_str());
  return false;
}

bool ReadFile(const fs::path& path, Bytes* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

// A prepared file written by PreparedWriter (in a scratch directory), as bytes.
bool Prepare(const fs::path& scratch, const std::string& fingerprint, const std::string& format,
             const std::vector<Document>& docs, Bytes* out) {
  dflash::data::PreparedMetadata m;
  m.tokenizer_fingerprint = fingerprint;
  m.vocab_size = 1000;
  m.data_format = format;
  m.block_size = 16;
  m.max_length = 64;
  m.source_path = "seed.jsonl";
  m.source_bytes = 100;
  m.source_mtime_ns = 1;
  const fs::path path = scratch / "seed.prepared";
  auto writer = dflash::data::PreparedWriter::Create(path, m);
  if (!writer.ok()) return Fail(writer.status().ToString());
  for (const auto& d : docs) {
    if (auto s = (*writer)->Append(d.tokens, d.mask); !s.ok()) return Fail(s.ToString());
  }
  if (auto s = (*writer)->Finish(R"({"seed":true})"); !s.ok()) return Fail(s.ToString());
  return ReadFile(path, out) || Fail("cannot read " + path.string());
}

// Rewrites the trailer's checksum after an edit.
Bytes WithChecksum(Bytes b) {
  const size_t body = b.size() - dflash::data::kPreparedTrailerBytes;
  pf::PutU32(b.data(), body, static_cast<uint32_t>(crc32_z(0, b.data(), body)));
  return b;
}

uint64_t SectionOffset(const Bytes& b, pf::Section s) {
  return pf::GetU64(b.data(), pf::kSections + 16 * s);
}

bool Generate(const fs::path& scratch, std::vector<std::pair<std::string, Bytes>>* seeds) {
  // Pretokenized, with an empty document and the highest id.
  Bytes pretok;
  if (!Prepare(scratch, kSeedFingerprint, "pretokenized",
               {{{5, 6, 7}, {1, 1, 0}}, {{}, {}}, {{999, 0}, {1, 0}}}, &pretok)) {
    return false;
  }
  seeds->emplace_back("gen_pretok", pretok);
  // No documents, another tokenizer: accepted unless the run expects the seeds' tokenizer.
  Bytes empty;
  if (!Prepare(scratch, "other-tokenizer", "text", {}, &empty)) return false;
  seeds->emplace_back("gen_empty_other_tokenizer", empty);
  // doc_offsets decrease: the documents would have a negative length.
  Bytes offsets = pretok;
  pf::PutU64(offsets.data(), SectionOffset(offsets, pf::kDocOffsets) + 8, 4);
  seeds->emplace_back("gen_bad_offsets", WithChecksum(offsets));
  // An id equal to vocab_size: only verification refuses it.
  Bytes id = pretok;
  pf::PutU32(id.data(), SectionOffset(id, pf::kTokens), 1000);
  seeds->emplace_back("gen_id_out_of_range", WithChecksum(id));
  // Cut inside the header.
  seeds->emplace_back("gen_truncated", Bytes(pretok.begin(), pretok.begin() + 256));
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "--write" && mode != "--check") {
    std::fprintf(stderr, "usage: %s --write|--check DIR\n", argv[0]);
    return 2;
  }
  const fs::path dir = argv[2];
  const fs::path scratch =
      fs::temp_directory_path() / ("dflash_prepared_fuzz_seeds_" + std::to_string(::getpid()));
  fs::create_directories(scratch);
  std::vector<std::pair<std::string, Bytes>> seeds;
  const bool generated = Generate(scratch, &seeds);
  fs::remove_all(scratch);
  if (!generated) return 1;
  bool ok = true;
  for (const auto& [name, bytes] : seeds) {
    if (mode == "--write") {
      std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(bytes.data()),
                static_cast<std::streamsize>(bytes.size()));
      if (!out.good()) ok = Fail("cannot write " + (dir / name).string());
    } else {
      Bytes have;
      if (!ReadFile(dir / name, &have) || have != bytes) {
        ok = Fail((dir / name).string() +
                  " is missing or stale; regenerate with prepared_fuzz_seeds --write " +
                  dir.string());
      }
    }
  }
  if (ok) std::printf("%s %zu seeds in %s\n", mode.c_str() + 2, seeds.size(), dir.c_str());
  return ok ? 0 : 1;
}
