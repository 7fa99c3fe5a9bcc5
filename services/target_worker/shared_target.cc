#include "services/target_worker/shared_target.h"

#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dflash::worker {
namespace {

std::mutex& Mu() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::map<std::string, std::weak_ptr<nn::TargetModel>>& Registry() {
  static auto* r = new std::map<std::string, std::weak_ptr<nn::TargetModel>>;
  return *r;
}

}  // namespace

std::string TargetKey(const config::RunSpec& spec, c10::Device device) {
  return absl::StrCat(spec.target.path, "|", spec.target.dtype, "|",
                      spec.target.layer_ids ? absl::StrJoin(*spec.target.layer_ids, ",") : "auto",
                      "|", device.str());
}

std::shared_ptr<nn::TargetModel> FindSharedTarget(const std::string& key) {
  std::lock_guard<std::mutex> lock(Mu());
  auto it = Registry().find(key);
  return it == Registry().end() ? nullptr : it->second.lock();
}

void ShareTarget(const std::string& key, const std::shared_ptr<nn::TargetModel>& model) {
  std::lock_guard<std::mutex> lock(Mu());
  Registry()[key] = model;
}

}  // namespace dflash::worker
