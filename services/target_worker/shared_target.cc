#include "services/target_worker/shared_target.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/train/run_setup.h"

namespace dflash::worker {
namespace {

transport::ReduceType ReduceTypeOf(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::BFloat16:
      return transport::ReduceType::kBFloat16;
    case c10::ScalarType::Half:
      return transport::ReduceType::kFloat16;
    case c10::ScalarType::Double:
      return transport::ReduceType::kFloat64;
    default:
      return transport::ReduceType::kFloat32;
  }
}

}  // namespace

std::function<absl::Status(const at::Tensor&)> SumOver(transport::Communicator* comm) {
  return [comm](const at::Tensor& t) {
    return comm->AllReduceSum(t.data_ptr(), static_cast<size_t>(t.numel()),
                              ReduceTypeOf(t.scalar_type()), t.is_cuda());
  };
}

std::function<absl::Status(const at::Tensor&)> NoGroupYet() {
  return [](const at::Tensor&) {
    return absl::FailedPreconditionError(
        "a cached tensor-parallel shard sums through its user's group "
        "(TargetModel::WithAllReduce), and none was bound");
  };
}

TargetCache& TargetCache::Process() {
  static TargetCache* const cache = new TargetCache;
  return *cache;
}

absl::StatusOr<std::shared_ptr<nn::TargetModel>> TargetCache::Acquire(const config::RunSpec& spec,
                                                                      c10::Device device, Need need,
                                                                      const Loader& loader) {
  std::vector<int64_t> layer_ids;
  if (need.features) {
    absl::StatusOr<model::TransformerConfig> config = run::RunTargetConfig(spec);
    if (!config.ok()) return config.status();
    absl::StatusOr<std::vector<int64_t>> ids = run::RunLayerIds(spec, *config);
    if (!ids.ok()) return ids.status();
    layer_ids = *std::move(ids);
  }
  const std::string key = absl::StrCat(spec.target.path, "|", spec.target.dtype, "|", device.str(),
                                       "|tp ", need.tp_rank, "/", need.tp_world);
  std::lock_guard<std::mutex> lock(mu_);  // held through a load: one load at a time
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                [](const Entry& e) { return e.model.expired(); }),
                 entries_.end());
  for (const Entry& e : entries_) {
    if (e.key != key) continue;
    std::shared_ptr<nn::TargetModel> m = e.model.lock();
    if (m == nullptr) continue;
    if ((!need.full || m->full()) && (!need.features || m->layer_ids() == layer_ids)) return m;
  }
  // Nothing alive serves it: free the idle model (unless in use) before loading another.
  idle_.reset();
  absl::StatusOr<std::unique_ptr<nn::TargetModel>> loaded = loader();
  if (!loaded.ok()) return loaded.status();
  ++loads_;
  std::shared_ptr<nn::TargetModel> m(*std::move(loaded));
  entries_.push_back({key, m});
  return m;
}

void TargetCache::KeepIdle(std::shared_ptr<nn::TargetModel> model) {
  std::shared_ptr<nn::TargetModel> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old = std::exchange(idle_, std::move(model));
  }
  // `old` is released here, outside the lock.
}

void TargetCache::DropIdle() { KeepIdle(nullptr); }

int64_t TargetCache::loads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loads_;
}

int64_t TargetCache::live_models() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::count_if(entries_.begin(), entries_.end(),
                       [](const Entry& e) { return !e.model.expired(); });
}

}  // namespace dflash::worker
