#include "common/device/device_probe.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

#ifdef DFLASH_HAVE_CUDA
#include "common/device/cuda_probe.h"
#endif

namespace dflash::device {
namespace {

absl::StatusOr<DeviceMemory> ProbeHost() {
  std::ifstream in("/proc/meminfo");
  if (!in) return absl::UnavailableError("cannot read /proc/meminfo");
  DeviceMemory m;
  m.kind = "cpu";
  m.name = "host";
  std::string key;
  uint64_t kb;
  std::string unit;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemTotal:") m.total_bytes = kb * 1024;
    if (key == "MemAvailable:") m.free_bytes = kb * 1024;
  }
  return m;
}

}  // namespace

int CudaDeviceCount() {
#ifdef DFLASH_HAVE_CUDA
  return dflash_cuda_device_count();
#else
  return 0;
#endif
}

absl::StatusOr<DeviceMemory> Probe(int gpu) {
  if (gpu < 0) return ProbeHost();
#ifdef DFLASH_HAVE_CUDA
  int count = dflash_cuda_device_count();
  if (gpu >= count) {
    return absl::NotFoundError(
        absl::StrCat("gpu ", gpu, " requested but this machine has ", count, " CUDA device(s)"));
  }
  DeviceMemory m;
  m.kind = "cuda";
  m.index = gpu;
  char name[256] = {0};
  char err[512] = {0};
  if (dflash_cuda_probe(gpu, name, sizeof(name), &m.total_bytes, &m.free_bytes,
                        &m.compute_capability, err, sizeof(err)) != 0) {
    return absl::UnavailableError(err);
  }
  m.name = name;
  return m;
#else
  return absl::FailedPreconditionError(absl::StrCat(
      "gpu ", gpu, " requested but dflash was built without CUDA (DFLASH_WITH_CUDA=OFF)"));
#endif
}

uint64_t HostRssBytes() {
  std::ifstream in("/proc/self/statm");
  uint64_t size_pages = 0, rss_pages = 0;
  if (!(in >> size_pages >> rss_pages)) return 0;
  return rss_pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace dflash::device
