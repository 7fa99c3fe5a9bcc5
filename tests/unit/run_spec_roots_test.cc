// run.yaml paths confined to the coordinator's data roots: a path
// inside a root is accepted; `..` that climbs out, a symlink inside a root that leads out, and a
// path elsewhere are refused, naming the field and where the path really leads; built-in names
// are not paths.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/config/run_spec.h"

namespace dflash::config {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TEST(RunSpecDataRootsTest, PathsMustLeadInsideARoot) {
  char tmpl[] = "/tmp/dflash-roots-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const fs::path top(tmpl);
  const fs::path root = top / "root", outside = top / "outside";
  fs::create_directories(root / "model");
  fs::create_directories(outside / "model");
  std::ofstream(root / "train.jsonl") << "{}\n";
  std::ofstream(outside / "train.jsonl") << "{}\n";
  fs::create_directory_symlink(outside / "model", root / "escape");
  RunSpecOptions o;
  o.base_dir = root.string();
  o.data_roots = {root.string()};
  const auto parse = [&](const std::string& target, const std::string& train) {
    return ParseRunSpec(
        absl::StrCat("name: r\ntarget: {path: \"", target, "\"}\ndata: {train: \"", train, "\"}\n"),
        "run.yaml", o);
  };
  EXPECT_TRUE(parse("model", "train.jsonl").ok()) << parse("model", "train.jsonl").status();
  EXPECT_TRUE(parse("builtin:tiny-qwen3", "builtin:tiny-chat").ok());
  const absl::Status dots = parse("../outside/model", "train.jsonl").status();
  EXPECT_THAT(dots.message(), HasSubstr("target.path: "));
  EXPECT_THAT(dots.message(), HasSubstr("outside the coordinator's data roots"));
  const absl::Status link = parse("escape", "train.jsonl").status();
  EXPECT_THAT(link.message(),
              HasSubstr(absl::StrCat("leads to ", (outside / "model").string(), ", outside")));
  const absl::Status elsewhere = parse("model", (outside / "train.jsonl").string()).status();
  EXPECT_THAT(elsewhere.message(), HasSubstr("data.train: "));
  // A sibling whose name starts like the root is not inside it.
  fs::create_directories(top / "root2" / "model");
  EXPECT_FALSE(parse((top / "root2" / "model").string(), "train.jsonl").ok());
  // No roots: nothing confined.
  o.data_roots.clear();
  EXPECT_TRUE(parse("escape", "train.jsonl").ok());
  fs::remove_all(top);
}

}  // namespace
}  // namespace dflash::config
