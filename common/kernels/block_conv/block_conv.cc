// The LibTorch side of the fused block convolution: checks, the kernels' launches and autograd.
#include "common/kernels/block_conv/block_conv.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/sum.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include "common/kernels/block_conv/params.h"
#include "common/kernels/env_switch.h"
#include "common/kernels/launch_check.h"

namespace dflash::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kTileRows = 64;

bool Enabled() {
  static const bool enabled = EnvSwitchOn("DFLASH_FUSED_BLOCK_CONV");
  return enabled;
}

bool Shapes(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& base,
            int64_t block_size, int64_t group_size) {
  if (!x.defined() || !delta.defined() || !base.defined()) return false;
  const auto dt = x.scalar_type();
  if (!x.is_cuda() || delta.device() != x.device() || base.device() != x.device()) return false;
  if (!(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf)) return false;
  const auto bt = base.scalar_type();
  if (delta.scalar_type() != dt || (bt != at::kFloat && bt != dt)) return false;
  if (x.dim() != 2 || delta.dim() != 3 || base.dim() != 2) return false;
  const int64_t rows = x.size(0), h = x.size(1), k = base.size(0);
  if (block_size < 1 || group_size < 1 || h % group_size != 0 || rows % block_size != 0) {
    return false;
  }
  return k >= 1 && k <= block_size && base.size(1) == h && delta.size(0) == rows &&
         delta.size(1) == k && delta.size(2) == h / group_size;
}

BlockConvDType DTypeOf(c10::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
      return BlockConvDType::kBFloat16;
    case at::kHalf:
      return BlockConvDType::kFloat16;
    default:
      return BlockConvDType::kFloat32;
  }
}

BlockConvParams ParamsFor(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& base,
                          int64_t block_size, int64_t group_size) {
  BlockConvParams p;
  p.x = x.data_ptr();
  p.delta = delta.data_ptr();
  p.base = base.data_ptr<float>();
  p.rows = x.size(0);
  p.h = x.size(1);
  p.kernel = base.size(0);
  p.block = block_size;
  p.group = group_size;
  p.tile_rows = kTileRows;
  p.dtype = DTypeOf(x.scalar_type());
  return p;
}

cudaStream_t StreamOf(const at::Tensor& t) {
  return at::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

struct BlockConvFunction : public torch::autograd::Function<BlockConvFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& delta,
                            const at::Tensor& base, int64_t block_size, int64_t group_size) {
    // base in fp32 for the kernels (a no-op for the fp32 master weights training passes).
    const at::Tensor xc = x.contiguous(), dc = delta.contiguous();
    const at::Tensor bc = base.to(at::kFloat).contiguous();
    at::Tensor out = at::empty_like(xc, at::MemoryFormat::Contiguous);
    BlockConvParams p = ParamsFor(xc, dc, bc, block_size, group_size);
    p.out = out.data_ptr();
    CheckLaunch(LaunchBlockConvForward(p, StreamOf(xc)), "fused block convolution: forward");
    ctx->save_for_backward({xc, dc, bc});
    ctx->saved_data["block"] = block_size;
    ctx->saved_data["group"] = group_size;
    ctx->saved_data["base_dtype"] = static_cast<int64_t>(base.scalar_type());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &delta = saved[1], &base = saved[2];
    const int64_t block_size = ctx->saved_data["block"].toInt();
    const int64_t group_size = ctx->saved_data["group"].toInt();
    if (!grad_outputs[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), {}, {}};
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor dy = grad_outputs[0].to(x.scalar_type()).contiguous();
    at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
    at::Tensor ddelta = at::empty_like(delta, at::MemoryFormat::Contiguous);
    const int64_t tiles = (x.size(0) + kTileRows - 1) / kTileRows;
    at::Tensor partial = at::empty({tiles, base.size(0), base.size(1)}, base.options());
    BlockConvParams p = ParamsFor(x, delta, base, block_size, group_size);
    p.dy = dy.data_ptr();
    p.dx = dx.data_ptr();
    p.ddelta = ddelta.data_ptr();
    p.dbase_partial = partial.data_ptr<float>();
    CheckLaunch(LaunchBlockConvBackward(p, StreamOf(x)), "fused block convolution: backward");
    const auto base_dtype = static_cast<c10::ScalarType>(ctx->saved_data["base_dtype"].toInt());
    return {dx, ddelta, partial.sum(0).to(base_dtype), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool FusedBlockConvEnabled() { return Enabled(); }

bool SupportsFusedBlockConv(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& base,
                            int64_t block_size, int64_t group_size) {
  return Enabled() && Shapes(x, delta, base, block_size, group_size);
}

at::Tensor FusedBlockConvolution(const at::Tensor& x, const at::Tensor& delta,
                                 const at::Tensor& base, int64_t block_size, int64_t group_size) {
  TORCH_CHECK(Shapes(x, delta, base, block_size, group_size),
              "fused block convolution: need x [rows, H] and delta [rows, K, H / group] CUDA "
              "tensors of one dtype (fp32, bf16, fp16), base [K, H] in fp32 or that dtype on the "
              "same device, rows "
              "a multiple of the block size ",
              block_size, ", H a multiple of the group size ", group_size,
              ", K <= the block size; got x ", x.sizes(), " ", x.scalar_type(), ", delta ",
              delta.sizes(), " ", delta.scalar_type(), ", base ", base.sizes(), " ",
              base.scalar_type());
  const c10::cuda::CUDAGuard guard(x.device());
  return BlockConvFunction::apply(x, delta, base, block_size, group_size);
}

}  // namespace dflash::kernels
