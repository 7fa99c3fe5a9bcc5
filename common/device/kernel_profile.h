// Device time of the kernels a piece of work launches, by category: the benchmarks' --profile
// and the workers' --profile_steps (docs/operations.md).
//
// ProfileKernels runs `work` under LibTorch's Kineto profiler with the CUDA activity only and sums
// the duration of every kernel, memcpy and memset it recorded; `busy_ms` is the union of their
// intervals (kernels of several streams overlap), `wall_ms` the host time of `work` (which must
// end with a device synchronization). The categories come from the kernel's name (KernelCategory):
// scripts/bench/drafter_step_ref.py's --profile applies the same rules to the PyTorch reference.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dflash::device {

struct KernelTotal {
  std::string name;
  int64_t count = 0;
  double ms = 0;
};

// An interval with no kernel, memcpy or memset on the device, between the first and the last.
struct DeviceGap {
  double ms = 0;
  std::string before, after;          // the device activities around it
  std::vector<std::string> host_ops;  // the host's ATen ops overlapping it, most overlap first
};

struct KernelProfile {
  double wall_ms = 0;
  double busy_ms = 0;    // union of the device intervals
  double kernel_ms = 0;  // sum of the durations
  int64_t launches = 0;
  std::map<std::string, double> category_ms;
  std::vector<KernelTotal> kernels;  // by total time, longest first
  std::vector<DeviceGap> gaps;       // the longest idle intervals, longest first (at most 12)
};

// "gemm", "attention", "loss", "optimizer", "copy", "fp8 quantization" or "elementwise/other".
std::string KernelCategory(const std::string& name);

// `host_ops`: also records the host's ATen ops (the CPU activity), to name what the host was doing
// in each device gap.
// An error when the profiler could not start (then `work` has not run) or recorded nothing; an
// exception out of `work` passes through, the profiler stopped.
absl::StatusOr<KernelProfile> ProfileKernels(const std::function<void()>& work,
                                             bool host_ops = false);

// One JSON object: wall/busy/kernel ms, launches, the categories and the `top` longest kernels.
std::string ProfileJson(const KernelProfile& profile, int top);

// A table for stderr: a row per category, then the `top` longest kernels.
std::string ProfileTable(const std::string& title, const KernelProfile& profile, int top);

}  // namespace dflash::device
