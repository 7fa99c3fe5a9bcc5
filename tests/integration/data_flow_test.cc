// A user's data path end to end, through the real binaries: a JSONL file with good and bad records,
// `dflashctl prepare run.yaml`, then `dflashctl submit`, which the coordinator accepts only with
// data prepared by the run's tokenizer from the unchanged source, and reports in `status`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "tests/integration/cluster.h"

namespace dflash::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
using ms = std::chrono::milliseconds;
namespace fs = std::filesystem;

std::string Conversation(int i) {
  json msgs = json::array();
  msgs.push_back({{"role", "user"}, {"content", "Question " + std::to_string(i) + ": why?"}});
  std::string answer = "Because of reason " + std::to_string(i) + ".";
  for (int k = 0; k < 8; ++k) answer += " It follows from step " + std::to_string(k) + ".";
  msgs.push_back({{"role", "assistant"}, {"content", answer}});
  return json{{"messages", msgs}}.dump();
}

class DataFlowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir();
    // A target directory holding the real Qwen tokenizer and a small Qwen3 config (read at
    // submission for the feature layers and the mask token); no weights: nothing trains here.
    fs::create_directories(dir_ + "/target");
    std::ofstream(dir_ + "/target/config.json")
        << R"({"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 8, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16})";
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      fs::copy_file(fs::path(DFLASH_QWEN_TOKENIZER_DIR) / f, fs::path(dir_) / "target" / f);
    }
    std::ofstream data(dir_ + "/train.jsonl");
    for (int i = 0; i < 40; ++i) {
      data << Conversation(i) << "\n";
      if (i == 3) data << "{\"messages\": [\n";  // malformed_json
      if (i == 7)
        data << R"({"messages": [{"role": "narrator", "content": "x"}]})"
             << "\n";
      if (i == 9)
        data << R"({"messages": [{"role": "user", "content": "hi"}]})"
             << "\n";
    }
    WriteRunYaml("");
  }
  void TearDown() override {
    coordinator_.reset();
    if (!HasFailure()) fs::remove_all(dir_);
  }

  void WriteRunYaml(const std::string& extra_data) {
    std::ofstream(dir_ + "/run.yaml")
        << "name: flow\ntarget: {path: target}\n"
        << "drafter: {block_size: 4}\n"
        << "data: {train: train.jsonl, max_length: 64" << extra_data << "}\n"
        << "batching: {token_budget: 256, max_anchors: 8}\n"
        << "optim: {epochs: 2}\nloss: {gamma: 4.0}\n";
  }

  void StartCoordinator() {
    const std::string ready = dir_ + "/coordinator.ready";
    coordinator_ = std::make_unique<Process>(
        BinDir() + "/coordinator/dflash-coordinator",
        std::vector<std::string>{"--listen", "127.0.0.1:0", "--metrics_listen", "127.0.0.1:0",
                                 "--state_dir", dir_ + "/state", "--ready_file", ready},
        dir_ + "/coordinator.log");
    const int port = ReadReadyPort(ready, "grpc_port", ms(20000));
    ASSERT_GT(port, 0) << ReadFile(dir_ + "/coordinator.log");
    address_ = "127.0.0.1:" + std::to_string(port);
  }

  CtlResult Ctl(const std::vector<std::string>& args) { return RunCtl(address_, args); }

  std::string dir_, address_ = "127.0.0.1:1";
  std::unique_ptr<Process> coordinator_;
};

