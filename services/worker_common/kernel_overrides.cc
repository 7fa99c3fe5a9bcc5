#include "services/worker_common/kernel_overrides.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace dflash::worker {

std::string KernelOverrides() {
  std::string out;
  for (const char* name : kKernelOverrideVariables) {
    const char* value = std::getenv(name);
    if (value == nullptr) continue;
    absl::StrAppend(&out, out.empty() ? "" : " ", name, "=", value);
  }
  return out;
}

}  // namespace dflash::worker
