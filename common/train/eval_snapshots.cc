// Held-out evaluation snapshots of a run: the best one's record and the pruning (eval_snapshots.h).
#include "common/train/eval_snapshots.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace dflash::train {
namespace fs = std::filesystem;

namespace {

fs::path BestPath(const std::string& run_dir) { return fs::path(run_dir) / "eval" / "best.json"; }

}  // namespace

absl::StatusOr<std::optional<EvalSnapshot>> ReadBestEval(const std::string& run_dir) {
  const fs::path path = BestPath(run_dir);
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::optional<EvalSnapshot>();
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::DataLossError(absl::StrCat(path.string(), ": cannot read"));
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer() ||
      !j.contains("tau") || !j["tau"].is_number() || !j.contains("dir") || !j["dir"].is_string()) {
    return absl::DataLossError(absl::StrCat(
        path.string(), ": not a best-evaluation record ({\"step\", \"tau\", \"dir\"})"));
  }
  return EvalSnapshot{j["step"].get<int64_t>(), j["tau"].get<double>(),
                      j["dir"].get<std::string>()};
}

absl::StatusOr<EvalSnapshot> RecordEval(const std::string& run_dir, const EvalSnapshot& e) {
  absl::StatusOr<std::optional<EvalSnapshot>> best = ReadBestEval(run_dir);
  if (!best.ok()) return best.status();
  if (best->has_value() && (*best)->tau >= e.tau) return **best;
  const fs::path path = BestPath(run_dir);
  const fs::path tmp = path.string() + ".tmp";
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << nlohmann::json{{"step", e.step}, {"tau", e.tau}, {"dir", e.dir}}.dump() << "\n";
    if (!out.flush()) return absl::InternalError(absl::StrCat("cannot write ", tmp.string()));
  }
  fs::rename(tmp, path, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot write ", path.string(), ": ", ec.message()));
  return e;
}

void PruneEvalSnapshots(const std::string& run_dir, const std::vector<std::string>& keep) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(fs::path(run_dir) / "eval", ec)) {
    if (!entry.is_directory()) continue;
    bool kept = false;
    for (const std::string& k : keep) {
      std::error_code same_ec;  // a `keep` path that does not exist matches nothing
      kept |= fs::equivalent(entry.path(), k, same_ec);
    }
    std::error_code rm_ec;
    if (!kept) fs::remove_all(entry.path(), rm_ec);
  }
}

}  // namespace dflash::train