TEST_F(DataFlowTest, PrepareThenSubmitReportsTheDataAndSkippedRecords) {
  StartCoordinator();
  const std::string run_yaml = dir_ + "/run.yaml";
  CtlResult early = Ctl({"submit", run_yaml, "--detach"});
  EXPECT_EQ(early.exit_code, 3) << early.out << early.err;
  EXPECT_THAT(early.err, HasSubstr("data.prepared: " + dir_ + "/train.dfdata does not exist"));
  EXPECT_THAT(early.err, HasSubstr("dflashctl prepare"));

  CtlResult prep = Ctl({"prepare", run_yaml, "-o", "json"});
  ASSERT_EQ(prep.exit_code, 0) << prep.out << prep.err;
  json report = json::parse(prep.out);
  EXPECT_EQ(report["documents"], 40);
  EXPECT_EQ(report["dropped"]["malformed_json"]["count"], 1);
  EXPECT_EQ(report["dropped"]["unknown_role"]["count"], 1);
  EXPECT_EQ(report["dropped"]["no_assistant_turn"]["count"], 1);
  EXPECT_THAT(report["dropped"]["malformed_json"]["examples"][0].get<std::string>(),
              HasSubstr("train.jsonl:5:"));
  CtlResult again = Ctl({"prepare", run_yaml});
  EXPECT_EQ(again.exit_code, 0);
  EXPECT_THAT(again.out, HasSubstr("is up to date"));

  CtlResult submit = Ctl({"-o", "json", "submit", run_yaml, "--detach"});
  ASSERT_EQ(submit.exit_code, 0) << submit.out << submit.err;
  const json run = json::parse(submit.out);
  EXPECT_EQ(run["data"]["documents"], "40");  // int64 is a string in proto JSON
  EXPECT_EQ(run["data"]["records_skipped"], "3");
  EXPECT_EQ(run["data"]["skipped_by_reason"]["unknown_role"], "1");
  EXPECT_GT(std::stoll(run["total_steps"].get<std::string>()), 0);
  CtlResult status = Ctl({"status", run["run_id"]});
  EXPECT_THAT(status.out, HasSubstr("skipped 3 (malformed_json 1, no_assistant_turn 1, "
                                    "unknown_role 1)"));
}

TEST_F(DataFlowTest, SubmitRefusesDataFromAnotherTokenizerOrAChangedSource) {
  StartCoordinator();
  const std::string run_yaml = dir_ + "/run.yaml";
  ASSERT_EQ(Ctl({"prepare", run_yaml}).exit_code, 0);
  // Another tokenizer: the same file with one vocabulary entry renamed.
  json tok = json::parse(ReadFile(dir_ + "/target/tokenizer.json"));
  tok["added_tokens"][0]["content"] = "<|other_endoftext|>";
  std::ofstream(dir_ + "/other.json") << tok.dump();
  WriteRunYaml(", tokenizer: other.json");
  CtlResult foreign = Ctl({"submit", run_yaml, "--detach"});
  EXPECT_EQ(foreign.exit_code, 3) << foreign.out << foreign.err;
  EXPECT_THAT(foreign.err, HasSubstr("tokenizer"));

  WriteRunYaml("");
  std::ofstream(dir_ + "/train.jsonl", std::ios::app) << Conversation(99) << "\n";
  CtlResult changed = Ctl({"submit", run_yaml, "--detach"});
  EXPECT_EQ(changed.exit_code, 3) << changed.out << changed.err;
  EXPECT_THAT(changed.err, HasSubstr("has changed since"));
  // Preparing again makes it acceptable.
  ASSERT_EQ(Ctl({"prepare", run_yaml}).exit_code, 0);
  EXPECT_EQ(Ctl({"submit", run_yaml, "--detach"}).exit_code, 0);
}

