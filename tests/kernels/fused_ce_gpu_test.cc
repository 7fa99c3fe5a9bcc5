// The fused lm_head + weighted cross-entropy on CUDA (common/kernels/fused_ce) against the chunked
// reference (common/drafter/weighted_ce.h) computed in fp32 on the CPU from the same inputs: the
// numerator, per-row correctness, dHidden and the optional dLmHead. Fresh random inputs every run
// (the seed is printed), gradients poisoned with NaN before backward. Labelled gpu; skipped without
// a CUDA device.
#include <ATen/TensorOperators.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>

#include "common/device/device_probe.h"
#include "common/drafter/weighted_ce.h"
#include "common/kernels/fused_ce/fused_ce.h"
#include "tests/common/max_rel_error.h"

namespace dflash::kernels {
namespace {

using dflash::testing::MaxRelError;

struct Case {
  int64_t rows, hidden, vocab, chunk;
  c10::ScalarType dtype;
  double tol;
  bool lm_head_grad;
};

void RunCase(const Case& c) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " rows " << c.rows << " V " << c.vocab
                                    << " chunk " << c.chunk << " " << c.dtype);
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const at::Tensor h = at::randn({c.rows, c.hidden}, gen, at::kFloat);
  const at::Tensor w_head = at::randn({c.vocab, c.hidden}, gen, at::kFloat) * 0.3;
  at::Tensor labels = at::randint(0, c.vocab, {c.rows}, gen, at::kLong);
  labels[0] = 0;  // the first and the last vocabulary entries
  labels[c.rows - 1] = c.vocab - 1;
  at::Tensor weights = at::rand({c.rows}, gen, at::kFloat);
  weights[1] = 0.0;  // a row without weight: zero gradient, still a `correct` value

  // Reference: fp32 on the CPU from the inputs rounded to the case's dtype.
  const at::Tensor h_ref = h.to(c.dtype).to(at::kFloat).detach().clone().requires_grad_(true);
  const at::Tensor w_ref = w_head.to(c.dtype).to(at::kFloat).detach().clone();
  const int64_t top_k = std::min<int64_t>(16, c.vocab);
  auto ref = drafter::ChunkedWeightedCrossEntropy(h_ref, w_ref, labels, weights, 7, top_k);
  at::Tensor dw_ref;
  if (c.lm_head_grad) {
    // The reference keeps lm_head frozen; its gradient is dlogits^T @ h, computed directly.
    const at::Tensor logits = at::matmul(h_ref.detach(), w_ref.detach().t());
    at::Tensor p = at::softmax(logits, 1);
    p.scatter_add_(1, labels.unsqueeze(1), at::full({c.rows, 1}, -1.0));
    dw_ref = at::matmul((p * weights.unsqueeze(1)).t(), h_ref.detach());
  }
  ref.numerator.backward();

