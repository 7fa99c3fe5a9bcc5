// Token-for-token parity with HF `tokenizers` 0.22.2 (the oracle) on >= 12,000 generated strings
// and real text (Python source, licenses, documentation, numbers, control bytes, non-ASCII), for
// the shipped Qwen2 tokenizer.json and two files derived from it (Llama-3 and Qwen3.5 split
// patterns, ignore_merges, lstrip/rstrip, normalized and single_word added tokens), and for
// SmolLM2-135M-Instruct's file in its original form (Digits pre-tokenizer, byte symbols missing
// from the vocabulary), in transformers' GGUF-converted form (byte_fallback, fused unk, a decoder
// Sequence) and in a byte-fallback variant. Decoding is also checked on random ids. The oracle
// runs through DFLASH_PYTHON; a missing interpreter, package or model fails here, never skips.
#include <gtest/gtest.h>

#include <sstream>

#include "common/tokenizer/pretokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/tokenizer_json.h"
#include "common/tokenizer/unicode.h"
#include "tests/common/read_file.h"
#include "tests/tokenizer/oracle.h"

namespace dflash::tokenizer {
namespace {

std::string IdList(const std::vector<int32_t>& ids, size_t max = 40) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < ids.size() && i < max; ++i) out << (i ? ", " : "") << ids[i];
  if (ids.size() > max) out << ", ... (" << ids.size() << " ids)";
  out << "]";
  return out.str();
}

class ParityTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { oracle_error_ = new std::string(oracle::GenerateOracleOutputs()); }
  static void TearDownTestSuite() { delete oracle_error_; }
  static std::string* oracle_error_;
};
std::string* ParityTest::oracle_error_ = nullptr;

TEST_P(ParityTest, EncodeAndDecodeMatchHuggingFace) {
  ASSERT_EQ(*oracle_error_, "");
  auto tok = Tokenizer::FromFile(oracle::OracleDir() / GetParam() / "tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::vector<oracle::Case> cases;
  ASSERT_EQ(oracle::ReadCases(GetParam(), &cases), "");
  ASSERT_GE(cases.size(), 10000u);
  size_t id_mismatches = 0, decode_mismatches = 0, reported = 0, decode_only = 0;
  for (const oracle::Case& c : cases) {
    if (c.decode_only) {
      ++decode_only;
    } else if (auto enc = (*tok)->Encode(c.text); !enc.ok() || enc->ids != c.ids) {
      ASSERT_TRUE(enc.ok()) << enc.status() << " for " << oracle::Repr(c.text);
      ++id_mismatches;
      if (reported++ < 8) {
        ADD_FAILURE() << GetParam() << ": ids differ for " << oracle::Repr(c.text)
                      << "\n  ours: " << IdList(enc->ids) << "\n  HF:   " << IdList(c.ids);
      }
    }
    auto dec = (*tok)->Decode(c.ids, false);
    auto dec_skip = (*tok)->Decode(c.ids, true);
    ASSERT_TRUE(dec.ok() && dec_skip.ok()) << dec.status() << dec_skip.status();
    if (*dec != c.decode || *dec_skip != c.decode_skip) {
      ++decode_mismatches;
      if (reported++ < 8) {
        ADD_FAILURE() << GetParam() << ": decode differs for " << IdList(c.ids)
                      << "\n  ours: " << oracle::Repr(*dec) << " / skip " << oracle::Repr(*dec_skip)
                      << "\n  HF:   " << oracle::Repr(c.decode) << " / skip "
                      << oracle::Repr(c.decode_skip);
      }
    }
  }
  EXPECT_GE(decode_only, 100u);
  EXPECT_EQ(id_mismatches, 0u) << "of " << cases.size() << " strings";
  EXPECT_EQ(decode_mismatches, 0u) << "of " << cases.size() << " strings";
  std::cout << "[parity] " << GetParam() << ": " << cases.size() << " strings, " << id_mismatches
            << " id mismatches, " << decode_mismatches << " decode mismatches (" << decode_only
            << " of them random ids, decoded only)\n";
}

INSTANTIATE_TEST_SUITE_P(Variants, ParityTest,
                         ::testing::Values("qwen2", "llama3_style", "qwen35_style", "smollm2",
                                           "smollm2_gguf", "smollm2_fallback"));

// The Digits pre-tokenizer of SmolLM2's file splits off exactly the code points HF's does (Rust's
// char::is_numeric), checked over all of Unicode: every code point between two 'a's.
TEST(DigitsParityTest, SplitsOffExactlyRustNumericCodePoints) {
  ASSERT_EQ(oracle::GenerateOracleOutputs(), "");
  std::vector<char32_t> expected;
  ASSERT_EQ(oracle::ReadNumericCodePoints(&expected), "");
  auto spec = ParseTokenizerJson(
      dflash::testing::ReadFileText((oracle::OracleDir() / "smollm2" / "tokenizer.json").string()),
      "smollm2");
  ASSERT_TRUE(spec.ok()) << spec.status();
  PreTokenizerConfig config = spec->pre_tokenizer;  // Digits only: no ByteLevel regex
  config.use_regex = false;
  config.add_prefix_space = false;
  auto pre = PreTokenizer::Create(config);
  ASSERT_TRUE(pre.ok()) << pre.status();
  std::vector<char32_t> found;
  for (char32_t first = 0; first < 0x110000; first += 8192) {
    std::string text;
    for (char32_t c = first; c < first + 8192 && c < 0x110000; ++c) {
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      text += 'a';
      unicode::AppendUtf8(c, &text);
    }
    text += 'a';
    ASSERT_TRUE((*pre)
                    ->Run(text, 0,
                          [&](std::string_view piece, uint32_t, uint32_t) {
                            int len = 0;
                            const char32_t c = unicode::DecodeAt(piece, 0, &len);
                            if (static_cast<size_t>(len) == piece.size() && piece != "a") {
                              found.push_back(c);
                            }
                          })
                    .ok());
  }
  EXPECT_EQ(found, expected);
}

}  // namespace
}  // namespace dflash::tokenizer
