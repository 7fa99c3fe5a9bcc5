// Plain-C boundary to the CUDA runtime so nvcc never sees abseil or LibTorch headers.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {
// Number of visible CUDA devices; 0 when there is no driver or device.
int dflash_cuda_device_count();
// Fills name, total/free bytes and compute capability of `gpu`. Returns 0 on success, otherwise
// writes the CUDA error text into err.
int dflash_cuda_probe(int gpu, char* name, size_t name_len, uint64_t* total_bytes,
                      uint64_t* free_bytes, int* compute_capability, char* err, size_t err_len);
}
