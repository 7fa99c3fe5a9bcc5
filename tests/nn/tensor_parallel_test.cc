// Tensor-parallel target models (common/nn/tensor_parallel.h) on the CPU in fp32: a group of two
// ranks (threads here, each with its own transport::HostCommunicator over one shared-memory
// segment, as two target worker processes would have) loads the tiny checkpoints of hf_oracle.py,
// runs the same packed batch, and must give both ranks the same features, equal to the
// single-process model and to transformers' within fp32 rounding. Dense Qwen3 and Llama, Qwen3-MoE,
// Qwen3-Next (hybrid linear attention, MoE with a shared expert) and the Qwen3.5 vision-language
// layout.
#include <ATen/TensorOperators.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/nn/target_model.h"
#include "common/transport/host_communicator.h"
#include "tests/nn/oracle.h"

namespace dflash::nn {
namespace {

namespace fs = std::filesystem;
using oracle::ReadAll;
using oracle::RelError;
using oracle::ToVector;

TargetModelOptions Fp32(const std::vector<int64_t>& layer_ids) {
  TargetModelOptions options;
  options.layer_ids = layer_ids;
  options.dtype = at::kFloat;
  return options;
}

// Loads `dir` as rank r of `world` (threads) and returns every rank's features for the refs' batch.
std::vector<at::Tensor> RunGroup(const fs::path& dir, std::map<std::string, at::Tensor>& refs,
                                 int world) {
  static int group = 0;
  const std::string name = absl::StrCat("dflash_tp_test_", getpid(), "_", group++);
  std::vector<at::Tensor> features(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      transport::HostCommunicator::Options copts;
      copts.rank = rank;
      copts.world = world;
      auto comm = transport::HostCommunicator::Create(name, copts);
      if (!comm.ok()) {
        errors[rank] = comm.status().ToString();
        return;
      }
      TargetModelOptions options = Fp32(ToVector(refs["layer_ids"]));
      options.tp_rank = rank;
      options.tp_world = world;
      options.tp_all_reduce = [c = comm->get()](const at::Tensor& t) {
        return c->AllReduceSum(t.data_ptr(), t.numel(), transport::ReduceType::kFloat32, false);
      };
      auto model = TargetModel::Load(dir.string(), options);
      if (!model.ok()) {
        errors[rank] = model.status().ToString();
        (*comm)->Abort();  // the other rank must not wait for this one
        return;
      }
      auto out = (*model)->Forward(refs["input_ids"], refs["positions"], refs["cu_seqlens"]);
      if (!out.ok()) {
        errors[rank] = out.status().ToString();
        return;
      }
      features[rank] = *out;
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < world; ++rank) EXPECT_EQ(errors[rank], "") << "rank " << rank;
  return features;
}

class TensorParallelTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    *oracle_error_ = oracle::GenerateOracleOutputs();
    if (oracle_error_->empty()) *oracle_error_ = oracle::GenerateQwen35OracleOutputs();
  }
  void SetUp() override { ASSERT_TRUE(oracle_error_->empty()) << *oracle_error_; }
  static fs::path Root(const std::string& family) {
    return absl::StartsWith(family, "qwen3_5") ? oracle::Qwen35OracleDir() : oracle::OracleDir();
  }
  static std::string* oracle_error_;
};
std::string* TensorParallelTest::oracle_error_ = new std::string;

TEST_P(TensorParallelTest, TwoRanksGiveTheSingleProcessFeatures) {
  const std::string family = GetParam();
  const fs::path dir = Root(family) / family;
  auto refs = ReadAll(Root(family) / (family + "_refs.safetensors"));
  auto single = TargetModel::Load(dir.string(), Fp32(ToVector(refs["layer_ids"])));
  ASSERT_TRUE(single.ok()) << single.status();
  auto want = (*single)->Forward(refs["input_ids"], refs["positions"], refs["cu_seqlens"]);
  ASSERT_TRUE(want.ok()) << want.status();

  const std::vector<at::Tensor> got = RunGroup(dir, refs, 2);
  ASSERT_TRUE(got[0].defined() && got[1].defined());
  EXPECT_TRUE(at::equal(got[0], got[1])) << "the ranks' features differ";
  const int64_t h = (*single)->config().hidden_size;
  for (int64_t slot = 0; slot < got[0].size(1) / h; ++slot) {
    const double vs_single = RelError(got[0].narrow(1, slot * h, h), want->narrow(1, slot * h, h));
    const double vs_hf =
        RelError(got[0].narrow(1, slot * h, h), refs["features"].narrow(1, slot * h, h));
    std::printf("%s tp 2 feature %ld: vs 1 process %.3g, vs transformers %.3g\n", family.c_str(),
                slot, vs_single, vs_hf);
    EXPECT_LT(vs_single, 1e-5) << "feature slot " << slot;
    EXPECT_LT(vs_hf, 1e-4) << "feature slot " << slot;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, TensorParallelTest,
                         ::testing::Values("qwen3", "llama", "qwen3_moe", "qwen3_next", "qwen3_5",
                                           "qwen3_5_moe"));

TEST(TensorParallelOptions, BadGroupsAreRefusedNamingTheField) {
  const fs::path dir = oracle::OracleDir() / "qwen3";
  ASSERT_EQ(oracle::GenerateOracleOutputs(), "");
  auto sum = [](const at::Tensor&) { return absl::OkStatus(); };
  TargetModelOptions o = Fp32({0, 1});
  o.tp_world = 3;
  o.tp_all_reduce = sum;
  auto m = TargetModel::Load(dir.string(), o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      absl::StrContains(m.status().message(), "num_attention_heads 4 is not a multiple of 3"))
      << m.status();
  o.tp_world = 2;
  o.tp_rank = 2;
  EXPECT_EQ(TargetModel::Load(dir.string(), o).status().code(), absl::StatusCode::kInvalidArgument);
  o.tp_rank = 1;
  o.tp_all_reduce = nullptr;
  EXPECT_EQ(TargetModel::Load(dir.string(), o).status().code(), absl::StatusCode::kInvalidArgument);
  o.tp_all_reduce = sum;
  o.full = true;
  EXPECT_EQ(TargetModel::Load(dir.string(), o).status().code(), absl::StatusCode::kUnimplemented);
}

TEST(TensorParallelOptions, AFailedAllReduceEndsTheForwardWithItsError) {
  ASSERT_EQ(oracle::GenerateOracleOutputs(), "");
  auto refs = ReadAll(oracle::OracleDir() / "qwen3_refs.safetensors");
  TargetModelOptions o = Fp32(ToVector(refs["layer_ids"]));
  o.tp_world = 2;
  int calls = 0;
  o.tp_all_reduce = [&calls](const at::Tensor&) {
    return ++calls < 3 ? absl::OkStatus() : absl::AbortedError("peer gone");
  };
  auto m = TargetModel::Load((oracle::OracleDir() / "qwen3").string(), o);
  ASSERT_TRUE(m.ok()) << m.status();
  auto out = (*m)->Forward(refs["input_ids"], refs["positions"], refs["cu_seqlens"]);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(calls, 3);
}

}  // namespace
}  // namespace dflash::nn
