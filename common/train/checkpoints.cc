#include "common/train/checkpoints.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dflash::train {
namespace {

namespace fs = std::filesystem;

constexpr char kPrefix[] = "step-";
constexpr char kSuffix[] = ".safetensors";

// Steps and paths of the checkpoints in `dir`, ascending by step.
absl::StatusOr<std::vector<std::pair<int64_t, fs::path>>> List(const std::string& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t p = sizeof(kPrefix) - 1, s = sizeof(kSuffix) - 1;
    if (name.size() <= p + s || name.compare(0, p, kPrefix) != 0 ||
        name.compare(name.size() - s, s, kSuffix) != 0) {
      continue;
    }
    int64_t step = 0;
    if (!absl::SimpleAtoi(name.substr(p, name.size() - p - s), &step) || step < 0) continue;
    out.emplace_back(step, it->path());
  }
  if (ec) return absl::InternalError(absl::StrCat(dir, ": cannot list: ", ec.message()));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string CheckpointPath(const std::string& dir, int64_t step) {
  return (fs::path(dir) / absl::StrFormat("%s%012d%s", kPrefix, step, kSuffix)).string();
}

absl::StatusOr<std::optional<std::string>> LatestCheckpoint(const std::string& dir,
                                                            int64_t max_step) {
  auto all = List(dir);
  if (!all.ok()) return all.status();
  for (auto it = all->rbegin(); it != all->rend(); ++it) {
    if (it->first <= max_step) return std::optional<std::string>(it->second.string());
  }
  return std::optional<std::string>();
}

absl::Status PruneCheckpoints(const std::string& dir, int64_t keep) {
  if (keep < 1) return absl::InvalidArgumentError("checkpoint.keep: must be at least 1");
  auto all = List(dir);
  if (!all.ok()) return all.status();
  for (size_t i = 0; i + static_cast<size_t>(keep) < all->size(); ++i) {
    std::error_code ec;
    fs::remove((*all)[i].second, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat((*all)[i].second.string(), ": cannot remove: ", ec.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace dflash::train
