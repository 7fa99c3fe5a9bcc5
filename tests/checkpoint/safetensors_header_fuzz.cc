// libFuzzer target for the safetensors header parser: the header is the one part of a checkpoint
// that is untrusted input. Built two ways: with clang -fsanitize=fuzzer by scripts/fuzz.sh, and
// in the normal build with fuzz_replay_main.cc, which replays fuzz_corpus/ as a unit test.
//
// Beyond "does not crash", an accepted header must keep the promises the readers rely on; a
// broken promise aborts, so the fuzzer reports it like a crash.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "common/model/safetensors.h"

namespace {

void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "safetensors_header_fuzz: accepted header breaks: %s\n", what);
    std::abort();
  }
}

void CheckInvariants(const dflash::model::SafetensorsHeader& h, size_t size) {
  Require(h.data_offset >= 8 && h.data_offset <= size, "data_offset inside the file");
  const uint64_t data_size = size - h.data_offset;
  uint64_t prev_end = 0;
  uint64_t prev_begin = 0;
  for (const auto& t : h.tensors) {
    Require(t.begin <= t.end && t.end <= data_size, "tensor inside the data area");
    Require(t.begin >= prev_begin, "tensors sorted by begin");
    if (t.begin != t.end) {
      Require(t.begin >= prev_end, "no overlap");
      prev_end = t.end;
    }
    prev_begin = t.begin;
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      Require(d >= 0, "non-negative dims");
      numel *= d;  // validated not to overflow
    }
    Require(t.numel() == numel, "numel");
    Require(t.end - t.begin == static_cast<uint64_t>(numel) * dflash::model::DTypeSize(t.dtype),
            "byte count");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto header = dflash::model::ParseSafetensorsHeader(data, size, size, "fuzz");
  if (header.ok()) CheckInvariants(*header, size);
  return 0;
}
