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

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/nn/generate.h"
#include "common/nn/target_model.h"
#include "common/spec/speculative.h"
#include "common/transport/host_communicator.h"
#include "tests/nn/oracle.h"
#include "tests/nn/proposers.h"

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

// Runs `body(rank, options)` on `world` threads, each rank with its own
// transport::HostCommunicator over one shared-memory segment (as separate processes would have):
// `options` is Fp32(layer_ids) with the rank's tp fields set. Returns each rank's error ("" when
// none); a rank that fails aborts its communicator, so that the others do not wait for it.
std::vector<std::string> OnGroup(
    int world, const std::vector<int64_t>& layer_ids,
    const std::function<std::string(int rank, const TargetModelOptions&)>& body) {
  static int group = 0;
  const std::string name = absl::StrCat("dflash_tp_test_", getpid(), "_", group++);
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
      TargetModelOptions options = Fp32(layer_ids);
      options.tp_rank = rank;
      options.tp_world = world;
      options.tp_all_reduce = [c = comm->get()](const at::Tensor& t) {
        return c->AllReduceSum(t.data_ptr(), t.numel(), transport::ReduceType::kFloat32, false);
      };
      errors[rank] = body(rank, options);
      if (!errors[rank].empty()) (*comm)->Abort();
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Loads `dir` as rank r of `world` (threads) and returns every rank's features for the refs' batch.
std::vector<at::Tensor> RunGroup(const fs::path& dir, std::map<std::string, at::Tensor>& refs,
                                 int world) {
  std::vector<at::Tensor> features(world);
  const std::vector<std::string> errors =
      OnGroup(world, ToVector(refs["layer_ids"]), [&](int rank, const TargetModelOptions& o) {
        auto model = TargetModel::Load(dir.string(), o);
        if (!model.ok()) return model.status().ToString();
        auto out = (*model)->Forward(refs["input_ids"], refs["positions"], refs["cu_seqlens"]);
        if (!out.ok()) return out.status().ToString();
        features[rank] = *out;
        return std::string();
      });
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

// Generation across the ranks (TargetModelOptions.full with tp_world 2): each rank holds its heads'
// share of the KV cache (and of the recurrent states of a hybrid's linear-attention layers), and
// both make the same Extend calls. Greedy decoding gives every rank the single process's tokens
// (fp32: the sums run in another order, far below the logits' gaps here); so does speculative
// decoding whose proposals are right for the first two slots of each block (verification,
// rejection, the KV cache's truncation and a hybrid's replay of the kept tokens); sampled
// decoding with one seed gives both ranks the same tokens (their logits are bit-identical).
TEST_P(TensorParallelTest, TwoRanksGenerateTheSingleProcessTokens) {
  const std::string family = GetParam();
  const fs::path dir = Root(family) / family;
  const std::vector<std::vector<int64_t>> prompts = {{3, 17, 200, 5, 9}, {41}, {7, 128, 64, 2}};
  constexpr int64_t kNew = 12, kBlock = 4;
  TargetModelOptions whole = Fp32({0, 1});
  whole.full = true;
  auto single = TargetModel::Load(dir.string(), whole);
  ASSERT_TRUE(single.ok()) << single.status();
  GenerateOptions greedy;
  greedy.max_new_tokens = kNew;
  auto want_out = Generate(**single, prompts, greedy);
  ASSERT_TRUE(want_out.ok()) << want_out.status();
  std::vector<std::vector<int64_t>> want;
  for (const Generation& g : *want_out) want.push_back(g.tokens);

  std::vector<std::vector<std::vector<int64_t>>> plain(2), speculative(2), sampled(2);
  const std::vector<std::string> errors =
      OnGroup(2, {0, 1}, [&](int rank, const TargetModelOptions& shard) {
        TargetModelOptions o = shard;
        o.full = true;
        auto model = TargetModel::Load(dir.string(), o);
        if (!model.ok()) return model.status().ToString();
        auto g = Generate(**model, prompts, greedy);
        if (!g.ok()) return g.status().ToString();
        for (const Generation& out : *g) plain[rank].push_back(out.tokens);
        // Right for the first two slots of every block, wrong after.
        const spec::Proposer knowing = testing::KnowingProposer(prompts, want, kBlock, 2);
        spec::SpecDecodeOptions so;
        so.max_new_tokens = kNew;
        auto s = spec::SpeculativeGenerate(**model, kBlock, knowing, prompts, so);
        if (!s.ok()) return s.status().ToString();
        speculative[rank] = s->tokens;
        GenerateOptions drawn = greedy;
        drawn.sampling.temperature = 0.9;
        drawn.sampling.top_p = 0.95;
        drawn.sampling.seed = 5;
        auto d = Generate(**model, prompts, drawn);
        if (!d.ok()) return d.status().ToString();
        for (const Generation& out : *d) sampled[rank].push_back(out.tokens);
        return std::string();
      });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(errors[rank], "") << "rank " << rank;
    EXPECT_EQ(plain[rank], want) << family << " rank " << rank << ": greedy";
    EXPECT_EQ(speculative[rank], want) << family << " rank " << rank << ": speculative";
  }
  EXPECT_EQ(sampled[0], sampled[1]) << family << ": sampled, one seed";
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

// A rank whose all-reduce fails mid-generation (its peer gone) ends Extend with that error, and the
// cache's lengths are left as they were (nothing half-extended counts as generated).
TEST(TensorParallelOptions, AFailedAllReduceEndsExtendWithItsError) {
  ASSERT_EQ(oracle::GenerateOracleOutputs(), "");
  TargetModelOptions o = Fp32({0, 1});
  o.full = true;
  o.tp_world = 2;
  int calls = 0;
  o.tp_all_reduce = [&calls](const at::Tensor&) {
    return ++calls < 3 ? absl::OkStatus() : absl::AbortedError("peer gone");
  };
  auto m = TargetModel::Load((oracle::OracleDir() / "qwen3").string(), o);
  ASSERT_TRUE(m.ok()) << m.status();
  auto cache = KvCache::Create(**m, 1, 16);
  ASSERT_TRUE(cache.ok()) << cache.status();
  auto out = (*m)->Extend({0}, {{3, 17, 200}}, cache->get(), false);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kAborted) << out.status();
  EXPECT_EQ(calls, 3);
  EXPECT_EQ((*cache)->length(0), 0);
}

// WithAllReduce: a second user of the same shard sums over its own group; the weights are the
// same tensors (not copied).
TEST(TensorParallelOptions, WithAllReduceSharesTheWeightsAndSumsOverTheOtherGroup) {
  ASSERT_EQ(oracle::GenerateOracleOutputs(), "");
  auto refs = ReadAll(oracle::OracleDir() / "qwen3_refs.safetensors");
  TargetModelOptions o = Fp32(ToVector(refs["layer_ids"]));
  o.tp_world = 2;
  int first = 0, second = 0;
  o.tp_all_reduce = [&first](const at::Tensor&) {
    ++first;
    return absl::OkStatus();
  };
  auto m = TargetModel::Load((oracle::OracleDir() / "qwen3").string(), o);
  ASSERT_TRUE(m.ok()) << m.status();
  std::unique_ptr<TargetModel> other = (*m)->WithAllReduce([&second](const at::Tensor&) {
    ++second;
    return absl::OkStatus();
  });
  EXPECT_TRUE((*m)->embed_tokens().is_same(other->embed_tokens()));
  EXPECT_EQ(other->tp_world(), 2);
  ASSERT_TRUE(other->Forward(refs["input_ids"], refs["positions"], refs["cu_seqlens"]).ok());
  EXPECT_EQ(first, 0);
  EXPECT_GT(second, 0);
}

}  // namespace
}  // namespace dflash::nn
