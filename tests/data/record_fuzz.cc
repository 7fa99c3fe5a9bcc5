// libFuzzer target for the JSONL record parser (common/data/records.h): every line of a user's data
// file is untrusted input. The first byte picks the format (chat, pretokenized, text); the rest is
// the line. Built by scripts/fuzz.sh with clang -fsanitize=fuzzer, and in the normal build with
// tests/checkpoint/fuzz_replay_main.cc, which replays fuzz_corpus_records/ as a unit test.
//
// Beyond "does not crash", a parsed record must keep the promises tokenization relies on.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <variant>

#include "common/data/records.h"

namespace {

void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "record_fuzz: accepted record breaks: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using dflash::data::DataFormat;
  const DataFormat format = static_cast<DataFormat>(data[0] % 3);
  const absl::string_view line(reinterpret_cast<const char*>(data + 1), size - 1);
  dflash::data::IsValidUtf8(line);
  auto parsed = dflash::data::ParseRecord(line, format);
  if (const auto* bad = std::get_if<dflash::data::BadRecord>(&parsed)) {
    Require(!dflash::data::DropReasonName(bad->reason).empty(), "a named drop reason");
    return 0;
  }
  const auto& r = std::get<dflash::data::Record>(parsed);
  switch (format) {
    case DataFormat::kChat: {
      Require(!r.messages.empty(), "a conversation has messages");
      bool assistant = false;
      for (const auto& m : r.messages) {
        Require(dflash::data::IsValidUtf8(m.content), "message content is UTF-8");
        assistant |= m.role == dflash::data::Role::kAssistant;
      }
      Require(assistant, "a conversation has an assistant turn");
      break;
    }
    case DataFormat::kPretokenized:
      Require(r.input_ids.size() == r.loss_mask.size(), "ids and mask of equal length");
      for (uint8_t m : r.loss_mask) Require(m <= 1, "mask values 0 or 1");
      break;
    case DataFormat::kText:
      Require(dflash::data::IsValidUtf8(r.text), "text is UTF-8");
      break;
  }
  return 0;
}
