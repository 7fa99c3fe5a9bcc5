// `dflashctl regen` through the real processes: the built-in target regenerates the
// answers of tiny-chat (token data) and of a small chat file (rendered by ChatML with the built-in
// tokenizer), deterministically under greedy decoding; an interrupted output resumes after its
// complete lines; the regenerated data prepares and trains.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/data/builtin_data.h"
#include "tests/integration/training_cluster.h"

namespace dflash::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
using ms = std::chrono::milliseconds;

constexpr char kRunYaml[] =
    "name: regen\n"
    "target: {path: \"builtin:tiny-qwen3\", dtype: float32}\n"
    "drafter: {layers: 1, block_size: 8}\n"
    "data: {train: \"builtin:tiny-chat\", max_length: 256}\n"
    "batching: {token_budget: 512, max_anchors: 64}\n"
    "optim: {lr: 2.0e-2, max_steps: 4}\n"
    "placement: {pairs: 1, transport: host}\n";

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The mask's runs: lengths of alternating prompt and answer parts.
std::vector<size_t> Runs(const std::vector<int>& mask) {
  std::vector<size_t> runs;
  for (size_t i = 0; i < mask.size();) {
    size_t j = i;
    while (j < mask.size() && mask[j] == mask[i]) ++j;
    runs.push_back(j - i);
    i = j;
  }
  return runs;
}

