// A run on the real SmolLM2-135M-Instruct (Llama) through the real processes with
// drafter.mask_token_id auto: one id from submit to export. The coordinator resolves it at submit
// and at the run's start (logged, in `dflashctl status -o json`), both workers apply it (the
// settings echo is compared), and the exported config.json carries it (dflash_config, where the
// DFlash inference code reads it) with the same target layer ids. The data is the built-in set
// (token ids below 512), so no tokenizer runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/integration/training_cluster.h"

namespace dflash::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
using ms = std::chrono::milliseconds;

TEST_F(TrainingCluster, ASmolLM2RunUsesOneMaskTokenFromSubmitToExport) {
  const char* models = std::getenv("DFLASH_MODELS");
  const std::string home = std::getenv("HOME") ? std::getenv("HOME") : "";
  const std::filesystem::path smol =
      std::filesystem::path(models ? models : home + "/.local/share/dflash/models") /
      "SmolLM2-135M-Instruct";
  if (!std::filesystem::exists(smol / "model.safetensors")) {
    ASSERT_FALSE(std::filesystem::exists(home + "/.local/share/dflash/venv"))
        << smol << " is missing although the venv exists: run scripts/setup.sh";
    GTEST_SKIP() << smol << " is missing";
  }
  StartWorker("target", "t0");
  StartWorker("drafter", "d0");
  const std::string run = Submit(WriteRunYaml(
      "smol.yaml", absl::StrCat("name: smol\ntarget: {path: \"", smol.string(),
                                "\", dtype: float32}\n"
                                "drafter: {layers: 1, block_size: 8}\n"
                                "data: {train: \"builtin:tiny-chat\", max_length: 256}\n"
                                "batching: {token_budget: 512, max_anchors: 32}\n"
                                "optim: {max_steps: 2}\n"
                                "placement: {pairs: 1, transport: host}\n")));
  ASSERT_FALSE(run.empty());
  WaitFor(
      [&] {
        const std::string state = Status(run).value("state", "");
        return state == "RUN_STATE_DONE" || state == "RUN_STATE_FAILED";
      },
      ms(300000));
  const json status = Status(run);
  ASSERT_EQ(status.value("state", ""), "RUN_STATE_DONE")
      << status.dump() << ReadFile(dir_ + "/t0.log") << ReadFile(dir_ + "/d0.log");
  const json& resolved = status["resolved_target"];
  EXPECT_EQ(resolved["mask_token_id"], "3");
  EXPECT_EQ(resolved["mask_token"], "<repo_name>");
  std::vector<int64_t> layer_ids;
  for (const json& id : resolved["target_layer_ids"])
    layer_ids.push_back(std::stoll(id.get<std::string>()));
  ASSERT_EQ(layer_ids.size(), 5u);
  // The run's log says what it resolved.
  EXPECT_THAT(ReadFile(dir_ + "/state/runs/" + run + "/logs/coordinator.log"),
              HasSubstr("mask token id 3 (<repo_name>: "));
  // The export carries the same ids.
  std::ifstream in(dir_ + "/state/runs/" + run + "/export/config.json");
  ASSERT_TRUE(in) << "no export";
  const json exported = json::parse(in);
  EXPECT_EQ(exported["dflash_config"]["mask_token_id"], 3);
  EXPECT_EQ(exported["dflash_config"]["target_layer_ids"].get<std::vector<int64_t>>(), layer_ids);
}

}  // namespace
}  // namespace dflash::testing
