#include <cuda_runtime.h>

#include "common/kernels/fused_ce/fused_ce_kernel.cuh"

namespace dflash::kernels {

int LaunchFusedCeRows(const FusedCeParams& p, void* stream) {
  if (p.rows == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.rows)), block(kCeThreads);
  auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case CeDType::kFloat32:
      FusedCeRowsKernel<float><<<grid, block, 0, s>>>(p);
      break;
    case CeDType::kBFloat16:
      FusedCeRowsKernel<__nv_bfloat16><<<grid, block, 0, s>>>(p);
      break;
    case CeDType::kFloat16:
      FusedCeRowsKernel<__half><<<grid, block, 0, s>>>(p);
      break;
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace dflash::kernels
