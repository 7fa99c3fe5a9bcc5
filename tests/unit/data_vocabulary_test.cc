// Prepared data whose tokenizer's vocabulary is not the target's is refused at submit, naming the
// file, both sizes and the target (data::CheckDataVocabulary; the run start and the target worker
// call the same check): data prepared with a tokenizer of more tokens than the target's embedding
// rows (as a 49173-token file against SmolLM2's 49152 rows, which used to train silently), and with
// a tokenizer smaller than the target's own.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/data/builtin_tokenizer.h"
#include "common/data/prepare.h"
#include "common/data/run_data.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/coordinator.h"
#include "tests/unit/fake_worker_control.h"

namespace dflash::coordinator {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// builtin:tiny-qwen3's tokenizer (512 tokens) with `extra` special tokens added after it.
std::string TokenizerWith(int extra) {
  nlohmann::json tok = nlohmann::json::parse(data::TinyQwen3TokenizerJson());
  for (int i = 0; i < extra; ++i) {
    tok["added_tokens"].push_back({{"id", 512 + i},
                                   {"content", absl::StrCat("<extra_", i, ">")},
                                   {"single_word", false},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"normalized", false},
                                   {"special", true}});
  }
  return tok.dump();
}

class DataVocabularyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dflash-vocab-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::ofstream(dir_ / "chat.jsonl")
        << R"({"messages": [{"role": "user", "content": "Name three colours of the rainbow."},)"
        << R"( {"role": "assistant", "content": "Red, orange and yellow are three of the seven)"
        << R"( colours of the rainbow; green, blue, indigo and violet are the others."}]})"
        << "\n";
    for (const auto& [name, tokens] : {std::pair<std::string, int>{"t512", 0}, {"t533", 21}}) {
      fs::create_directories(dir_ / name);
      std::ofstream(dir_ / name / "tokenizer.json") << TokenizerWith(tokens);
      // A Llama target (SmolLM2-135M's layout, smaller) whose embedding has as many rows as its
      // own tokenizer.json has tokens.
      std::ofstream(dir_ / name / "config.json")
          << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                 "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "num_hidden_layers": 8, "rms_norm_eps": 1e-5,
                 "rope_theta": 10000.0, "tie_word_embeddings": true, "vocab_size": )"
          << 512 + tokens << "}";
    }
    auto store = RunStore::Open(":memory:");
    ASSERT_TRUE(store.ok()) << store.status();
    CoordinatorOptions opts;
    opts.state_dir = (dir_ / "state").string();
    auto c = Coordinator::Create(opts, *std::move(store), &clock_, &workers_, nullptr);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = *std::move(c);
  }
  void TearDown() override {
    coordinator_.reset();
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // run.yaml for the target in dir_/`target` with data prepared by `tokenizer` ("auto": the
  // target's own tokenizer.json).
  std::string Yaml(const std::string& target, const std::string& tokenizer,
                   const std::string& prepared) const {
    return absl::StrCat(
        "name: vocab\ntarget: {path: \"", (dir_ / target).string(),
        "\", dtype: float32}\ndrafter: {layers: 1, block_size: 8, mask_token_id: 1}\n",
        "data: {train: \"", (dir_ / "chat.jsonl").string(), "\", tokenizer: \"", tokenizer,
        "\", chat_template: chatml, max_length: 256, prepared: \"", (dir_ / prepared).string(),
        "\"}\n", "batching: {token_budget: 256, max_anchors: 8}\noptim: {max_steps: 1}\n");
  }

  // Prepares the data as `dflashctl prepare` does, then submits (dry run).
  absl::Status PrepareAndSubmit(const std::string& yaml) {
    auto spec = config::ParseRunSpec(yaml, "vocab.yaml", config::RunSpecOptions{"", true});
    if (!spec.ok()) return spec.status();
    auto paths = data::ResolveRunDataPaths(*spec);
    if (!paths.ok()) return paths.status();
    auto options = data::PrepareOptionsFor(*spec, *paths);
    if (!options.ok()) return options.status();
    auto report = data::Prepare(*options);
    if (!report.ok()) return report.status();
    return coordinator_->SubmitRun(yaml, "vocab.yaml", /*dry_run=*/true).status();
  }

  fs::path dir_;
  FakeClock clock_;
  FakeWorkerControl workers_;
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(DataVocabularyTest, PreparedDataOfAnotherVocabularyIsRefusedAtSubmit) {
  // The target's own tokenizer: accepted.
  absl::Status own = PrepareAndSubmit(Yaml("t512", "auto", "own.dfdata"));
  EXPECT_TRUE(own.ok()) << own;

  // A tokenizer of 21 more tokens than the target's 512 embedding rows.
  const std::string t533 = (dir_ / "t533" / "tokenizer.json").string();
  absl::Status bigger = PrepareAndSubmit(Yaml("t512", t533, "bigger.dfdata"));
  EXPECT_EQ(bigger.code(), absl::StatusCode::kFailedPrecondition) << bigger;
  EXPECT_THAT(
      std::string(bigger.message()),
      HasSubstr(absl::StrCat("vocab.yaml: data.prepared: ", (dir_ / "bigger.dfdata").string(),
                             " was prepared with a tokenizer of 533 tokens, but the "
                             "target ",
                             (dir_ / "t512").string(), " (target.path) has a vocabulary of 512")));

  // A smaller tokenizer than the target's own (512 of 533): its ids fit the embedding, but it is
  // not the target's tokenizer.
  const std::string t512 = (dir_ / "t512" / "tokenizer.json").string();
  absl::Status smaller = PrepareAndSubmit(Yaml("t533", t512, "smaller.dfdata"));
  EXPECT_EQ(smaller.code(), absl::StatusCode::kFailedPrecondition) << smaller;
  EXPECT_THAT(std::string(smaller.message()),
              HasSubstr(absl::StrCat("was prepared with a tokenizer of 512 tokens (data.tokenizer ",
                                     t512, "), but the target ", (dir_ / "t533").string(),
                                     " (target.path) has 533 in its tokenizer.json")));
  // The same tokenizer file named explicitly is the target's own: accepted.
  EXPECT_TRUE(
      PrepareAndSubmit(Yaml("t533", (dir_ / "t533" / "tokenizer.json").string(), "explicit.dfdata"))
          .ok());
}

}  // namespace
}  // namespace dflash::coordinator
