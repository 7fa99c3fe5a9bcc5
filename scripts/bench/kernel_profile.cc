#include "scripts/bench/kernel_profile.h"

#include <kineto/ActivityType.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace dflash::bench {
namespace {

bool Has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

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

std::string KernelCategory(const std::string& name) {
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (Has(s, "memcpy") || Has(s, "memset")) return "copy";
  // drafter.precision: fp8's operand quantization (common/kernels/fp8_quant: RowQuantKernel,
  // ColAmaxKernel / ColQuantKernel and their 16-byte ColAmaxVecKernel / ColQuantVecKernel).
  if (Has(s, "rowquant") || Has(s, "colquant") || Has(s, "colamax")) {
    return "fp8 quantization";
  }
  // Before attention: the fused cross-entropy's kernels live in namespace dflash::kernels, and
  // "dflash" holds "flash".
  if (Has(s, "fusedce") || Has(s, "cross_entropy") || Has(s, "log_softmax") ||
      Has(s, "logsumexp")) {
    return "loss";
  }
  // Before gemm: FlexAttention's Triton templates are "triton_tem_fused_...".
  if (Has(s, "attn") || Has(s, "flash_") || Has(s, "flashattn") || Has(s, "triton_tem")) {
    return "attention";
  }
  if (Has(s, "gemm") || Has(s, "nvjet") || Has(s, "cutlass") || Has(s, "xmma") ||
      Has(s, "cublas") || Has(s, "splitk")) {
    return "gemm";
  }
  if (Has(s, "adam") || Has(s, "multi_tensor") || Has(s, "foreach")) return "optimizer";
  return "elementwise/other";
}

absl::StatusOr<KernelProfile> ProfileKernels(const std::function<void()>& work, bool host_ops) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  using torch::profiler::impl::ProfilerConfig;
  using torch::profiler::impl::ProfilerState;
  KernelProfile out;
  std::unique_ptr<prof::ProfilerResult> result;
  try {
    const ProfilerConfig config(ProfilerState::KINETO);
    std::set<ActivityType> activities{ActivityType::CUDA};
    if (host_ops) activities.insert(ActivityType::CPU);
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
    const auto t0 = std::chrono::steady_clock::now();
    work();
    out.wall_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
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

std::string ProfileJson(const KernelProfile& profile, int top) {
  nlohmann::json j;
  j["wall_ms"] = profile.wall_ms;
  j["busy_ms"] = profile.busy_ms;
  j["kernel_ms"] = profile.kernel_ms;
  j["launches"] = profile.launches;
  j["category_ms"] = profile.category_ms;
  nlohmann::json kernels = nlohmann::json::array();
  for (size_t i = 0; i < profile.kernels.size() && static_cast<int>(i) < top; ++i) {
    const KernelTotal& k = profile.kernels[i];
    kernels.push_back({{"name", k.name.substr(0, 160)}, {"count", k.count}, {"ms", k.ms}});
  }
  j["top"] = kernels;
  nlohmann::json gaps = nlohmann::json::array();
  for (const DeviceGap& g : profile.gaps) {
    gaps.push_back({{"ms", g.ms},
                    {"before", g.before.substr(0, 100)},
                    {"after", g.after.substr(0, 100)},
                    {"host_ops", g.host_ops}});
  }
  j["gaps"] = gaps;
  return j.dump();
}

std::string ProfileTable(const std::string& title, const KernelProfile& profile, int top) {
  std::string out =
      absl::StrFormat("%s: wall %.2f ms, device busy %.2f ms, kernels %.2f ms in %d launches\n",
                      title, profile.wall_ms, profile.busy_ms, profile.kernel_ms, profile.launches);
  absl::StrAppend(&out, "| category | ms | share of kernel time |\n|---|---|---|\n");
  for (const auto& [category, ms] : profile.category_ms) {
    absl::StrAppendFormat(&out, "| %s | %.2f | %.1f%% |\n", category, ms,
                          100.0 * ms / profile.kernel_ms);
  }
  absl::StrAppend(&out, "| kernel | launches | ms |\n|---|---|---|\n");
  for (size_t i = 0; i < profile.kernels.size() && static_cast<int>(i) < top; ++i) {
    const KernelTotal& k = profile.kernels[i];
    absl::StrAppendFormat(&out, "| %s | %d | %.2f |\n", k.name.substr(0, 110), k.count, k.ms);
  }
  if (!profile.gaps.empty()) {
    absl::StrAppend(
        &out, "| device idle ms | after | before | host ops meanwhile |\n|---|---|---|---|\n");
    for (const DeviceGap& g : profile.gaps) {
      absl::StrAppendFormat(&out, "| %.3f | %s | %s | %s |\n", g.ms, g.before.substr(0, 60),
                            g.after.substr(0, 60), absl::StrJoin(g.host_ops, ", "));
    }
  }
  return out;
}

}  // namespace dflash::bench
