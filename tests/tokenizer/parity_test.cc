// Token-for-token parity with HF `tokenizers` 0.22.2 (the oracle) on >= 12,000 generated strings,
// for the shipped Qwen2 tokenizer.json and two files derived from it (Llama-3 and Qwen3.5 split
// patterns, ignore_merges, lstrip/rstrip, normalized and single_word added tokens). The oracle runs
// through DFLASH_PYTHON; a missing interpreter or package fails here, it never skips.
#include <gtest/gtest.h>

#include <sstream>

#include "common/tokenizer/tokenizer.h"
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
  size_t id_mismatches = 0, decode_mismatches = 0, reported = 0;
  for (const oracle::Case& c : cases) {
    auto enc = (*tok)->Encode(c.text);
    ASSERT_TRUE(enc.ok()) << enc.status() << " for " << oracle::Repr(c.text);
    if (enc->ids != c.ids) {
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
  EXPECT_EQ(id_mismatches, 0u) << "of " << cases.size() << " strings";
  EXPECT_EQ(decode_mismatches, 0u) << "of " << cases.size() << " strings";
  std::cout << "[parity] " << GetParam() << ": " << cases.size() << " strings, " << id_mismatches
            << " id mismatches, " << decode_mismatches << " decode mismatches\n";
}

INSTANTIATE_TEST_SUITE_P(Variants, ParityTest,
                         ::testing::Values("qwen2", "llama3_style", "qwen35_style"));

}  // namespace
}  // namespace dflash::tokenizer
