// ProfileKernels under LibTorch's Kineto profiler (CUDA activity through CUPTI).
#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/device/kernel_profile.h"

namespace dflash::device {
namespace {

struct Span {
  uint64_t begin, end;
  std::string name;
  bool operator<(const Span& o) const { return begin < o.begin; }
};

// The names of the host ops overlapping [lo, hi), most overlap first, at most 4 distinct.
std::vector<std::string> HostOpsWithin(const std::vector<Span>& host, uint64_t lo, uint64_t hi) {
  std::vector<std::pair<uint64_t, std::string>> overlap;
  for (const Span& h : host) {
    const uint64_t a = std::max(h.begin, lo), b = std::min(h.end, hi);
    if (b > a) overlap.emplace_back(b - a, h.name);
  }
  std::sort(overlap.begin(), overlap.end(),
            [](const auto& x, const auto& y) { return x.first > y.first; });
  std::vector<std::string> names;
  for (size_t i = 0; i < overlap.size() && names.size() < 4; ++i) {
    if (std::find(names.begin(), names.end(), overlap[i].second) == names.end()) {
      names.push_back(overlap[i].second);
    }
  }
  return names;
}

}  // namespace

absl::StatusOr<KernelProfile> ProfileKernels(const std::function<void()>& work, bool host_ops) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  using torch::profiler::impl::ProfilerConfig;
  using torch::profiler::impl::ProfilerState;
  KernelProfile out;
  std::unique_ptr<prof::ProfilerResult> result;
  const ProfilerConfig config(ProfilerState::KINETO);
  std::set<ActivityType> activities{ActivityType::CUDA};
  if (host_ops) activities.insert(ActivityType::CPU);
  try {
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
  } catch (const std::exception& e) {  // `work` has not run
    return absl::InternalError(absl::StrCat("kineto profiler: ", e.what()));
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    work();
  } catch (...) {  // the profiler off again, then the work's own exception, as unprofiled
    try {
      prof::disableProfiler();
    } catch (...) {
    }
    throw;
  }
  out.wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  try {
    result = prof::disableProfiler();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("kineto profiler: ", e.what()));
  }
  std::map<std::string, KernelTotal> by_name;
  std::vector<Span> spans, host;
  for (const prof::KinetoEvent& e : result->events()) {
    const auto type = static_cast<libkineto::ActivityType>(e.activityType());
    if (type == libkineto::ActivityType::CPU_OP) {
      host.push_back({e.startNs(), e.endNs(), e.name()});
      continue;
    }
    if (type != libkineto::ActivityType::CONCURRENT_KERNEL &&
        type != libkineto::ActivityType::GPU_MEMCPY &&
        type != libkineto::ActivityType::GPU_MEMSET) {
      continue;
    }
    const double ms = static_cast<double>(e.durationNs()) / 1e6;
    KernelTotal& total = by_name[e.name()];
    total.name = e.name();
    total.count += 1;
    total.ms += ms;
    out.kernel_ms += ms;
    out.launches += 1;
    out.category_ms[KernelCategory(e.name())] += ms;
    spans.push_back({e.startNs(), e.endNs(), e.name()});
  }
  if (out.launches == 0) {
    return absl::FailedPreconditionError(
        "kineto profiler: no device activity recorded (no CUDA work, or CUPTI unavailable)");
  }
  std::sort(spans.begin(), spans.end());
  uint64_t busy = 0, begin = spans.front().begin, end = spans.front().end;
  std::string last = spans.front().name;  // the activity that ends last so far
  for (const Span& sp : spans) {
    if (sp.begin > end) {
      busy += end - begin;
      DeviceGap gap;
      gap.ms = static_cast<double>(sp.begin - end) / 1e6;
      gap.before = last;
      gap.after = sp.name;
      gap.host_ops = HostOpsWithin(host, end, sp.begin);
      out.gaps.push_back(std::move(gap));
      begin = sp.begin;
      end = sp.end;
      last = sp.name;
    } else if (sp.end > end) {
      end = sp.end;
      last = sp.name;
    }
  }
  busy += end - begin;
  // The host's time before the first and after the last device activity.
  if (!host.empty()) {
    uint64_t first_host = host.front().begin, last_host = host.front().end;
    for (const Span& h : host) {
      first_host = std::min(first_host, h.begin);
      last_host = std::max(last_host, h.end);
    }
    if (first_host < spans.front().begin) {
      out.gaps.push_back({static_cast<double>(spans.front().begin - first_host) / 1e6,
                          "(the work's first host op)", spans.front().name,
                          HostOpsWithin(host, first_host, spans.front().begin)});
    }
    if (last_host > end) {
      out.gaps.push_back({static_cast<double>(last_host - end) / 1e6, last,
                          "(the work's last host op)", HostOpsWithin(host, end, last_host)});
    }
  }
  std::sort(out.gaps.begin(), out.gaps.end(),
            [](const DeviceGap& a, const DeviceGap& b) { return a.ms > b.ms; });
  if (out.gaps.size() > 12) out.gaps.resize(12);
  out.busy_ms = static_cast<double>(busy) / 1e6;
  for (auto& [name, total] : by_name) out.kernels.push_back(std::move(total));
  std::sort(out.kernels.begin(), out.kernels.end(),
            [](const KernelTotal& a, const KernelTotal& b) { return a.ms > b.ms; });
  return out;
}

}  // namespace dflash::device
