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
#include "nlohmann/json.hpp"

namespace dflash::bench {
namespace {

bool Has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

std::string KernelCategory(const std::string& name) {
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (Has(s, "memcpy") || Has(s, "memset")) return "copy";
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

absl::StatusOr<KernelProfile> ProfileKernels(const std::function<void()>& work) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  using torch::profiler::impl::ProfilerConfig;
  using torch::profiler::impl::ProfilerState;
  KernelProfile out;
  std::unique_ptr<prof::ProfilerResult> result;
  try {
    const ProfilerConfig config(ProfilerState::KINETO);
    const std::set<ActivityType> activities{ActivityType::CUDA};
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
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const prof::KinetoEvent& e : result->events()) {
    const auto type = static_cast<libkineto::ActivityType>(e.activityType());
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
    spans.emplace_back(e.startNs(), e.endNs());
  }
  if (out.launches == 0) {
    return absl::FailedPreconditionError(
        "kineto profiler: no device activity recorded (no CUDA work, or CUPTI unavailable)");
  }
  std::sort(spans.begin(), spans.end());
  uint64_t busy = 0, begin = spans.front().first, end = spans.front().second;
  for (const auto& [s, e] : spans) {
    if (s > end) {
      busy += end - begin;
      begin = s;
      end = e;
    } else {
      end = std::max(end, e);
    }
  }
  busy += end - begin;
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
  return out;
}

}  // namespace dflash::bench
