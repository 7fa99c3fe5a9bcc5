// A test-only kernel exercising the wgmma helpers of common/kernels/dflash_attn/wgmma.cuh on one
// warpgroup, in the three operand forms the attention backward uses (wgmma_gpu_test.cc).
#pragma once

namespace dflash::kernels::testing {

// x, y: [64, 128] bf16 row-major; z: [64, 64] bf16 row-major; outputs fp32 row-major:
//   c1 [64, 64]  = x y^T  (shared-memory A and B, both K-major)
//   c2 [64, 128] = z y    (register A, shared-memory B read MN-major)
//   c3 [64, 128] = z^T x  (shared-memory A and B, both MN-major; 64 columns per product)
// Returns the CUDA error of the launch (0 on success); -1 on a device without sm_90a code.
int RunWgmmaCheck(const void* x, const void* y, const void* z, float* c1, float* c2, float* c3);

}  // namespace dflash::kernels::testing
