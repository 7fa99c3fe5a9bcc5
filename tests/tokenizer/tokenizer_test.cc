// Unit tests of the tokenizer on a small synthetic tokenizer.json: refusal of bad files and bad
// input (each error names its field or byte offset), decoding, offsets, fingerprints, threads.
// Parity with HF on real files is parity_test.cc.
#include "common/tokenizer/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "common/tokenizer/byte_level.h"

namespace dflash::tokenizer {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

constexpr char kQwenPattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// 256 byte symbols (id = byte), then one token per merge, then the added tokens.
json MakeTokenizerJson() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::ByteStrings()[b]] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"},  {"l", "l"},   {"he", "ll"}, {"hell", "o"},  {"Ġ", "w"},
      {"o", "r"},  {"Ġw", "or"}, {"l", "d"},   {"Ġwor", "ld"}, {"Ã", "¶"},
      {"w", "Ã¶"}, {"Ġ", "t"},   {"Ġt", "he"}, {"Ġ", "Ġ"}};
  json merge_list = json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = static_cast<int>(vocab.size());
    merge_list.push_back(a + " " + b);
  }
  const int n = static_cast<int>(vocab.size());
  auto added = [](int id, const std::string& content, bool special, bool strip) {
    return json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", strip},
                {"rstrip", strip}, {"normalized", false}, {"special", special}};
  };
  return json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", {added(n, "<|im_end|>", true, false), added(n + 1, "<|mask|>", true, true)}},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", kQwenPattern}}},
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
        {"merges", merge_list}}}};
}

std::unique_ptr<Tokenizer> Load(const json& j) {
  auto tok = Tokenizer::FromJson(j.dump(), "test.json");
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

// The error FromJson gives after `edit` is applied to the good file.
std::string LoadError(const std::function<void(json&)>& edit) {
  json j = MakeTokenizerJson();
  edit(j);
  auto tok = Tokenizer::FromJson(j.dump(), "test.json");
  if (tok.ok()) return "(loaded)";
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << tok.status();
  return std::string(tok.status().message());
}

TEST(TokenizerTest, EncodesWithMergesAndAddedTokens) {
  auto tok = Load(MakeTokenizerJson());
  ASSERT_NE(tok, nullptr);
  const int32_t hello = *tok->TokenToId("hello"), world = *tok->TokenToId("Ġworld");
  const int32_t end = *tok->TokenToId("<|im_end|>");
  auto ids = tok->EncodeIds("hello world<|im_end|>hello");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int32_t>{hello, world, end, hello}));
  EXPECT_EQ(tok->vocab_size(), end + 2);
  EXPECT_EQ(tok->IdToToken(world), "Ġworld");
  EXPECT_EQ(tok->IdToToken(-1), std::nullopt);
  ASSERT_EQ(tok->added_tokens().size(), 2u);
  EXPECT_TRUE(tok->added_tokens()[0].special);
}

// A ByteLevel stage that splits with its own regex (use_regex: true, also the default when the
// field is absent) inside a Split sequence: two regexes match on one thread. Encode used to loop
// forever here (the outer match offsets were read back after the inner regex had overwritten them;
// found by tokenizer_fuzz, corpus json_bytelevel_regex_in_split).
TEST(TokenizerTest, ByteLevelRegexInsideSplitTerminatesAndMatchesPlainByteLevel) {
  json with_regex = MakeTokenizerJson();
  with_regex["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true;
  json absent = MakeTokenizerJson();
  absent["pre_tokenizer"]["pretokenizers"][1].erase("use_regex");
  auto plain = Load(MakeTokenizerJson());
  ASSERT_NE(plain, nullptr);
  for (const json& j : {with_regex, absent}) {
    auto tok = Load(j);
    ASSERT_NE(tok, nullptr);
    // Words and single spaces: the GPT-2 regex of ByteLevel splits them exactly as the Split did.
    for (const char* text : {"hello world", "hello world hello", "world<|im_end|>hello world"}) {
      auto got = tok->EncodeIds(text);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, *plain->EncodeIds(text)) << text;
    }
  }
}

