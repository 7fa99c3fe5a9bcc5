#include "common/kernels/gated_delta/gated_delta_scan.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include "common/kernels/gated_delta/params.h"

namespace dflash::kernels {

bool SupportsGatedDeltaScan(int64_t dk, int64_t dv, int64_t chunk, int64_t documents) {
  return (dk == 64 || dk == 128 || dk == 256) && dv > 0 && dv % kScanColumns == 0 &&
         chunk == kScanChunk && documents <= 65535;
}

GatedDeltaChunkOutputs GatedDeltaChunk(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const at::Tensor& beta,
                                       const at::Tensor& g) {
  TORCH_CHECK(q.dim() == 4 && q.size(2) == kScanChunk, "gated delta chunk: q must be [N, Hv, ",
              kScanChunk, ", DK], got ", q.sizes());
  const int64_t n = q.size(0), hv = q.size(1), dk = q.size(3), dv = v.size(-1);
  TORCH_CHECK(SupportsGatedDeltaScan(dk, dv, kScanChunk, 0), "gated delta chunk: unsupported dk ",
              dk, " or dv ", dv);
  for (const at::Tensor* t : {&q, &k, &v, &beta, &g}) {
    TORCH_CHECK(t->is_cuda() && t->device() == q.device() && t->scalar_type() == at::kFloat &&
                    t->is_contiguous(),
                "gated delta chunk: every input must be contiguous fp32 on ", q.device());
  }
  TORCH_CHECK(k.sizes() == q.sizes() && v.sizes() == at::IntArrayRef({n, hv, kScanChunk, dv}) &&
                  beta.sizes() == at::IntArrayRef({n, hv, kScanChunk}) && g.sizes() == beta.sizes(),
              "gated delta chunk: inconsistent shapes");
  const c10::cuda::CUDAGuard guard(q.device());
  GatedDeltaChunkOutputs o;
  o.w = at::empty_like(q);
  o.u = at::empty_like(v);
  o.q = at::empty_like(q);
  o.a = at::empty({n, hv, kScanChunk, kScanChunk}, q.options());
  o.k = at::empty_like(q);
  o.decay = at::empty({n, hv}, q.options());
  GatedDeltaChunkParams p;
  p.q = q.data_ptr<float>();
  p.k = k.data_ptr<float>();
  p.v = v.data_ptr<float>();
  p.beta = beta.data_ptr<float>();
  p.g = g.data_ptr<float>();
  p.w = o.w.data_ptr<float>();
  p.u = o.u.data_ptr<float>();
  p.q_out = o.q.data_ptr<float>();
  p.a = o.a.data_ptr<float>();
  p.k_out = o.k.data_ptr<float>();
  p.decay = o.decay.data_ptr<float>();
  p.chunks = n;
  p.heads = hv;
  p.dk = dk;
  p.dv = dv;
  const int err = LaunchGatedDeltaChunk(p, at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "gated delta chunk: launch failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(err)));
  return o;
}

at::Tensor GatedDeltaScan(const at::Tensor& w, const at::Tensor& u, const at::Tensor& q,
                          const at::Tensor& a, const at::Tensor& k, const at::Tensor& decay,
                          const std::vector<int64_t>& offsets, const std::vector<int64_t>& active,
                          int64_t documents) {
  TORCH_CHECK(w.dim() == 4 && w.size(2) == kScanChunk, "gated delta scan: w must be [N, Hv, ",
              kScanChunk, ", DK], got ", w.sizes());
  const int64_t n = w.size(0), hv = w.size(1), dk = w.size(3), dv = u.size(-1);
  TORCH_CHECK(SupportsGatedDeltaScan(dk, dv, kScanChunk, documents),
              "gated delta scan: unsupported dk ", dk, ", dv ", dv, " or ", documents,
              " documents");
  for (const at::Tensor* t : {&w, &u, &q, &a, &k, &decay}) {
    TORCH_CHECK(t->is_cuda() && t->device() == w.device() && t->scalar_type() == at::kFloat,
                "gated delta scan: every input must be fp32 on ", w.device());
  }
  TORCH_CHECK(q.sizes() == w.sizes() && k.sizes() == w.sizes(),
              "gated delta scan: q and k must be shaped as w ", w.sizes());
  TORCH_CHECK(u.sizes() == at::IntArrayRef({n, hv, kScanChunk, dv}), "gated delta scan: u ",
              u.sizes());
  TORCH_CHECK(a.sizes() == at::IntArrayRef({n, hv, kScanChunk, kScanChunk}), "gated delta scan: a ",
              a.sizes());
  TORCH_CHECK(decay.numel() == n * hv, "gated delta scan: decay must hold N * Hv values");
  TORCH_CHECK(offsets.size() == active.size(), "gated delta scan: offsets and active differ");
  std::vector<int32_t> steps;
  for (size_t j = 0; j < offsets.size(); ++j) {
    TORCH_CHECK(active[j] <= documents && offsets[j] + active[j] <= n, "gated delta scan: step ", j,
                " runs past the chunks");
    steps.push_back(static_cast<int32_t>(offsets[j]));
    steps.push_back(static_cast<int32_t>(active[j]));
  }
  const c10::cuda::CUDAGuard guard(w.device());
  const at::Tensor steps_dev = at::tensor(steps, at::kInt).to(w.device());
  const at::Tensor wc = w.contiguous(), uc = u.contiguous(), qc = q.contiguous();
  const at::Tensor ac = a.contiguous(), kc = k.contiguous(), dc = decay.contiguous();
  at::Tensor out = at::empty({n, hv, kScanChunk, dv}, w.options());
  GatedDeltaScanParams p;
  p.w = wc.data_ptr<float>();
  p.u = uc.data_ptr<float>();
  p.q = qc.data_ptr<float>();
  p.a = ac.data_ptr<float>();
  p.k = kc.data_ptr<float>();
  p.decay = dc.data_ptr<float>();
  p.steps = steps_dev.data_ptr<int32_t>();
  p.out = out.data_ptr<float>();
  p.num_steps = static_cast<int64_t>(offsets.size());
  p.documents = documents;
  p.heads = hv;
  p.dk = dk;
  p.dv = dv;
  const int err = LaunchGatedDeltaScan(p, at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "gated delta scan: launch failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(err)));
  return out;
}

}  // namespace dflash::kernels
