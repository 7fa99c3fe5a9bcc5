#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#include "common/device/cuda_probe.h"

extern "C" int dflash_cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

extern "C" int dflash_cuda_probe(int gpu, char* name, size_t name_len, uint64_t* total_bytes,
                                 uint64_t* free_bytes, int* compute_capability, char* err,
                                 size_t err_len) {
  auto fail = [&](cudaError_t e, const char* what) {
    std::snprintf(err, err_len, "%s(gpu %d): %s (%s:%d)", what, gpu, cudaGetErrorString(e),
                  __FILE__, __LINE__);
    cudaGetLastError();
    return static_cast<int>(e);
  };
  cudaDeviceProp prop;
  cudaError_t e = cudaGetDeviceProperties(&prop, gpu);
  if (e != cudaSuccess) return fail(e, "cudaGetDeviceProperties");
  std::snprintf(name, name_len, "%s", prop.name);
  *compute_capability = prop.major * 10 + prop.minor;
  e = cudaSetDevice(gpu);
  if (e != cudaSuccess) return fail(e, "cudaSetDevice");
  size_t free_b = 0, total_b = 0;
  e = cudaMemGetInfo(&free_b, &total_b);
  if (e != cudaSuccess) return fail(e, "cudaMemGetInfo");
  *free_bytes = free_b;
  *total_bytes = total_b;
  return 0;
}
