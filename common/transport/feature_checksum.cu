// The device side of feature_checksum.h: one grid-stride pass over the buffer, 16-byte loads when
// it is 16-byte aligned, per-thread sums reduced over the warp and the block, one atomic add per
// block into the two 64-bit accumulators (mod 2^64, as the host reference).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dflash::transport {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;

using u64 = unsigned long long;

// Word `k` (0-based) read one byte at a time, zero past `bytes`.
__device__ uint32_t WordAt(const uint8_t* data, size_t bytes, size_t k) {
  uint32_t w = 0;
  for (int b = 0; b < 4; ++b) {
    const size_t at = k * 4 + b;
    if (at < bytes) w |= static_cast<uint32_t>(data[at]) << (8 * b);
  }
  return w;
}

__global__ void __launch_bounds__(kThreads)
    FeatureChecksumKernel(const uint8_t* __restrict__ data, size_t bytes, u64* acc) {
  u64 sum = 0, weighted = 0;
  const size_t full_words = bytes / 4;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const auto address = reinterpret_cast<uintptr_t>(data);
  size_t scalar_from = 0;  // words before this one are covered by the vector loop
  if ((address & 15) == 0) {
    const size_t vecs = full_words / 4;
    const uint4* v = reinterpret_cast<const uint4*>(data);
    for (size_t k = tid; k < vecs; k += stride) {
      const uint4 q = __ldg(v + k);
      const u64 i = 4 * static_cast<u64>(k) + 1;
      sum += static_cast<u64>(q.x) + q.y + q.z + q.w;
      weighted += i * q.x + (i + 1) * q.y + (i + 2) * q.z + (i + 3) * q.w;
    }
    scalar_from = vecs * 4;
  }
  const bool word_aligned = (address & 3) == 0;
  for (size_t k = scalar_from + tid; k < full_words; k += stride) {
    const uint32_t w =
        word_aligned ? __ldg(reinterpret_cast<const uint32_t*>(data) + k) : WordAt(data, bytes, k);
    sum += w;
    weighted += (static_cast<u64>(k) + 1) * w;
  }
  if (tid == 0 && bytes % 4 != 0) {  // the last, partial word
    const uint32_t w = WordAt(data, bytes, full_words);
    sum += w;
    weighted += (static_cast<u64>(full_words) + 1) * w;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    sum += __shfl_down_sync(0xffffffffu, sum, offset);
    weighted += __shfl_down_sync(0xffffffffu, weighted, offset);
  }
  __shared__ u64 warp_sum[kThreads / 32], warp_weighted[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    warp_sum[warp] = sum;
    warp_weighted[warp] = weighted;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    u64 s = 0, w = 0;
    for (int i = 0; i < kThreads / 32; ++i) {
      s += warp_sum[i];
      w += warp_weighted[i];
    }
    atomicAdd(acc, s);
    atomicAdd(acc + 1, w);
  }
}

}  // namespace

cudaError_t LaunchFeatureChecksum(const void* data, size_t bytes, u64* accumulator, u64* result) {
  cudaError_t e = cudaMemsetAsync(accumulator, 0, 2 * sizeof(u64), nullptr);
  if (e != cudaSuccess) return e;
  if (bytes > 0) {
    const size_t vecs = (bytes / 16) > 0 ? bytes / 16 : 1;
    const size_t want = (vecs + kThreads - 1) / kThreads;
    const unsigned blocks = want < kMaxBlocks ? static_cast<unsigned>(want) : kMaxBlocks;
    FeatureChecksumKernel<<<blocks, kThreads, 0, nullptr>>>(static_cast<const uint8_t*>(data),
                                                            bytes, accumulator);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaMemcpyAsync(result, accumulator, 2 * sizeof(u64), cudaMemcpyDeviceToHost, nullptr);
}

}  // namespace dflash::transport