// data.thinking: the target's own template (Qwen3's) rendered with enable_thinking false; the
// prepared file records it, a run in another mode is refused until prepared again, and prepare
// does not keep a file of another mode as up to date.
TEST_F(DataFlowTest, TheThinkingModeIsRecordedAndAnotherModeIsRefused) {
  fs::copy_file(fs::path(DFLASH_CHAT_TEMPLATE_FIXTURES) / "qwen3.jinja",
                fs::path(dir_) / "target" / "chat_template.jinja");
  StartCoordinator();
  const std::string run_yaml = dir_ + "/run.yaml";
  WriteRunYaml(", thinking: off");
  CtlResult off = Ctl({"prepare", run_yaml, "-o", "json"});
  ASSERT_EQ(off.exit_code, 0) << off.out << off.err;
  EXPECT_EQ(json::parse(off.out)["chat_template"], "jinja-think");
  EXPECT_EQ(Ctl({"submit", run_yaml, "--detach"}).exit_code, 0);
  WriteRunYaml("");  // thinking: auto, the same prepared file
  CtlResult unset = Ctl({"submit", run_yaml, "--detach"});
  EXPECT_EQ(unset.exit_code, 3) << unset.out << unset.err;
  EXPECT_THAT(unset.err, HasSubstr("data.thinking: the run says 'auto' but"));
  EXPECT_THAT(unset.err, HasSubstr("was rendered with thinking off; prepare it again"));
  WriteRunYaml(", thinking: on");
  CtlResult on = Ctl({"prepare", run_yaml, "-o", "json"});
  ASSERT_EQ(on.exit_code, 0) << on.out << on.err;
  EXPECT_EQ(json::parse(on.out)["chat_template"], "jinja+think");
  EXPECT_EQ(Ctl({"submit", run_yaml, "--detach"}).exit_code, 0);
}

TEST_F(DataFlowTest, OnBadRecordFailStopsAtTheFirstBadLineAndWritesNothing) {
  WriteRunYaml(", on_bad_record: fail");
  CtlResult r = Ctl({"prepare", dir_ + "/run.yaml"});
  EXPECT_EQ(r.exit_code, 6) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("train.jsonl:5:"));
  EXPECT_FALSE(fs::exists(dir_ + "/train.dfdata"));
  EXPECT_FALSE(fs::exists(dir_ + "/train.dfdata.tmp"));
}

// Ctrl-C in the middle of a prepare leaves neither the temporary files nor a partial output, and
// an existing prepared file under the output name is kept as it was.
TEST_F(DataFlowTest, InterruptedPrepareLeavesNoTemporaryFiles) {
  {
    std::ofstream big(dir_ + "/big.jsonl");
    for (int i = 0; i < 20000; ++i) big << Conversation(i) << "\n";
  }
  std::ofstream(dir_ + "/big.dfdata") << "an older prepared file";
  Process prepare(BinDir() + "/dflashctl/dflashctl",
                  {"prepare", "--data", dir_ + "/big.jsonl", "--tokenizer",
                   dir_ + "/target/tokenizer.json", "--force", "--threads", "1"},
                  dir_ + "/prepare.log");
  ASSERT_TRUE(WaitFor([&] { return fs::exists(dir_ + "/big.dfdata.tmp"); }, ms(20000)))
      << ReadFile(dir_ + "/prepare.log");
  prepare.Signal(SIGINT);
  EXPECT_EQ(prepare.Wait(), 128 + SIGINT) << ReadFile(dir_ + "/prepare.log");
  EXPECT_FALSE(fs::exists(dir_ + "/big.dfdata.tmp"));
  EXPECT_FALSE(fs::exists(dir_ + "/big.dfdata.tmp.mask"));
  EXPECT_EQ(ReadFile(dir_ + "/big.dfdata"), "an older prepared file");
}

TEST_F(DataFlowTest, PrepareWithoutRunYamlNeedsDataAndTokenizer) {
  EXPECT_EQ(Ctl({"prepare"}).exit_code, 2);
  EXPECT_EQ(Ctl({"prepare", "--data", dir_ + "/train.jsonl"}).exit_code, 2);
  CtlResult r = Ctl({"prepare", "--data", dir_ + "/train.jsonl", "--tokenizer",
                     dir_ + "/target/tokenizer.json", "--out", dir_ + "/x.dfdata", "--block_size",
                     "4", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["documents"], 40);
  EXPECT_TRUE(fs::exists(dir_ + "/x.dfdata"));
}

}  // namespace
}  // namespace dflash::testing
