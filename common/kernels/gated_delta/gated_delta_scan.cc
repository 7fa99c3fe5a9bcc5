#include "common/kernels/gated_delta/gated_delta_scan.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include "common/kernels/gated_delta/params.h"
#include "common/kernels/launch_check.h"

namespace dflash::kernels {
namespace {

ScanDType DTypeOf(c10::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
      return ScanDType::kBFloat16;
    case at::kHalf:
      return ScanDType::kFloat16;
    default:
      return ScanDType::kFloat32;
  }
}

}  // namespace

bool SupportsGatedDeltaRule(int64_t dk, int64_t dv, int64_t chunk, int64_t documents,
                            c10::ScalarType dtype) {
  return (dk == 64 || dk == 128 || dk == 256) && dv > 0 && dv % kScanColumns == 0 &&
         chunk == kScanChunk && documents <= 65535 &&
         (dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf);
}

at::Tensor GatedDeltaRuleCuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& g, const at::Tensor& beta,
                              const GatedDeltaLayout& layout) {
  TORCH_CHECK(q.dim() == 3 && k.sizes() == q.sizes() && v.dim() == 3 && v.size(0) == q.size(0) &&
                  v.size(1) == q.size(1),
              "gated delta rule: q, k must be [T, Hv, DK] and v [T, Hv, DV]; got ", q.sizes(), ", ",
              k.sizes(), ", ", v.sizes());
  const int64_t t = q.size(0), hv = q.size(1), dk = q.size(2), dv = v.size(2);
  const int64_t chunks = static_cast<int64_t>(layout.rows.size()) / kScanChunk;
  TORCH_CHECK(SupportsGatedDeltaRule(dk, dv, kScanChunk, layout.documents, v.scalar_type()),
              "gated delta rule: unsupported dk ", dk, ", dv ", dv, ", ", layout.documents,
              " documents or dtype ", v.scalar_type());
  for (const at::Tensor* x : {&q, &k, &v, &beta}) {
    TORCH_CHECK(x->is_cuda() && x->device() == q.device() && x->scalar_type() == v.scalar_type(),
                "gated delta rule: q, k, v and beta must share v's dtype and device");
  }
  TORCH_CHECK(g.is_cuda() && g.device() == q.device() && g.scalar_type() == at::kFloat &&
                  g.dim() == 2 && g.size(0) == t && g.size(1) == hv && beta.sizes() == g.sizes(),
              "gated delta rule: g must be [T, Hv] fp32 and beta [T, Hv]");
  TORCH_CHECK(layout.rows.size() == static_cast<size_t>(chunks * kScanChunk) &&
                  layout.offsets.size() == layout.active.size(),
              "gated delta rule: inconsistent layout");
  std::vector<int32_t> steps;
  for (size_t j = 0; j < layout.offsets.size(); ++j) {
    TORCH_CHECK(
        layout.active[j] <= layout.documents && layout.offsets[j] + layout.active[j] <= chunks,
        "gated delta rule: step ", j, " runs past the chunks");
    steps.push_back(static_cast<int32_t>(layout.offsets[j]));
    steps.push_back(static_cast<int32_t>(layout.active[j]));
  }
  for (int32_t r : layout.rows) TORCH_CHECK(r < t, "gated delta rule: row ", r, " is past T ", t);
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor out = at::empty({t, hv, dv}, v.options());
  if (t == 0 || chunks == 0) return out;
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  const at::Tensor bc = beta.contiguous(), gc = g.contiguous();
  const at::Tensor rows = at::tensor(layout.rows, at::kInt).to(q.device());
  const at::Tensor steps_dev = at::tensor(steps, at::kInt).to(q.device());
  const at::TensorOptions f32 = q.options().dtype(at::kFloat);
  const at::Tensor w = at::empty({chunks, hv, kScanChunk, dk}, f32);
  const at::Tensor u = at::empty({chunks, hv, kScanChunk, dv}, f32);
  const at::Tensor q_out = at::empty({chunks, hv, kScanChunk, dk}, f32);
  const at::Tensor a = at::empty({chunks, hv, kScanChunk, kScanChunk}, f32);
  const at::Tensor k_out = at::empty({chunks, hv, kScanChunk, dk}, f32);
  const at::Tensor decay = at::empty({chunks, hv}, f32);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();

  GatedDeltaChunkParams cp;
  cp.q = qc.data_ptr();
  cp.k = kc.data_ptr();
  cp.v = vc.data_ptr();
  cp.beta = bc.data_ptr();
  cp.g = gc.data_ptr<float>();
  cp.rows = rows.data_ptr<int32_t>();
  cp.w = w.data_ptr<float>();
  cp.u = u.data_ptr<float>();
  cp.q_out = q_out.data_ptr<float>();
  cp.a = a.data_ptr<float>();
  cp.k_out = k_out.data_ptr<float>();
  cp.decay = decay.data_ptr<float>();
  cp.dtype = DTypeOf(v.scalar_type());
  cp.chunks = chunks;
  cp.heads = hv;
  cp.dk = dk;
  cp.dv = dv;
  CheckLaunch(LaunchGatedDeltaChunk(cp, stream),
              "gated delta rule: intra-chunk kernel launch failed");

  GatedDeltaScanParams sp;
  sp.w = cp.w;
  sp.u = cp.u;
  sp.q = cp.q_out;
  sp.a = cp.a;
  sp.k = cp.k_out;
  sp.decay = cp.decay;
  sp.steps = steps_dev.data_ptr<int32_t>();
  sp.rows = cp.rows;
  sp.out = out.data_ptr();
  sp.dtype = cp.dtype;
  sp.num_steps = static_cast<int64_t>(layout.offsets.size());
  sp.documents = layout.documents;
  sp.heads = hv;
  sp.dk = dk;
  sp.dv = dv;
  CheckLaunch(LaunchGatedDeltaScan(sp, stream), "gated delta rule: recurrence launch failed");
  return out;
}

}  // namespace dflash::kernels
