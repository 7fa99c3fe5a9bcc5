// libFuzzer target for the prepared data set reader (common/data/prepared.h): a prepared file is
// read by the coordinator from wherever run.yaml points, so it is untrusted input. Each input is
// written to a file in /dev/shm (the reader maps files) and opened with full verification; an
// accepted file must give document views that lie inside it and hold valid ids and mask values.
// The trailer's CRC-32 is recomputed over the input before it is written, so that mutations reach
// the structural and value checks instead of stopping at the checksum (which prepared_test.cc
// covers with a bit flip at every byte).
// Built by scripts/fuzz.sh with clang -fsanitize=fuzzer, and in the normal build with
// tests/checkpoint/fuzz_replay_main.cc, which replays fuzz_corpus_prepared/ as a unit test.
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/data/prepared.h"

namespace {

void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "prepared_fuzz: accepted file breaks: %s\n", what);
    std::abort();
  }
}

const std::string& ScratchPath() {
  static const std::string path = "/dev/shm/dflash_prepared_fuzz_" + std::to_string(::getpid());
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  if (bytes.size() >= dflash::data::kPreparedTrailerBytes) {
    const size_t body = bytes.size() - dflash::data::kPreparedTrailerBytes;
    const uint32_t crc = static_cast<uint32_t>(crc32(0L, bytes.data(), static_cast<uInt>(body)));
    for (int b = 0; b < 4; ++b) bytes[body + b] = static_cast<uint8_t>(crc >> (8 * b));
  }
  {
    std::ofstream out(ScratchPath(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  dflash::data::PreparedOpenOptions options;
  options.verify = true;
  auto ds = dflash::data::PreparedDataset::Open(ScratchPath(), options);
  if (ds.ok()) {
    const auto& d = **ds;
    const int64_t vocab = d.metadata().vocab_size;
    int64_t tokens = 0;
    for (int64_t i = 0; i < d.num_documents(); ++i) {
      const auto view = d.document(i);
      Require(static_cast<int64_t>(view.tokens.size()) == d.length(i), "view length");
      Require(view.tokens.size() == view.loss_mask.size(), "tokens and mask of equal length");
      for (size_t t = 0; t < view.tokens.size(); ++t) {
        Require(view.tokens[t] >= 0 && view.tokens[t] < vocab, "ids inside the vocabulary");
        Require(view.loss_mask[t] <= 1, "mask values 0 or 1");
      }
      tokens += d.length(i);
    }
    Require(tokens == d.metadata().num_tokens, "documents cover every token");
  }
  ::unlink(ScratchPath().c_str());
  return 0;
}