TEST(TokenizerTest, LstripAndRstripAbsorbWhitespace) {
  auto tok = Load(MakeTokenizerJson());
  ASSERT_NE(tok, nullptr);
  const int32_t mask = *tok->TokenToId("<|mask|>");
  auto enc = tok->Encode("hello  <|mask|> \n hello");
  ASSERT_TRUE(enc.ok()) << enc.status();
  EXPECT_EQ(enc->ids,
            (std::vector<int32_t>{*tok->TokenToId("hello"), mask, *tok->TokenToId("hello")}));
  // The mask token starts where the whitespace it absorbed starts.
  EXPECT_EQ(enc->offsets, (std::vector<uint32_t>{0, 5, 18}));
}

TEST(TokenizerTest, MergesAsArraysEqualMergesAsStrings) {
  json j = MakeTokenizerJson();
  json arrays = json::array();
  for (const auto& m : j["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    arrays.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  auto strings = Load(j);
  j["model"]["merges"] = arrays;
  auto pairs = Load(j);
  ASSERT_TRUE(strings && pairs);
  EXPECT_EQ(*strings->EncodeIds("hello wörld the"), *pairs->EncodeIds("hello wörld the"));
  EXPECT_EQ(strings->fingerprint(), pairs->fingerprint());
}

TEST(TokenizerTest, RefusesMalformedJsonAndWrongTypes) {
  auto bad = Tokenizer::FromJson("{\"model\": ", "broken.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("broken.json"));
  EXPECT_THAT(bad.status().message(), HasSubstr("malformed JSON"));
  EXPECT_THAT(LoadError([](json& j) { j = json::array(); }), HasSubstr("expected an object"));
  EXPECT_THAT(LoadError([](json& j) { j.erase("model"); }), HasSubstr("test.json: model: missing"));
  EXPECT_THAT(LoadError([](json& j) { j["model"]["vocab"] = json::array(); }),
              HasSubstr("model.vocab: expected an object, got array"));
  EXPECT_THAT(LoadError([](json& j) { j["model"]["vocab"]["h"] = "x"; }),
              HasSubstr("model.vocab['h']: expected an integer id"));
  EXPECT_THAT(LoadError([](json& j) { j["model"]["vocab"]["hello"] = 3; }),
              HasSubstr("id 3 is also the id of"));
  EXPECT_THAT(LoadError([](json& j) { j["model"]["merges"][2] = 7; }),
              HasSubstr("model.merges[2]: expected"));
  EXPECT_THAT(LoadError([](json& j) { j["model"]["merges"][2] = "he zz"; }),
              HasSubstr("model.merges[2]: token 'zz' is not in the vocabulary"));
  EXPECT_THAT(LoadError([](json& j) { j["model"]["merges"][3] = "h e"; }),
              HasSubstr("model.merges[3]: duplicate of model.merges[0]"));
  EXPECT_THAT(LoadError([](json& j) { j["added_tokens"][0]["content"] = 5; }),
              HasSubstr("added_tokens[0].content: expected a string, got number"));
  EXPECT_THAT(LoadError([](json& j) { j["added_tokens"][1]["id"] = 999; }),
              HasSubstr("added_tokens[1].id: id 999 for '<|mask|>', but tokenizers assigns it id"));
}

TEST(TokenizerTest, RefusesUnsupportedComponentsByName) {
  EXPECT_THAT(LoadError([](json& j) {
                j["normalizer"] = {{"type", "NFKC"}};
              }),
              HasSubstr("normalizer.type: normalizer 'NFKC' is not supported"));
  EXPECT_THAT(LoadError([](json& j) {
                j["normalizer"] = {{"type", "Sequence"},
                                   {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
              }),
              HasSubstr("normalizer.normalizers[1].type: normalizer 'Lowercase'"));
  EXPECT_THAT(LoadError([](json& j) {
                j["pre_tokenizer"] = {{"type", "Whitespace"}};
              }),
              HasSubstr("pre_tokenizer.type: pre-tokenizer 'Whitespace' is not supported"));
  EXPECT_THAT(
      LoadError([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; }),
      HasSubstr("pre_tokenizer.pretokenizers[0].behavior: behavior 'Removed'"));
  EXPECT_THAT(LoadError([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; }),
              HasSubstr("pre_tokenizer.pretokenizers[0].invert"));
  EXPECT_THAT(LoadError([](json& j) {
                j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Str", " "}};
              }),
              HasSubstr("pre_tokenizer.pretokenizers[0].pattern: expected {\"Regex\": ...} or "
                        "{\"String\": ...}"));
  EXPECT_THAT(LoadError([](json& j) {
                j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+";
              }),
              HasSubstr("pre_tokenizer.pretokenizers[0].pattern.Regex: at byte 0 of the pattern: "
                        "escape \\w"));
  EXPECT_THAT(
      LoadError([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a"; }),
      HasSubstr("pre_tokenizer.pretokenizers[0].pattern.Regex: PCRE2 cannot compile"));
  EXPECT_THAT(LoadError([](json& j) {
                j["decoder"] = {{"type", "WordPiece"}};
              }),
              HasSubstr("decoder.type: decoder 'WordPiece' is not supported"));
  EXPECT_THAT(LoadError([](json& j) { j["model"]["type"] = "Unigram"; }),
              HasSubstr("model.type: model 'Unigram' is not supported"));
  EXPECT_THAT(LoadError([](json& j) { j["model"]["dropout"] = 0.1; }), HasSubstr("model.dropout"));
  EXPECT_THAT(LoadError([](json& j) {
                j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Metaspace"}};
              }),
              HasSubstr("test.json: pre_tokenizer.pretokenizers[0].type: pre-tokenizer "
                        "'Metaspace' is not supported here (supported: ByteLevel, or a Sequence "
                        "of Split and Digits steps then one ByteLevel step last)"));
  EXPECT_THAT(
      LoadError([](json& j) {
        j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Digits"}, {"individual_digits", 1}};
      }),
      HasSubstr("pre_tokenizer.pretokenizers[0].individual_digits: expected a boolean"));
  EXPECT_THAT(LoadError([](json& j) {
                j["decoder"] = {{"type", "Sequence"},
                                {"decoders", {{{"type", "ByteFallback"}}, {{"type", "CTC"}}}}};
              }),
              HasSubstr("decoder.decoders[1].type: decoder 'CTC' is not supported"));
  EXPECT_THAT(
      LoadError([](json& j) {
        j["decoder"] = {{"type", "Replace"}, {"pattern", {{"Regex", "(x"}}}, {"content", ""}};
      }),
      HasSubstr("decoder.pattern.Regex: PCRE2 cannot compile"));
  EXPECT_THAT(LoadError([](json& j) {
                j["decoder"] = {{"type", "Strip"}, {"content", "ab"}, {"start", 1}, {"stop", 0}};
              }),
              HasSubstr("decoder.content: expected one character"));
  EXPECT_THAT(LoadError([](json& j) {
                j["post_processor"] = {{"type", "BertProcessing"}};
              }),
              HasSubstr("post_processor.type: post-processor 'BertProcessing' is not supported"));
  EXPECT_THAT(
      LoadError([](json& j) {
        j["post_processor"] = {{"type", "TemplateProcessing"},
                               {"single", {{{"SpecialToken", {{"id", "<s>"}}}}}},
                               {"pair", json::array()},
                               {"special_tokens", json::object()}};
      }),
      HasSubstr("post_processor.single[0].SpecialToken.id: '<s>' is not in special_tokens"));
  EXPECT_THAT(LoadError([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }),
              HasSubstr("model.continuing_subword_prefix"));
  EXPECT_THAT(LoadError([](json& j) { j["model"]["end_of_word_suffix"] = "</w>"; }),
              HasSubstr("model.end_of_word_suffix"));
  EXPECT_THAT(LoadError([](json& j) { j["model"]["unk_token"] = "<unk>"; }),
              HasSubstr("model.unk_token: '<unk>' is not in the vocabulary"));
  EXPECT_THAT(LoadError([](json& j) {
                j["truncation"] = {{"max_length", 8}};
              }),
              HasSubstr("truncation: must be null"));
}

// A plain ByteLevel pre-tokenizer (no regex) without the symbols of bytes 4 ('Ą') and 6 ('Ć'):
// one pre-token per text, so merges work across what replaces those bytes.
json WithoutSymbolsOf4And6() {
  json j = MakeTokenizerJson();
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  j["model"]["vocab"].erase("Ą");
  j["model"]["vocab"].erase("Ć");
  j["added_tokens"] = json::array();
  return j;
}

struct Expected {
  std::vector<std::string> tokens;
  std::vector<uint32_t> offsets;
};

void ExpectEncoding(const Tokenizer& tok, const std::string& text, const Expected& want) {
  auto enc = tok.Encode(text);
  ASSERT_TRUE(enc.ok()) << enc.status();
  std::vector<std::string> tokens;
  for (int32_t id : enc->ids) tokens.push_back(tok.IdToToken(id).value_or("?"));
  EXPECT_EQ(tokens, want.tokens) << text;
  EXPECT_EQ(enc->offsets, want.offsets) << text;
}

// HF's BPE::merge_word: a byte whose symbol is missing is dropped (no unk_token), or becomes the
// unk token (consecutive ones fused with fuse_unk), or its symbol's "<0xXX>" byte-fallback tokens.
TEST(TokenizerTest, BytesWithoutASymbolAreDroppedOrUnkOrFallBack) {
  auto dropped = Load(WithoutSymbolsOf4And6());
  ASSERT_NE(dropped, nullptr);
  ExpectEncoding(*dropped, "he\x04ll\x06o", {{"hello"}, {0}});
  ExpectEncoding(*dropped, "\x04\x06", {{}, {}});
  ExpectEncoding(*dropped, "h\x04", {{"h"}, {0}});

  json with_unk = WithoutSymbolsOf4And6();
  with_unk["model"]["vocab"]["<unk>"] = 1000;
  with_unk["model"]["unk_token"] = "<unk>";
  with_unk["model"]["fuse_unk"] = true;
  auto fused = Load(with_unk);
  ASSERT_NE(fused, nullptr);
  ExpectEncoding(*fused,
                 "h\x04\x06\x04"
                 "ello",
                 {{"h", "<unk>", "e", "ll", "o"}, {0, 1, 4, 5, 7}});
  with_unk["model"]["fuse_unk"] = false;
  auto unfused = Load(with_unk);
  ASSERT_NE(unfused, nullptr);
  ExpectEncoding(*unfused, "h\x04\x06", {{"h", "<unk>", "<unk>"}, {0, 1, 2}});

  // Byte 6's symbol U+0106 is C4 86 in UTF-8: both fallback tokens exist; byte 4's (C4 84) not.
  json fallback = with_unk;
  fallback["model"]["vocab"]["<0xC4>"] = 1001;
  fallback["model"]["vocab"]["<0x86>"] = 1002;
  fallback["model"]["byte_fallback"] = true;
  fallback["model"]["fuse_unk"] = true;
  auto fb = Load(fallback);
  ASSERT_NE(fb, nullptr);
  ExpectEncoding(*fb, "h\x06", {{"h", "<0xC4>", "<0x86>"}, {0, 1, 1}});
  // As in HF, the fallback tokens of byte 6 come before the pending unk of the bytes 4 around it.
  ExpectEncoding(*fb, "\x04\x06\x04h", {{"<0xC4>", "<0x86>", "<unk>", "h"}, {0, 0, 1, 3}});
  EXPECT_NE(fb->fingerprint(), fused->fingerprint());
}

// A Split pattern {"String": "."} matches the dot literally; {"Regex": "."} any character.
TEST(TokenizerTest, SplitStringPatternIsLiteral) {
  for (const char* key : {"String", "Regex"}) {
    json j = MakeTokenizerJson();
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{key, "."}};
    auto tok = Load(j);
    ASSERT_NE(tok, nullptr);
    const int32_t he = *tok->TokenToId("he");
    const std::vector<int32_t> want = key == std::string("String")
                                          ? std::vector<int32_t>{he, '.', he}
                                          : std::vector<int32_t>{'h', 'e', '.', 'h', 'e'};
    EXPECT_EQ(*tok->EncodeIds("he.he"), want) << key;
  }
}

// HF numbers added tokens from the vocabulary's size on: after the vocabulary changed size.
void RenumberAddedTokens(json& j) {
  for (size_t i = 0; i < j["added_tokens"].size(); ++i) {
    j["added_tokens"][i]["id"] = j["model"]["vocab"].size() + i;
  }
}

TEST(TokenizerTest, DigitsSplitsNumbersAloneOrInRuns) {
  for (const bool individual : {true, false}) {
    json j = MakeTokenizerJson();
    j["pre_tokenizer"]["pretokenizers"] = {
        {{"type", "Digits"}, {"individual_digits", individual}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}};
    j["model"]["vocab"]["12"] = 1000;
    j["model"]["merges"].push_back("1 2");
    RenumberAddedTokens(j);
    auto tok = Load(j);
    ASSERT_NE(tok, nullptr);
    // "he" and "ll" stay merged; numbers (the superscript two is category No) are cut out, each
    // digit alone or in runs.
    auto ids = tok->EncodeIds("he12ll\xC2\xB2");
    ASSERT_TRUE(ids.ok());
    const int32_t he = *tok->TokenToId("he"), ll = *tok->TokenToId("ll");
    const std::vector<int32_t> want = individual
                                          ? std::vector<int32_t>{he, '1', '2', ll, 0xC2, 0xB2}
                                          : std::vector<int32_t>{he, 1000, ll, 0xC2, 0xB2};
    EXPECT_EQ(*ids, want) << individual;
  }
}

// Decoder chains as HF runs them: each step's decode_chain over the list of token strings.
TEST(TokenizerTest, DecoderChainRunsEachStep) {
  json j = MakeTokenizerJson();
  j["model"]["vocab"]["<0xE6>"] = 1000;
  j["model"]["vocab"]["<0x97>"] = 1001;
  j["model"]["vocab"]["<0xA5>"] = 1002;
  RenumberAddedTokens(j);
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Replace"}, {"pattern", {{"String", "ll"}}}, {"content", "LL"}},
                    {{"type", "ByteLevel"}},
                    {{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", " "}},
                    {{"type", "Strip"}, {"content", "h"}, {"start", 1}, {"stop", 0}}}}};
  auto tok = Load(j);
  ASSERT_NE(tok, nullptr);
  const int32_t hello = *tok->TokenToId("hello"), space2 = *tok->TokenToId("ĠĠ");
  const int32_t end = *tok->TokenToId("<|im_end|>");
  // "<0xE6><0x97><0xA5>" is valid UTF-8 (日); a lone "<0xE6>" becomes one U+FFFD.
  EXPECT_EQ(*tok->Decode({hello, space2, ' ', end}), "eLLo <|im_end|>");
  // Fuse made one token, and 日 is outside the byte-level alphabet: ByteLevel keeps that token's
  // UTF-8 as it is, "Ġ" included (HF does the same).
  EXPECT_EQ(*tok->Decode({hello, space2, ' ', 1000, 1001, 1002, end}), "eLLoĠĠĠ日<|im_end|>");
  EXPECT_EQ(*tok->Decode({hello, 1000, 'x'}, /*skip_special_tokens=*/true), "eLLo\xEF\xBF\xBDx");
  EXPECT_EQ(*tok->Decode({1000}), "\xEF\xBF\xBD");
}

TEST(TokenizerTest, MissingFileIsNotFound) {
  auto tok = Tokenizer::FromFile("/nonexistent/tokenizer.json");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
}

TEST(TokenizerTest, InvalidUtf8NamesTheByteOffset) {
  auto tok = Load(MakeTokenizerJson());
  ASSERT_NE(tok, nullptr);
  const std::vector<std::pair<std::string, size_t>> cases = {
      {"ab\xff"
       "cd",
       2},                      // never valid
      {"\xC0\x80", 0},          // overlong NUL
      {"hello \xE4\xB8", 6},    // truncated at the end
      {"x\xED\xA0\x80", 1},     // surrogate
      {"\xF4\x90\x80\x80", 0},  // above U+10FFFF
      {"12345678\x80", 8},      // stray continuation after an ASCII block
  };
  for (const auto& [text, offset] : cases) {
    auto enc = tok->Encode(text);
    ASSERT_FALSE(enc.ok());
    EXPECT_EQ(enc.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(enc.status().message(), HasSubstr("at byte offset " + std::to_string(offset)))
        << enc.status();
  }
}

TEST(TokenizerTest, DecodeRefusesUnknownIds) {
  auto tok = Load(MakeTokenizerJson());
  ASSERT_NE(tok, nullptr);
  for (int32_t id : {-1, static_cast<int32_t>(tok->vocab_size()), 1 << 30}) {
    auto text = tok->Decode({104, id});
    ASSERT_FALSE(text.ok()) << id;
    EXPECT_THAT(text.status().message(), HasSubstr("ids[1] = " + std::to_string(id)));
  }
}

TEST(TokenizerTest, DecodeRoundTripsAndIsLossyLikeRust) {
  auto tok = Load(MakeTokenizerJson());
  ASSERT_NE(tok, nullptr);
  for (const std::string text :
       {"hello world", "wörld <|im_end|>  the\n\tthe", "日本語 🇯🇵 👨‍👩‍👧", "",
        "  \r\n", "x <|mask|> y"}) {
    auto ids = tok->EncodeIds(text);
    ASSERT_TRUE(ids.ok()) << ids.status();
    auto back = tok->Decode(*ids);
    ASSERT_TRUE(back.ok());
    // <|mask|> absorbed the spaces around it.
    EXPECT_EQ(*back, text == "x <|mask|> y" ? "x<|mask|>y" : text);
  }
  // Byte ids are the bytes themselves here: a cut-off sequence becomes one U+FFFD, and a lead byte
  // followed by a byte that cannot continue it becomes one U+FFFD each (maximal subparts).
  EXPECT_EQ(*tok->Decode({0xE4, 0xB8}), "\xEF\xBF\xBD");
  EXPECT_EQ(*tok->Decode({0xE0, 0x80, 'a'}),
            "\xEF\xBF\xBD\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(*tok->Decode({0xF0, 0x9F, 0x98, 0xE6, 0x97, 0xA5}), "\xEF\xBF\xBD\xE6\x97\xA5");
  const int32_t end = *tok->TokenToId("<|im_end|>");
  EXPECT_EQ(*tok->Decode({'a', end, 'b'}, /*skip_special_tokens=*/true), "ab");
  EXPECT_EQ(*tok->Decode({'a', end, 'b'}, /*skip_special_tokens=*/false), "a<|im_end|>b");
}

TEST(TokenizerTest, OffsetsPointIntoTheNormalizedText) {
  auto tok = Load(MakeTokenizerJson());
  ASSERT_NE(tok, nullptr);
  // NFD input: "wo\u0308rld" normalizes to "wörld", one byte shorter.
  const std::string text = "hello wo\xCC\x88rld<|im_end|> the 日本\n\n";
  auto normalized = tok->Normalize(text);
  ASSERT_TRUE(normalized.ok());
  EXPECT_EQ(*normalized, "hello w\xC3\xB6rld<|im_end|> the 日本\n\n");
  auto enc = tok->Encode(text);
  ASSERT_TRUE(enc.ok()) << enc.status();
  ASSERT_EQ(enc->ids.size(), enc->offsets.size());
  for (size_t i = 0; i < enc->ids.size(); ++i) {
    const size_t end = i + 1 < enc->ids.size() ? enc->offsets[i + 1] : normalized->size();
    ASSERT_LE(enc->offsets[i], end);
    // Each token covers exactly the normalized bytes it decodes to.
    const std::string piece = normalized->substr(enc->offsets[i], end - enc->offsets[i]);
    const std::string token = *tok->IdToToken(enc->ids[i]);
    EXPECT_EQ(piece, token == "<|im_end|>" ? token : *byte_level::ToBytes(token)) << i;
  }
  EXPECT_EQ(*tok->Normalize(*normalized), *normalized);
  // Encoding the normalized text without normalizing again gives the same ids and offsets.
  Tokenizer::EncodeOptions skip;
  skip.text_is_normalized = true;
  auto again = tok->Encode(*normalized, skip);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ids, enc->ids);
  EXPECT_EQ(again->offsets, enc->offsets);
  // The option is a promise: NFD text encoded as if normalized keeps its decomposed bytes.
  EXPECT_NE(tok->Encode(text, skip)->ids, enc->ids);
}

TEST(TokenizerTest, NormalizeWithoutAddedTokens) {
  json j = MakeTokenizerJson();
  j["added_tokens"] = json::array();
  auto tok = Load(j);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(*tok->Normalize("e\xCC\x81 x"), "\xC3\xA9 x");
  EXPECT_EQ(*tok->Normalize(""), "");
  auto enc = tok->Encode("e\xCC\x81 x");
  ASSERT_TRUE(enc.ok());
  EXPECT_EQ(enc->offsets.back(), 3u);  // " x" starts at byte 2 of "\xC3\xA9 x"; 'x' is 3
}

TEST(TokenizerTest, FingerprintIgnoresFormattingButNotMerges) {
  const json j = MakeTokenizerJson();
  auto compact = Tokenizer::FromJson(j.dump(), "a.json");
  auto indented = Tokenizer::FromJson(j.dump(4), "b.json");
  ASSERT_TRUE(compact.ok() && indented.ok());
  EXPECT_EQ((*compact)->fingerprint().size(), 64u);
  EXPECT_EQ((*compact)->fingerprint(), (*indented)->fingerprint());
  json changed = j;
  std::swap(changed["model"]["merges"][0], changed["model"]["merges"][1]);  // ranks differ
  auto other = Tokenizer::FromJson(changed.dump(), "c.json");
  ASSERT_TRUE(other.ok());
  EXPECT_NE((*compact)->fingerprint(), (*other)->fingerprint());
}

TEST(TokenizerTest, ConcurrentEncodeMatchesSerial) {
  auto tok = Load(MakeTokenizerJson());
  ASSERT_NE(tok, nullptr);
  // Enough distinct words to overflow and clear cache shards while threads read them.
  std::mt19937 rng(7);
  const std::vector<std::string> letters = {"h", "e", "l", "o",  "w", "r",
                                            "d", "t", "ö", "日", "\n"};
  std::vector<std::string> texts(3000);
  for (std::string& t : texts) {
    const int words = 1 + static_cast<int>(rng() % 60);
    for (int w = 0; w < words; ++w) {
      t += ' ';
      for (int k = 1 + static_cast<int>(rng() % 12); k > 0; --k)
        t += letters[rng() % letters.size()];
      if (rng() % 10 == 0) t += "<|im_end|>";
    }
  }
  std::vector<std::vector<int32_t>> serial;
  for (const std::string& t : texts) serial.push_back(*tok->EncodeIds(t));
  std::vector<int> mismatches(8, 0);
  std::vector<std::thread> threads;
  for (int th = 0; th < 8; ++th) {
    threads.emplace_back([&, th] {
      for (int rep = 0; rep < 3; ++rep) {
        for (size_t i = th; i < texts.size() + th; ++i) {
          const size_t k = (i * 7 + static_cast<size_t>(rep)) % texts.size();
          auto ids = tok->EncodeIds(texts[k]);
          if (!ids.ok() || *ids != serial[k]) ++mismatches[th];
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int th = 0; th < 8; ++th) EXPECT_EQ(mismatches[th], 0) << "thread " << th;
}

}  // namespace
}  // namespace dflash::tokenizer
