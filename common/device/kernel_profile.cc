#include "common/device/kernel_profile.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace dflash::device {
namespace {

bool Has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

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

}  // namespace dflash::device
