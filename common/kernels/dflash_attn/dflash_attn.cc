// The one file of the fused attention that sees LibTorch: builds the plan, validates tensors, fills
// the params of params.h and wires forward and backward into autograd.
#include "common/kernels/dflash_attn/dflash_attn.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/kernels/dflash_attn/params.h"
#include "common/kernels/dflash_attn/schedule.h"
#include "common/kernels/launch_check.h"

namespace dflash::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::vector<int64_t> HostInt64(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 1 && t.scalar_type() == at::kLong, "fused attention: ", name,
              " must be a 1-D int64 tensor");
  const at::Tensor h = t.to(at::kCPU).contiguous();
  const int64_t* p = h.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + h.numel());
}

template <typename Item>
at::Tensor ItemsTensor(const std::vector<Item>& items, c10::Device device) {
  static_assert(sizeof(Item) == 6 * sizeof(int32_t));
  at::Tensor host = at::empty({static_cast<int64_t>(items.size()), 6}, at::kInt);
  if (!items.empty())
    std::memcpy(host.data_ptr<int32_t>(), items.data(), items.size() * sizeof(Item));
  return host.to(device);
}

void CheckCuda(int err, const char* what) {
  TORCH_CHECK(err != -1, "fused attention: no kernel for this head_dim / head grouping (", what,
              ")");
  CheckLaunch(err, (std::string("fused attention: ") + what).c_str());
}

void CheckQkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.is_cuda() && k.device() == q.device() && v.device() == q.device(),
              "fused attention: q, k, v must be on one CUDA device");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 &&
                  v.scalar_type() == at::kBFloat16,
              "fused attention: q, k, v must be bf16");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && k.sizes() == v.sizes() && q.size(2) == k.size(2),
              "fused attention: q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes(),
              " must be [rows, heads, head_dim] with one head_dim");
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, "fused attention: ", q.size(1),
              " query heads are not a multiple of ", k.size(1), " kv heads");
}

// Runs the forward kernel over `items` (contiguous q, k, v); returns {o, lse}.
std::pair<at::Tensor, at::Tensor> RunForward(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, const at::Tensor& items,
                                             double scale, bool causal,
                                             const DflashAttnPlan* plan = nullptr) {
  at::Tensor o = at::empty_like(q);
  at::Tensor lse = at::empty({q.size(0), q.size(1)}, q.options().dtype(at::kFloat));
  DflashAttnFwdParams p;
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.o = o.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.items = reinterpret_cast<const AttnFwdItem*>(items.data_ptr<int32_t>());
  p.n_items = static_cast<int32_t>(items.size(0));
  p.q_rows = static_cast<int32_t>(q.size(0));
  p.kv_rows = static_cast<int32_t>(k.size(0));
  p.hq = static_cast<int32_t>(q.size(1));
  p.hkv = static_cast<int32_t>(k.size(1));
  p.head_dim = static_cast<int32_t>(q.size(2));
  p.scale_log2 = static_cast<float>(scale * M_LOG2E);
  p.causal = causal;
  if (plan != nullptr) {
    p.block_size = static_cast<int32_t>(plan->block_size);
    p.window = static_cast<int32_t>(plan->window);
    p.block_causal = plan->block_causal;
  }
  CheckCuda(LaunchDflashAttnFwd(p, at::cuda::getCurrentCUDAStream().stream()),
            causal ? "causal forward" : "forward");
  return {o, lse};
}

