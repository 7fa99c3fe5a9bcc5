// One copy of a target per worker process (services/target_worker/shared_target.h): regeneration
// (the evaluator's Generate) and then a run's training (the target runner's Prepare) on the same
// target load it once; the resident memory of the process, measured, grows by the weights once.
// A run on another target drops the idle copy first. The target is the real
// SmolLM2-135M-Instruct checkpoint (fp32, 538 MB of weights).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "services/target_worker/shared_target.h"
#include "services/target_worker/target_runner.h"
#include "services/worker_common/evaluator.h"

namespace dflash::worker {
namespace {

namespace fs = std::filesystem;

fs::path SmolLM2Dir() {
  const char* models = std::getenv("DFLASH_MODELS");
  const std::string home = std::getenv("HOME") ? std::getenv("HOME") : "";
  return fs::path(models ? models : home + "/.local/share/dflash/models") / "SmolLM2-135M-Instruct";
}

// The process's resident set in bytes (/proc/self/statm).
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

config::RunSpec Spec(const std::string& target) {
  const std::string yaml =
      absl::StrCat("name: cache\ntarget: {path: \"", target, "\", dtype: float32}\n",
                   "drafter: {layers: 1, block_size: 8}\n",
                   "data: {train: \"builtin:tiny-chat\", max_length: 256}\n",
                   "batching: {token_budget: 512, max_anchors: 32}\noptim: {max_steps: 1}\n");
  auto spec = config::ParseRunSpec(yaml, "cache.yaml", config::RunSpecOptions{"", true});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

RunContext Context(const config::RunSpec& spec, const std::string& name) {
  RunContext ctx;
  ctx.run_id = name;
  ctx.spec = spec;
  ctx.channel = absl::StrCat("dflash-target-cache-test-", name, "-", getpid());
  return ctx;
}

TEST(TargetCacheTest, RegenThenTrainingOnTheSameTargetLoadItOnce) {
  const fs::path dir = SmolLM2Dir();
  if (!fs::exists(dir / "model.safetensors")) {
    const std::string home = std::getenv("HOME") ? std::getenv("HOME") : "";
    ASSERT_FALSE(fs::exists(home + "/.local/share/dflash/venv"))
        << dir << " is missing although the venv exists: run scripts/setup.sh";
    GTEST_SKIP() << dir << " is missing";
  }
  const int64_t weights = static_cast<int64_t>(fs::file_size(dir / "model.safetensors"));
  TargetCache& cache = TargetCache::Process();
  const config::RunSpec spec = Spec(dir.string());
  const int64_t loads = cache.loads();

  // Regeneration: the evaluator generates with the full target, which stays loaded (idle).
  std::unique_ptr<Evaluator> evaluator = NewTargetEvaluator();
  GenerateWork work;
  work.spec = spec;
  work.prompts = {{1, 504, 2683, 198}};
  work.max_new_tokens = {2};
  const int64_t before = ResidentBytes();
  auto generated = evaluator->Generate(work);
  ASSERT_TRUE(generated.ok()) << generated.status();
  const int64_t after_regen = ResidentBytes();
  EXPECT_EQ(cache.loads(), loads + 1);
  // The measurement sees a copy of the weights.
  EXPECT_GT(after_regen - before, weights / 2) << "resident " << before << " -> " << after_regen;

  // Training on the same target: the runner takes regen's copy.
  std::unique_ptr<StepRunner> runner = NewTargetRunner();
  auto prepared = runner->Prepare(Context(spec, "same"));
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  const int64_t after_prepare = ResidentBytes();
  EXPECT_EQ(cache.loads(), loads + 1);
  EXPECT_EQ(cache.live_models(), 1);
  EXPECT_LT(after_prepare - after_regen, weights / 4)
      << "resident " << after_regen << " -> " << after_prepare << " for " << weights
      << " bytes of weights";
  std::printf("resident bytes: %lld before, %lld after regen, %lld after the run's Prepare\n",
              static_cast<long long>(before), static_cast<long long>(after_regen),
              static_cast<long long>(after_prepare));
  // Regen again while the run holds it: still the one copy.
  ASSERT_TRUE(evaluator->Generate(work).ok());
  EXPECT_EQ(cache.loads(), loads + 1);

  // The run ends; a run on another target drops the idle copy before loading its own.
  runner->Abort();
  runner.reset();
  runner = NewTargetRunner();
  prepared = runner->Prepare(Context(Spec("builtin:tiny-qwen3"), "other"));
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_EQ(cache.loads(), loads + 2);
  EXPECT_EQ(cache.live_models(), 1);  // SmolLM2's copy was freed
  runner->Abort();
  runner.reset();
  cache.DropIdle();
  EXPECT_EQ(cache.live_models(), 0);
}

}  // namespace
}  // namespace dflash::worker