  const c10::Device cuda(c10::kCUDA, 0);
  const at::Tensor h_gpu = h.to(cuda, c.dtype).detach().requires_grad_(true);
  const at::Tensor w_gpu = w_head.to(cuda, c.dtype).detach().requires_grad_(c.lm_head_grad);
  const at::Tensor labels_gpu = labels.to(cuda), weights_gpu = weights.to(cuda);
  // Poison: fill a large block with NaN and free it, so that the caching allocator hands the same
  // memory to the op's outputs and gradients; anything the op fails to write stays NaN.
  { at::full({64 << 20}, std::nan(""), at::TensorOptions().device(cuda)); }
  auto got = FusedWeightedCrossEntropy(h_gpu, w_gpu, labels_gpu, weights_gpu, c.chunk,
                                       c.lm_head_grad, top_k);
  got.numerator.backward();
  ASSERT_TRUE(h_gpu.grad().defined());
  EXPECT_FALSE(at::isnan(h_gpu.grad()).any().item<bool>());
  EXPECT_LT(MaxRelError(got.numerator, ref.numerator), c.tol);
  EXPECT_LT(MaxRelError(h_gpu.grad(), h_ref.grad()), c.tol);
  EXPECT_EQ(h_gpu.grad()[1].abs().max().item<float>(), 0.f) << "weight-0 row";
  // Argmax can differ only where two logits tie within the dtype's rounding; count mismatches.
  const int64_t mismatched = got.correct.cpu().ne(ref.correct).sum().item<int64_t>();
  EXPECT_LE(mismatched, c.dtype == at::kFloat ? 0 : c.rows / 50);
  if (c.lm_head_grad) {
    ASSERT_TRUE(w_gpu.grad().defined());
    EXPECT_LT(MaxRelError(w_gpu.grad(), dw_ref), c.tol);
  }
  // The top-k read from the chunk before the row kernel overwrote it (DFlash2's candidates):
  // indices whose reference logits are at least the reference's k-th largest, less the dtype's
  // rounding (the two sides round the logits differently, so near-ties may swap), largest first.
  ASSERT_TRUE(got.top_k.defined());
  const at::Tensor top = got.top_k.cpu();
  ASSERT_EQ(top.sizes(), ref.top_k.sizes());
  const at::Tensor logits = at::matmul(h_ref.detach(), w_ref.t());
  const at::Tensor kth = logits.gather(1, ref.top_k).select(1, top_k - 1);
  const double eps =
      c.dtype == at::kBFloat16 ? 1.0 / 128 : (c.dtype == at::kHalf ? 1.0 / 1024 : 1e-5);
  const at::Tensor slack = logits.abs().amax(1) * (2 * eps);
  const at::Tensor got_logits = logits.gather(1, top);
  EXPECT_TRUE(got_logits.ge((kth - slack).unsqueeze(1)).all().item<bool>());
  const at::Tensor steps = got_logits.narrow(1, 1, top_k - 1) - got_logits.narrow(1, 0, top_k - 1);
  EXPECT_TRUE(steps.le(slack.unsqueeze(1)).all().item<bool>());
  // D-PACE's pass at weight 1 (FusedCrossEntropyRows): each row's CE and d CE / d hidden against
  // the CPU's rows pass on the same rounded inputs.
  {
    const auto cpu_rows = drafter::CrossEntropyRowsWithGrad(h_ref.detach(), w_ref, labels, 7);
    const FusedCeRows rows_gpu =
        FusedCrossEntropyRows(h_gpu.detach(), w_gpu.detach(), labels_gpu, c.chunk, top_k);
    EXPECT_FALSE(at::isnan(rows_gpu.grad).any().item<bool>());
    EXPECT_LT(MaxRelError(rows_gpu.ce.cpu(), cpu_rows.ce), c.tol);
    EXPECT_LT(MaxRelError(rows_gpu.grad.to(at::kFloat).cpu(), cpu_rows.grad), c.tol);
    EXPECT_TRUE(at::equal(rows_gpu.top_k, got.top_k)) << "the same pass, the same top-k";
    EXPECT_TRUE(at::equal(rows_gpu.correct, got.correct));
  }
  // In fp32, most rows have exactly the reference's candidates in its order (in bf16 the k-th and
  // the next logit are often within one rounding at a 151,936-token vocabulary).
  if (c.dtype == at::kFloat) {
    EXPECT_GE(top.eq(ref.top_k).all(1).sum().item<int64_t>(), c.rows * 3 / 4);
  }
}

class FusedCeGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

TEST_F(FusedCeGpu, Fp32MatchesTheReference) {
  RunCase({37, 64, 1007, 8, at::kFloat, 1e-4, false});  // ragged chunk, odd vocabulary
  RunCase({64, 128, 4096, 64, at::kFloat, 1e-4, true});
}

TEST_F(FusedCeGpu, Bf16MatchesTheReference) {
  RunCase({100, 256, 151936, 48, at::kBFloat16, 2e-2, false});  // Qwen's vocabulary
  RunCase({33, 64, 1000 + 7, 16, at::kBFloat16, 2e-2, true});
}

TEST_F(FusedCeGpu, Fp16MatchesTheReference) {
  RunCase({50, 128, 5003, 20, at::kHalf, 1e-2, false});
}

TEST_F(FusedCeGpu, RefusesMisuse) {
  const c10::Device cuda(c10::kCUDA, 0);
  const at::Tensor h = at::zeros({4, 8}, at::TensorOptions().device(cuda));
  const at::Tensor w = at::zeros({10, 8}, at::TensorOptions().device(cuda));
  const at::Tensor labels = at::zeros({4}, at::TensorOptions().device(cuda).dtype(at::kLong));
  const at::Tensor weights = at::zeros({4}, at::TensorOptions().device(cuda));
  EXPECT_THROW(FusedWeightedCrossEntropy(h.cpu(), w, labels, weights, 2), c10::Error);
  EXPECT_THROW(FusedWeightedCrossEntropy(h, w.narrow(1, 0, 4), labels, weights, 2), c10::Error);
  EXPECT_THROW(FusedWeightedCrossEntropy(h, w, labels.to(at::kInt), weights, 2), c10::Error);
  EXPECT_THROW(FusedWeightedCrossEntropy(h, w, labels, weights, 0), c10::Error);
  EXPECT_THROW(FusedWeightedCrossEntropy(h, w, labels, weights, 2, false, /*top_k=*/11),
               c10::Error);
  EXPECT_THROW(FusedWeightedCrossEntropy(h, w, labels, weights, 2, /*lm_head_grad=*/true),
               c10::Error);
}

}  // namespace
}  // namespace dflash::kernels
