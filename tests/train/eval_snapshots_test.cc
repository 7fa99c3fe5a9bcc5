// The best held-out evaluation of a run (eval/best.json) and the pruning of eval/ snapshots, on a
// real directory: the best is replaced only by a higher tau, survives the pruning beside the
// newest, and a damaged record is an error naming the file.
#include "common/train/eval_snapshots.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace dflash::train {
namespace {

namespace fs = std::filesystem;

class EvalSnapshotsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    run_dir_ = (fs::path(::testing::TempDir()) /
                ("eval_snapshots_" + std::to_string(::getpid()) + "_" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                   .string();
    fs::remove_all(run_dir_);
    fs::create_directories(fs::path(run_dir_) / "eval");
  }
  void TearDown() override { fs::remove_all(run_dir_); }

  // A snapshot directory of `step` as the coordinator names it.
  std::string Snapshot(int64_t step) {
    const fs::path dir = fs::path(run_dir_) / "eval" / ("step-" + std::to_string(step));
    fs::create_directories(dir);
    std::ofstream(dir / "model.safetensors") << "x";
    return dir.string();
  }

  std::string run_dir_;
};

TEST_F(EvalSnapshotsTest, NoRecordBeforeTheFirstEvaluation) {
  auto best = ReadBestEval(run_dir_);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_FALSE(best->has_value());
}

TEST_F(EvalSnapshotsTest, KeepsTheHighestTauAndTheNewestSnapshot) {
  // The held-out curve of the real model's run: up to step 4000, then down.
  const std::pair<int64_t, double> curve[] = {{1000, 2.22}, {2000, 2.99}, {3000, 3.44},
                                              {4000, 3.98}, {5000, 3.93}, {6000, 3.70}};
  std::string best_dir;
  for (const auto& [step, tau] : curve) {
    const std::string dir = Snapshot(step);
    auto best = RecordEval(run_dir_, {step, tau, dir});
    ASSERT_TRUE(best.ok()) << best.status();
    if (step <= 4000) best_dir = dir;
    EXPECT_EQ(best->dir, best_dir) << "after step " << step;
    PruneEvalSnapshots(run_dir_, {dir, best->dir});
    EXPECT_TRUE(fs::exists(dir)) << dir;
    EXPECT_TRUE(fs::exists(best_dir)) << best_dir;
  }
  // Only the best (4000) and the newest (6000) are left.
  int left = 0;
  for (const auto& e : fs::directory_iterator(fs::path(run_dir_) / "eval"))
    left += e.is_directory();
  EXPECT_EQ(left, 2);
  EXPECT_FALSE(fs::exists(fs::path(run_dir_) / "eval" / "step-5000"));
  auto read = ReadBestEval(run_dir_);
  ASSERT_TRUE(read.ok() && read->has_value());
  EXPECT_EQ((*read)->step, 4000);
  EXPECT_DOUBLE_EQ((*read)->tau, 3.98);
  EXPECT_EQ((*read)->dir, best_dir);
}

TEST_F(EvalSnapshotsTest, ATieKeepsTheEarlierStep) {
  const std::string first = Snapshot(10);
  ASSERT_TRUE(RecordEval(run_dir_, {10, 2.5, first}).ok());
  auto best = RecordEval(run_dir_, {20, 2.5, Snapshot(20)});
  ASSERT_TRUE(best.ok());
  EXPECT_EQ(best->step, 10);
}

TEST_F(EvalSnapshotsTest, ADamagedRecordIsAnErrorNamingTheFile) {
  std::ofstream(fs::path(run_dir_) / "eval" / "best.json") << "{\"step\": \"ten\"}";
  auto best = ReadBestEval(run_dir_);
  ASSERT_FALSE(best.ok());
  EXPECT_NE(best.status().message().find("best.json"), std::string::npos) << best.status();
  // Recording over it fails too, rather than silently replacing a record it cannot read.
  EXPECT_FALSE(RecordEval(run_dir_, {30, 9.0, Snapshot(30)}).ok());
}

}  // namespace
}  // namespace dflash::train