struct DflashAttnFunction : public torch::autograd::Function<DflashAttnFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, const DflashAttnPlan& plan, double scale) {
    const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
    auto [o, lse] = RunForward(q, k, v, plan.fwd_items, scale, /*causal=*/false, &plan);
    ctx->save_for_backward({q, k, v, o, lse, plan.bwd_items, plan.anchors});
    ctx->saved_data["block_size"] = plan.block_size;
    ctx->saved_data["window"] = plan.window;
    ctx->saved_data["block_causal"] = plan.block_causal;
    ctx->saved_data["scale"] = scale;
    return o;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &o = saved[3], &lse = saved[4];
    const at::Tensor &bwd_items = saved[5], &anchors = saved[6];
    const double scale = ctx->saved_data["scale"].toDouble();
    const at::Tensor dout = grad_outputs[0].to(at::kBFloat16).contiguous();
    at::Tensor dq = at::empty_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
    at::Tensor dq_accum = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    at::Tensor delta = at::empty_like(lse);
    DflashAttnBwdParams p;
    p.q = q.data_ptr();
    p.k = k.data_ptr();
    p.v = v.data_ptr();
    p.o = o.data_ptr();
    p.dout = dout.data_ptr();
    p.lse = lse.data_ptr<float>();
    p.delta = delta.data_ptr<float>();
    p.dq_accum = dq_accum.data_ptr<float>();
    p.dq = dq.data_ptr();
    p.dk = dk.data_ptr();
    p.dv = dv.data_ptr();
    p.anchors = anchors.data_ptr<int32_t>();
    p.items = reinterpret_cast<const AttnBwdItem*>(bwd_items.data_ptr<int32_t>());
    p.n_items = static_cast<int32_t>(bwd_items.size(0));
    p.block_size = static_cast<int32_t>(ctx->saved_data["block_size"].toInt());
    p.q_rows = static_cast<int32_t>(q.size(0));
    p.kv_rows = static_cast<int32_t>(k.size(0));
    p.hq = static_cast<int32_t>(q.size(1));
    p.hkv = static_cast<int32_t>(k.size(1));
    p.head_dim = static_cast<int32_t>(q.size(2));
    p.scale = static_cast<float>(scale);
    p.scale_log2 = static_cast<float>(scale * M_LOG2E);
    p.window = static_cast<int32_t>(ctx->saved_data["window"].toInt());
    p.block_causal = ctx->saved_data["block_causal"].toBool();
    CheckCuda(LaunchDflashAttnBwd(p, at::cuda::getCurrentCUDAStream().stream()), "backward");
    return {dq, dk, dv, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

DflashAttnPlan MakeDflashAttnPlan(const at::Tensor& anchors, const at::Tensor& ctx_begin,
                                  int64_t context_rows, int64_t block_size, int64_t group,
                                  c10::Device device, int64_t window, bool block_causal) {
  const std::vector<int64_t> a = HostInt64(anchors, "anchors");
  const std::vector<int64_t> c = HostInt64(ctx_begin, "ctx_begin");
  auto schedule = BuildDflashSchedule(a, c, context_rows, block_size, group, window);
  TORCH_CHECK(schedule.ok(), std::string(schedule.status().message()));
  DflashAttnPlan plan;
  plan.fwd_items = ItemsTensor(schedule->fwd, device);
  plan.bwd_items = ItemsTensor(schedule->bwd, device);
  plan.anchors = anchors.to(device, at::kInt);
  plan.context_rows = context_rows;
  plan.block_size = block_size;
  plan.group = group;
  plan.window = window;
  plan.block_causal = block_causal;
  return plan;
}

bool FusedDflashAttentionQualifies(c10::Device device, c10::ScalarType dtype, int64_t head_dim,
                                   int64_t group) {
  if (!device.is_cuda() || dtype != at::kBFloat16) return false;
  if (head_dim == 256) {
    const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device.index());
    if (prop->major != 9 || prop->minor != 0) return false;
  } else if (head_dim != 64 && head_dim != 128) {
    return false;
  }
  return PositionsPerTile(group).ok();
}

bool SupportsFusedDflashAttention(const at::Tensor& q, const at::Tensor& k) {
  if (q.scalar_type() != k.scalar_type() || q.dim() != 3 || k.dim() != 3 || k.size(1) == 0 ||
      q.size(1) % k.size(1) != 0) {
    return false;
  }
  return FusedDflashAttentionQualifies(q.device(), q.scalar_type(), q.size(2),
                                       q.size(1) / k.size(1));
}

at::Tensor FusedDflashAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const DflashAttnPlan& plan, double scale) {
  CheckQkv(q, k, v);
  TORCH_CHECK(plan.fwd_items.defined() && plan.fwd_items.device() == q.device(),
              "fused attention: the plan is not on q's device");
  TORCH_CHECK(q.size(1) / k.size(1) == plan.group, "fused attention: plan built for ", plan.group,
              " query heads per kv head, q/k have ", q.size(1) / k.size(1));
  const int64_t n = plan.anchors.size(0);
  TORCH_CHECK(q.size(0) == n * plan.block_size, "fused attention: q has ", q.size(0),
              " rows, expected ", n, " blocks of ", plan.block_size);
  TORCH_CHECK(k.size(0) == plan.context_rows + n * plan.block_size, "fused attention: k has ",
              k.size(0), " rows, expected T + Q = ", plan.context_rows, " + ", n * plan.block_size);
  const c10::cuda::CUDAGuard guard(q.device());
  return DflashAttnFunction::apply(q, k, v, plan, scale);
}

at::Tensor FusedCausalVarlenAttention(const at::Tensor& q_in, const at::Tensor& k_in,
                                      const at::Tensor& v_in, const at::Tensor& cu_seqlens,
                                      double scale) {
  CheckQkv(q_in, k_in, v_in);
  TORCH_CHECK(q_in.size(0) == k_in.size(0), "fused causal attention: q has ", q_in.size(0),
              " rows and k ", k_in.size(0));
  const std::vector<int64_t> cu = HostInt64(cu_seqlens, "cu_seqlens");
  TORCH_CHECK(!cu.empty() && cu.back() == q_in.size(0),
              "fused causal attention: cu_seqlens must end at ", q_in.size(0));
  auto items = BuildCausalSchedule(cu, q_in.size(1) / k_in.size(1));
  TORCH_CHECK(items.ok(), std::string(items.status().message()));
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  return RunForward(q, k, v, ItemsTensor(*items, q.device()), scale, /*causal=*/true).first;
}

}  // namespace dflash::kernels