TEST_F(TrainingCluster, RegeneratesAnswersResumablyAndTheOutputTrains) {
  const std::string run_yaml = WriteRunYaml("run.yaml", kRunYaml);
  // Without a target worker there is nothing to generate with.
  CtlResult none = RunCtl(address_, {"regen", run_yaml, "--out", dir_ + "/none.jsonl"});
  EXPECT_EQ(none.exit_code, 1) << none.out;
  EXPECT_THAT(none.err, HasSubstr("no idle target worker"));

  StartWorker("target", "t0");
  ASSERT_TRUE(
      WaitFor([&] { return RunCtl(address_, {"workers"}).out.find("t0") != std::string::npos; },
              ms(10000)));
  // Answers that would run past the target's positions (the built-in target has 4096) are refused
  // before anything is generated, naming the record.
  CtlResult too_long = RunCtl(address_, {"regen", run_yaml, "--out", dir_ + "/long.jsonl",
                                         "--max_records", "2", "--max_new_tokens", "5000"});
  EXPECT_NE(too_long.exit_code, 0) << too_long.out;
  EXPECT_THAT(too_long.err, HasSubstr("builtin:tiny-chat document 0, turn 1: "));
  EXPECT_THAT(too_long.err, HasSubstr("exceed the target's max_position_embeddings 4096"));
  // --generation_config needs a checkpoint's generation_config.json: the built-in target has none.
  CtlResult own =
      RunCtl(address_, {"regen", run_yaml, "--out", dir_ + "/own.jsonl", "--generation_config"});
  EXPECT_NE(own.exit_code, 0) << own.out;
  EXPECT_THAT(own.err, HasSubstr("--generation_config: target.path builtin:tiny-qwen3 is a "
                                 "built-in model"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/own.jsonl.partial"));
  const std::string out = dir_ + "/regen.jsonl";
  CtlResult r = RunCtl(address_, {"-o", "json", "regen", run_yaml, "--out", out, "--max_records",
                                  "12", "--batch_size", "5"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json progress = json::parse(r.out);
  EXPECT_EQ(progress["records_done"], "12");
  EXPECT_TRUE(progress["done"].get<bool>());
  EXPECT_FALSE(std::filesystem::exists(out + ".partial"));
  const std::vector<std::string> lines = Lines(out);
  ASSERT_EQ(lines.size(), 12u);

  // Each record keeps its prompt parts and answer lengths; the answers are the target's: the
  // built-in target continues tiny-chat's successor table, so they are answer tokens that
  // differ from the data's (which deviate from the table one time in eight).
  auto source = data::BuiltinDataset("tiny-chat");
  ASSERT_TRUE(source.ok());
  int64_t changed = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    json rec = json::parse(lines[i]);
    const std::vector<int64_t> ids = rec["input_ids"];
    const std::vector<int> mask = rec["loss_mask"];
    batching::DocumentView doc = (*source)->document(static_cast<int64_t>(i));
    ASSERT_EQ(ids.size(), doc.tokens.size()) << "record " << i;
    std::vector<int> want_mask(doc.loss_mask.begin(), doc.loss_mask.end());
    EXPECT_EQ(Runs(mask), Runs(want_mask)) << "record " << i;
    for (size_t k = 0; k < ids.size(); ++k) {
      if (mask[k] == 0) {
        EXPECT_EQ(ids[k], doc.tokens[k]) << "record " << i << " prompt token " << k;
      } else {
        EXPECT_GE(ids[k], 16);
        EXPECT_LT(ids[k], 48);
        changed += ids[k] != doc.tokens[k];
      }
    }
  }
  EXPECT_GT(changed, 0);

  // transformers' repetition_penalty through the coordinator and the worker: the progress names
  // it, and the answers, whose tokens repeat (a successor table), come out otherwise.
  const std::string penalized = dir_ + "/penalized.jsonl";
  CtlResult p = RunCtl(address_, {"-o", "json", "regen", run_yaml, "--out", penalized,
                                  "--max_records", "12", "--batch_size", "5",
                                  "--repetition_penalty", "100"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_EQ(json::parse(p.out)["decoding"], "greedy, repetition_penalty 100");
  const std::vector<std::string> penalized_lines = Lines(penalized);
  ASSERT_EQ(penalized_lines.size(), 12u);
  EXPECT_NE(penalized_lines, lines);

  // An interrupted regeneration: 5 complete lines and a torn sixth in <out>.partial. The same
  // command continues after the 5 and writes the same file as the uninterrupted one.
  const std::string resumed = dir_ + "/resumed.jsonl";
  {
    std::ofstream partial(resumed + ".partial");
    for (size_t i = 0; i < 5; ++i) partial << lines[i] << "\n";
    partial << lines[5].substr(0, 17);
  }
  CtlResult again = RunCtl(address_, {"-o", "json", "regen", run_yaml, "--out", resumed,
                                      "--max_records", "12", "--batch_size", "3"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(json::parse(again.out)["resumed_from"], "5");
  EXPECT_EQ(Lines(resumed), lines);

  // Chat data, rendered by ChatML with the built-in tokenizer: every assistant turn regenerated
  // (6 tokens each), messages after the last answer dropped, a record without a prompt skipped.
  const std::string chat = dir_ + "/chat.jsonl";
  std::ofstream(chat)
      << R"({"messages":[{"role":"user","content":"hello"},{"role":"assistant","content":"hi"},)"
      << R"({"role":"user","content":"again"},{"role":"assistant","content":"yes"},)"
      << R"({"role":"user","content":"unanswered"}]})"
      << "\n"
      << R"({"messages":[{"role":"assistant","content":"no prompt"}]})"
      << "\n"
      << R"({"messages":[{"role":"system","content":"s"},{"role":"user","content":"q"},)"
      << R"({"role":"assistant","content":"a"}]})"
      << "\n";
  CtlResult c = RunCtl(
      address_, {"-o", "json", "regen",
                 WriteRunYaml("chat2.yaml",
                              [&] {
                                std::string y = kRunYaml;
                                y.replace(y.find("data: {"),
                                          y.find('\n', y.find("data: {")) - y.find("data: {"),
                                          absl::StrCat("data: {train: \"", chat,
                                                       "\", format: chat, chat_template: "
                                                       "chatml, max_length: 256}"));
                                return y;
                              }()),
                 "--out", dir_ + "/chat-out.jsonl", "--max_new_tokens", "6"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(json::parse(c.out)["records_skipped"], "1");
  const std::vector<std::string> chat_lines = Lines(dir_ + "/chat-out.jsonl");
  ASSERT_EQ(chat_lines.size(), 2u);
  json first = json::parse(chat_lines[0])["messages"];
  ASSERT_EQ(first.size(), 4u);
  EXPECT_EQ(first[0]["content"], "hello");
  EXPECT_EQ(first[1]["role"], "assistant");
  EXPECT_NE(first[1]["content"], "hi");
  EXPECT_EQ(first[1]["content"].get<std::string>().size(), 6u);  // 6 byte tokens
  EXPECT_EQ(first[2]["content"], "again");
  EXPECT_NE(first[3]["content"], "yes");
  EXPECT_EQ(json::parse(chat_lines[1])["messages"].size(), 3u);

  // The regenerated token data prepares (the built-in tokenizer) and trains.
  std::string train_yaml = kRunYaml;
  train_yaml.replace(train_yaml.find("\"builtin:tiny-chat\""), 19,
                     absl::StrCat("\"", out, "\", format: pretokenized"));
  const std::string train = WriteRunYaml("train.yaml", train_yaml);
  CtlResult prepared = RunCtl(address_, {"prepare", train});
  ASSERT_EQ(prepared.exit_code, 0) << prepared.err;
  StartWorker("drafter", "d0");
  CtlResult trained = RunCtl(address_, {"submit", train});
  EXPECT_EQ(trained.exit_code, 0) << trained.out << trained.err;
  EXPECT_THAT(trained.out, HasSubstr("running -> done: trained 4 steps"));
}

}  // namespace
}  // namespace dflash::testing
