// libFuzzer target for the tokenizer (common/tokenizer): the text it encodes is user data, and the
// tokenizer.json it parses comes from a model directory. The first input byte picks the mode:
//   even: Encode / Normalize arbitrary bytes with a small fixed tokenizer (NFC, the Qwen split
//         regex, byte-level BPE with merges, special tokens with and without lstrip/rstrip), then
//         Decode the ids, and Decode arbitrary int32 ids taken from the input;
//   odd:  parse the rest as a tokenizer.json (FromJson), and encode and decode a fixed text if it
//         loads (TOKENIZER_FUZZ_VERBOSE set: says "loaded" on stderr).
// An accepted encoding must keep the promises callers rely on (offsets, ids in range, decode
// round trip). The seed fuzz_corpus/json_fixed is the byte 0x01 followed by TinyTokenizerJson(),
// the JSON of the fixed tokenizer (tokenizer_test.cc's MakeTokenizerJson with fewer merges);
// json_smollm2_forms is that file with SmolLM2's features: byte symbols missing from the
// vocabulary, unk with fuse_unk, byte_fallback, Digits and a String Split, a decoder Sequence,
// a TemplateProcessing post-processor.
// Built by scripts/fuzz.sh with clang -fsanitize=fuzzer, and in the normal build with
// tests/checkpoint/fuzz_replay_main.cc, which replays fuzz_corpus/ as a unit test.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

using dflash::tokenizer::Tokenizer;
using json = nlohmann::json;

void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "tokenizer_fuzz: broken promise: %s\n", what);
    std::abort();
  }
}

std::string TinyTokenizerJson() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[dflash::tokenizer::byte_level::ByteStrings()[b]] = b;
  json merges = json::array();
  for (const char* m : {"h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġ Ġ", "1 2"}) {
    std::string a(m), l = a.substr(0, a.find(' ')), r = a.substr(a.find(' ') + 1);
    if (!vocab.contains(l + r)) vocab[l + r] = static_cast<int>(vocab.size());
    merges.push_back(a);
  }
  const int n = static_cast<int>(vocab.size());
  auto added = [](int id, const char* content, bool special, bool strip) {
    return json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", strip},
                {"rstrip", strip}, {"normalized", false}, {"special", special}};
  };
  const char* pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", {added(n, "<|im_end|>", true, false), added(n + 1, "<|mask|>", true, true)}},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", pattern}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", false},
           {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"vocab", vocab},
        {"merges", merges}}}};
  return j.dump();
}

const Tokenizer& Fixed() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    auto t = Tokenizer::FromJson(TinyTokenizerJson(), "tokenizer_fuzz");
    if (!t.ok()) {
      std::fprintf(stderr, "tokenizer_fuzz: fixed tokenizer: %s\n", t.status().ToString().c_str());
      std::abort();
    }
    return *std::move(t);
  }();
  return *tok;
}

void FuzzEncode(const std::string& text) {
  const Tokenizer& tok = Fixed();
  auto enc = tok.Encode(text);
  auto normalized = tok.Normalize(text);
  Require(enc.ok() == normalized.ok(), "Encode and Normalize agree on validity");
  Tokenizer::EncodeOptions skip;
  skip.text_is_normalized = true;
  // Text that is not normalized but said to be breaks the caller's contract; the ids may differ,
  // but they must stay in range with offsets inside the text.
  auto unchecked = tok.Encode(text, skip);
  Require(unchecked.ok() == enc.ok(), "skipping the normalizer keeps UTF-8 validation");
  if (unchecked.ok()) {
    Require(unchecked->ids.size() == unchecked->offsets.size(), "one offset per id (unnormalized)");
    for (size_t i = 0; i < unchecked->ids.size(); ++i) {
      Require(unchecked->ids[i] >= 0 && unchecked->ids[i] < tok.vocab_size(), "ids in range");
      Require(unchecked->offsets[i] <= text.size(), "offsets inside the text");
    }
  }
  if (!enc.ok()) return;
  Require(enc->ids.size() == enc->offsets.size(), "one offset per id");
  for (size_t i = 0; i < enc->ids.size(); ++i) {
    Require(enc->ids[i] >= 0 && enc->ids[i] < tok.vocab_size(), "ids in range");
    Require(enc->offsets[i] <= normalized->size(), "offsets inside the normalized text");
    Require(i == 0 || enc->offsets[i - 1] <= enc->offsets[i], "offsets non-decreasing");
  }
  auto again = tok.Encode(*normalized, skip);
  Require(again.ok() && again->ids == enc->ids, "normalized text encodes to the same ids");
  Require(again->offsets == enc->offsets, "normalized text encodes to the same offsets");
  auto decoded = tok.Decode(enc->ids);
  Require(decoded.ok(), "decode of encoded ids");
  // lstrip/rstrip special tokens absorb whitespace, so the round trip is exact only without them.
  if (text.find("<|mask|>") == std::string::npos) {
    Require(*decoded == *normalized, "decode(encode(text)) == normalize(text)");
  }
}

void FuzzDecode(const uint8_t* data, size_t size) {
  std::vector<int32_t> ids(size / 4);
  if (!ids.empty()) std::memcpy(ids.data(), data, ids.size() * 4);
  auto decoded = Fixed().Decode(ids, /*skip_special_tokens=*/size % 2 == 0);
  if (decoded.ok()) {
    for (int32_t id : ids) Require(id >= 0 && id < Fixed().vocab_size(), "decoded ids in range");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 2 == 0) {
    FuzzEncode(rest);
    FuzzDecode(data + 1, size - 1);
  } else {
    auto tok = Tokenizer::FromJson(rest, "fuzz.json");
    if (tok.ok()) {
      auto enc = (*tok)->Encode("hello world <|im_end|> 12:: \xC3\xA9\x04\x06\x7f");
      Require(enc.ok(), "a loaded tokenizer encodes valid UTF-8");
      // Decoder chains from the file (ByteFallback, Fuse, Replace, Strip, ...) on its own ids.
      Require((*tok)->Decode(enc->ids).ok(), "a loaded tokenizer decodes its ids");
      if (std::getenv("TOKENIZER_FUZZ_VERBOSE") != nullptr) std::fprintf(stderr, "loaded\n");
    }
  }
  return 0;
}
