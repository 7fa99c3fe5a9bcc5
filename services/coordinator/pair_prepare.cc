// Preparing a placed run's pairs (Coordinator::PreparePair): the pair's transport, its memory
// plan against its own GPUs, then PrepareRun on each of its workers in order (the target that
// creates the channel, its tensor-parallel ranks, the drafter) with each settings echo checked.
#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/plan/memory_plan.h"
#include "common/run/resolve.h"
#include "services/coordinator/coordinator.h"
#include "services/coordinator/placement.h"
#include "services/coordinator/settings_echo.h"
#include "services/coordinator/training.h"

namespace dflash::coordinator {

absl::Status Coordinator::CheckPairMemory(const Placement& p, size_t i, const Training& t,
                                          const model::TransformerConfig& tc,
                                          transport::Transport transport) {
  const auto& [target, drafter] = p.pairs[i];
  // The memory plan against this pair's own GPUs, before anything is loaded: both workers
  // together when they share one.
  if (transport::BuffersOf(transport).pair_shares_gpu) {
    RETURN_IF_ERROR(plan::CheckSharedGpuFits(
        t.spec, tc, absl::StrCat("GPU ", target.device().index(), " of ", target.name()),
        static_cast<int64_t>(target.device().total_bytes())));
  }
  std::vector<const v1::WorkerInfo*> checked = {&target, &drafter};
  if (i < p.target_ranks.size()) {
    for (const v1::WorkerInfo& w : p.target_ranks[i]) checked.push_back(&w);
  }
  for (const v1::WorkerInfo* w : checked) {
    if (w->device().kind() != "cuda") continue;
    RETURN_IF_ERROR(plan::CheckFits(t.spec, tc, transport, w == &drafter ? "drafter" : "target",
                                    absl::StrCat(w->name(), " (GPU ", w->device().index(), ")"),
                                    static_cast<int64_t>(w->device().total_bytes())));
  }
  return absl::OkStatus();
}

v1::PrepareRunRequest Coordinator::PrepareRequest(const Placement& p, size_t i, const Training& t,
                                                  transport::Transport transport,
                                                  const Preparation& prep, int64_t tp_rank,
                                                  int64_t tp_world, const PairIds& ids) {
  const bool is_drafter = tp_rank < 0;
  const auto& [target, drafter] = p.pairs[i];
  v1::PrepareRunRequest req;
  req.set_run_id(p.run_id);
  req.set_resolved_config_yaml(p.resolved_yaml);
  req.set_peer_worker_id(is_drafter ? target.worker_id() : drafter.worker_id());
  req.set_pair(static_cast<int64_t>(i));
  req.set_num_pairs(static_cast<int64_t>(p.pairs.size()));
  req.set_total_steps(t.total_steps);
  req.set_resume_checkpoint(t.resume_from);
  req.set_channel(absl::StrCat(prep.group_prefix, "-p", i));
  req.set_transport(transport::TransportName(transport));
  if (is_drafter) req.set_channel_descriptor(ids.channel_descriptor);
  req.set_run_dir(t.run_dir);
  if (is_drafter && p.pairs.size() > 1) {
    req.set_drafter_group(absl::StrCat(prep.group_prefix, "-dp"));
    req.set_collective(transport::CollectiveName(DrafterCollective(drafter)));
    req.set_nccl_unique_id(prep.nccl_unique_id);
  }
  if (!is_drafter && tp_world > 1) {
    req.set_tp_rank(tp_rank);
    req.set_tp_world(tp_world);
    req.set_tp_group(absl::StrCat(prep.group_prefix, "-p", i, "-tp"));
    req.set_tp_collective(transport::CollectiveName(TargetCollective(target)));
    req.set_tp_nccl_unique_id(ids.tp_unique_id);
  }
  return req;
}

void Coordinator::PreparePair(const Placement& p, size_t i, const Training& t, Preparation* prep) {
  const auto& [target, drafter] = p.pairs[i];
  absl::StatusOr<transport::Transport> transport = ResolveTransport(t.spec, target, drafter);
  absl::StatusOr<model::TransformerConfig> tc = run::RunTargetConfig(t.spec);
  if (!transport.ok() || !tc.ok()) {
    prep->status = transport.ok() ? tc.status() : transport.status();
    return;
  }
  prep->status = CheckPairMemory(p, i, t, *tc, *transport);
  if (!prep->status.ok()) return;
  if (i == 0) {
    absl::StatusOr<plan::RunPlan> pl = plan::PlanRun(t.spec, *tc, *transport);
    if (pl.ok()) {
      prep->planned_peaks = {{"target", pl->target.allocator_peak},
                             {"drafter", pl->drafter.allocator_peak}};
    }
  }
  const std::vector<int64_t> layer_ids(t.resolved.target_layer_ids().begin(),
                                       t.resolved.target_layer_ids().end());
  const std::map<std::string, std::string> expected = ExpectedSettings(
      t.spec, layer_ids, t.resolved.mask_token_id(), transport::TransportName(*transport),
      t.total_steps, t.step, static_cast<int64_t>(p.pairs.size()));
  // Target first: it creates the pair's channel, which the drafter then opens; a
  // tensor-parallel group's rank 0 before its other ranks (it creates the group or its id).
  const std::vector<v1::WorkerInfo> extra =
      i < p.target_ranks.size() ? p.target_ranks[i] : std::vector<v1::WorkerInfo>();
  const int64_t tp_world = 1 + static_cast<int64_t>(extra.size());
  std::vector<std::pair<v1::WorkerInfo, int64_t>> order = {{target, 0}};  // (worker, tp rank)
  for (size_t r = 0; r < extra.size(); ++r) order.emplace_back(extra[r], r + 1);
  order.emplace_back(drafter, -1);
  PairIds ids;
  for (const auto& [self, tp_rank] : order) {
    const bool is_drafter = tp_rank < 0;
    auto resp = workers_->PrepareRun(
        self, PrepareRequest(p, i, t, *transport, *prep, tp_rank, tp_world, ids));
    if (!resp.ok()) {
      prep->status = resp.status();
      prep->failed_worker = self.worker_id();
      return;
    }
    if (is_drafter && i == 0) prep->nccl_unique_id = resp->nccl_unique_id();
    if (tp_rank == 0) {
      ids.channel_descriptor = resp->channel_descriptor();
      ids.tp_unique_id = resp->tp_nccl_unique_id();
    }
    prep->status = CheckEcho(
        self.name(), expected,
        std::map<std::string, std::string>(resp->applied().begin(), resp->applied().end()),
        RequiredEcho(is_drafter, tp_rank, expected));
    if (!prep->status.ok()) return;
    prep->echoes.push_back(
        absl::StrCat(self.name(), " applied ", resp->applied_size(), " settings",
                     resp->kernel_overrides().empty()
                         ? ""
                         : absl::StrCat(", kernel overrides ", resp->kernel_overrides()),
                     resp->kernels().empty() ? "" : absl::StrCat(", ", resp->kernels())));
  }
}

}  // namespace dflash::coordinator
