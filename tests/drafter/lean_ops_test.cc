// The drafter's memory-lean ops against the plain autograd graph they replace: the same outputs
// and the same gradients for the input and for the fp32 master weights, in fp32 and with bf16
// compute (where the plain graph is linear(x, w.to(bf16))).
#include "common/drafter/lean_ops.h"

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/silu.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "common/drafter/fp8_linear.h"

namespace dflash::drafter {
namespace {

// max |a - b| / max(max |b|, tiny).
double RelDiff(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor a32 = a.to(at::kFloat), b32 = b.to(at::kFloat);
  const double scale = std::max(b32.abs().max().item<double>(), 1e-30);
  return (a32 - b32).abs().max().item<double>() / scale;
}

struct Case {
  c10::ScalarType dtype;
  double tolerance;  // relative, against the largest element
};

// Runs `f(inputs)` twice (lean and plain), back-propagates the same random cotangent and compares
// the outputs and every input's gradient.
void Compare(const std::string& label, const Case& c, const std::vector<at::Tensor>& inputs,
             const std::function<at::Tensor(const std::vector<at::Tensor>&)>& lean,
             const std::function<at::Tensor(const std::vector<at::Tensor>&)>& plain) {
  auto run = [&](const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f,
                 std::vector<at::Tensor>* grads) {
    std::vector<at::Tensor> leaves;
    for (const at::Tensor& x : inputs) leaves.push_back(x.detach().clone().requires_grad_(true));
    at::Tensor y = f(leaves);
    at::Tensor cot = at::randn(y.sizes(), at::TensorOptions().dtype(at::kFloat)).to(y.dtype());
    torch::autograd::backward({y}, {cot});
    for (const at::Tensor& l : leaves) grads->push_back(l.grad());
    return y.detach();
  };
  at::manual_seed(7);
  std::vector<at::Tensor> g_lean, g_plain;
  const at::Tensor y_lean = run(lean, &g_lean);
  at::manual_seed(7);
  const at::Tensor y_plain = run(plain, &g_plain);
  EXPECT_EQ(y_lean.scalar_type(), y_plain.scalar_type()) << label;
  EXPECT_LE(RelDiff(y_lean, y_plain), c.tolerance) << label << ": output";
  ASSERT_EQ(g_lean.size(), g_plain.size());
  for (size_t i = 0; i < g_lean.size(); ++i) {
    ASSERT_TRUE(g_lean[i].defined() && g_plain[i].defined()) << label << ": input " << i;
    EXPECT_EQ(g_lean[i].scalar_type(), inputs[i].scalar_type()) << label << ": input " << i;
    EXPECT_EQ(g_lean[i].sizes(), inputs[i].sizes()) << label << ": input " << i;
    const double diff = RelDiff(g_lean[i], g_plain[i]);
    std::printf("%s: gradient of input %zu, relative difference %.3g\n", label.c_str(), i, diff);
    EXPECT_LE(diff, c.tolerance) << label << ": gradient of input " << i;
  }
}

const std::vector<Case>& Cases() {
  // fp32: the same products in another association at most; bf16: one rounding of the output.
  static const std::vector<Case> cases = {{at::kFloat, 1e-5}, {at::kBFloat16, 1e-2}};
  return cases;
}

TEST(LeanOpsTest, CastLinearMatchesLinearOfTheCastWeight) {
  for (const Case& c : Cases()) {
    for (const std::vector<int64_t>& x_shape :
         {std::vector<int64_t>{37, 24}, std::vector<int64_t>{3, 5, 24}}) {
      const at::Tensor x = at::randn(x_shape).to(c.dtype);
      const at::Tensor w = at::randn({19, 24}) * 0.2;  // fp32 master
      Compare(
          std::string("CastLinear ") + c10::toString(c.dtype) + " x " +
              std::to_string(x_shape.size()) + "-d",
          c, {x, w},
          [&](const std::vector<at::Tensor>& in) { return CastLinear(in[0], in[1], c.dtype); },
          [&](const std::vector<at::Tensor>& in) { return at::linear(in[0], in[1].to(c.dtype)); });
    }
  }
}

// Both ways of keeping activations (the projections kept, or recomputed in the backward).
TEST(LeanOpsTest, SwiGluMlpMatchesThePlainGraph) {
  for (const bool recompute : {false, true}) {
    for (const Case& c : Cases()) {
      const at::Tensor h = at::randn({41, 16}).to(c.dtype);
      const at::Tensor gate = at::randn({48, 16}) * 0.3, up = at::randn({48, 16}) * 0.3;
      const at::Tensor down = at::randn({16, 48}) * 0.3;
      Compare(
          std::string("SwiGluMlp ") + (recompute ? "recomputing " : "") + c10::toString(c.dtype), c,
          {h, gate, up, down},
          [&](const std::vector<at::Tensor>& in) {
            return SwiGluMlp(in[0], in[1], in[2], in[3], c.dtype, recompute);
          },
          [&](const std::vector<at::Tensor>& in) {
            const at::Tensor& x = in[0];
            return at::linear(
                at::silu(at::linear(x, in[1].to(c.dtype))) * at::linear(x, in[2].to(c.dtype)),
                in[3].to(c.dtype));
          });
    }
  }
}

// With fp8 (docs/method.md §4.1): the lean MLP's six GEMMs are those of the same MLP written with
// Fp8Linear, so the outputs and gradients match that graph (bf16 rounding apart).
TEST(LeanOpsTest, SwiGluMlpInFp8MatchesTheFp8LinearGraph) {
  const Case c{at::kBFloat16, 1e-2};
  for (const bool recompute : {false, true}) {
    const at::Tensor h = at::randn({41, 16}).to(c.dtype);
    const at::Tensor gate = at::randn({48, 16}) * 0.3, up = at::randn({48, 16}) * 0.3;
    const at::Tensor down = at::randn({16, 48}) * 0.3;
    Compare(
        std::string("SwiGluMlp fp8 ") + (recompute ? "recomputing" : ""), c, {h, gate, up, down},
        [&](const std::vector<at::Tensor>& in) {
          return SwiGluMlp(in[0], in[1], in[2], in[3], c.dtype, recompute, /*fp8=*/true);
        },
        [&](const std::vector<at::Tensor>& in) {
          const at::Tensor& x = in[0];
          return Fp8Linear(at::silu(Fp8Linear(x, in[1], c.dtype)) * Fp8Linear(x, in[2], c.dtype),
                           in[3], c.dtype);
        });
  }
}

// Projections sharing their input in one node against one linear each (CastLinear's plain graph,
// or Fp8Linear): the same outputs and gradients, the input's summed by the GEMMs; an output that
// is not used gives its weight no gradient.
TEST(LeanOpsTest, SharedInputLinearMatchesOneLinearPerWeight) {
  for (const bool fp8 : {false, true}) {
    for (const Case& c : Cases()) {
      if (fp8 && c.dtype != at::kBFloat16) continue;  // fp8 needs a bf16 compute dtype
      for (const std::vector<int64_t>& x_shape :
           {std::vector<int64_t>{37, 32}, std::vector<int64_t>{3, 5, 32}}) {
        const at::Tensor x = at::randn(x_shape).to(c.dtype);
        const at::Tensor w0 = at::randn({48, 32}) * 0.2, w1 = at::randn({16, 32}) * 0.2,
                         w2 = at::randn({16, 32}) * 0.2;
        Compare(
            std::string("SharedInputLinear ") + (fp8 ? "fp8 " : "") + c10::toString(c.dtype) +
                " x " + std::to_string(x_shape.size()) + "-d",
            c, {x, w0, w1, w2},
            [&](const std::vector<at::Tensor>& in) {
              return at::cat(SharedInputLinear(in[0], {in[1], in[2], in[3]}, c.dtype, fp8), -1);
            },
            [&](const std::vector<at::Tensor>& in) {
              std::vector<at::Tensor> parts;
              for (size_t i = 1; i < 4; ++i) {
                parts.push_back(fp8 ? Fp8Linear(in[0], in[i], c.dtype)
                                    : at::linear(in[0], in[i].to(c.dtype)));
              }
              return at::cat(parts, -1);
            });
      }
    }
  }
  const at::Tensor x = at::randn({7, 32}).requires_grad_(true);
  const at::Tensor w0 = (at::randn({8, 32}) * 0.2).requires_grad_(true);
  const at::Tensor w1 = (at::randn({8, 32}) * 0.2).requires_grad_(true);
  const std::vector<at::Tensor> out = SharedInputLinear(x, {w0, w1}, at::kFloat, false);
  out[0].sum().backward();
  EXPECT_TRUE(w0.grad().defined());
  EXPECT_FALSE(w1.grad().defined()) << "an unused output's weight gets no gradient";
  EXPECT_TRUE(x.grad().defined());
}

// DFlash2's candidate logits gathered a chunk of rows at a time (the backward gathers them again)
// against the plain graph that gathers all rows at once: the same values and hidden gradient, for
// chunks that divide the rows and chunks that do not.
TEST(LeanOpsTest, GatheredRowLogitsMatchThePlainGather) {
  for (const Case& c : Cases()) {
    for (const int64_t chunk : {int64_t{1}, int64_t{4}, int64_t{64}}) {
      const at::Tensor hidden = at::randn({13, 16}).to(c.dtype);
      const at::Tensor table = (at::randn({40, 16}) * 0.3).to(c.dtype);
      const at::Tensor index = at::randint(0, 40, {13, 5}, at::kLong);
      Compare(
          std::string("GatheredRowLogits ") + c10::toString(c.dtype) + " chunk " +
              std::to_string(chunk),
          c, {hidden},
          [&](const std::vector<at::Tensor>& in) {
            return GatheredRowLogits(in[0], table, index, chunk);
          },
          [&](const std::vector<at::Tensor>& in) {
            const at::Tensor rows = table.index_select(0, index.reshape({-1})).view({13, 5, 16});
            return at::bmm(rows, in[0].unsqueeze(2)).squeeze(2).to(at::kFloat);
          });
    }
  }
}

// A checkpointed function of two inputs (one read twice) and a weight read by capture: the same
// output and gradients as running it plainly; the weight's gradient arrives once, through the
// node, into the same leaf.
TEST(LeanOpsTest, CheckpointMatchesThePlainFunction) {
  for (const Case& c : Cases()) {
    const at::Tensor a = at::randn({9, 8}).to(c.dtype), b = at::randn({9, 8}).to(c.dtype);
    const at::Tensor w = at::randn({8, 8}) * 0.3;
    at::Tensor leaf_w;  // the weight the function captures: set per run below
    auto f = [&](const std::vector<at::Tensor>& in) {
      const at::Tensor y = CastLinear(in[0] * in[1] + in[0], leaf_w, c.dtype);
      return at::silu(y) * in[1];
    };
    std::vector<at::Tensor> grads[2], outs[2];
    for (int run = 0; run < 2; ++run) {
      const at::Tensor x0 = a.detach().clone().requires_grad_(true);
      const at::Tensor x1 = b.detach().clone().requires_grad_(true);
      leaf_w = w.detach().clone().requires_grad_(true);
      at::Tensor out = run == 0 ? f({x0, x1}) : Checkpoint(f, {x0, x1}, {leaf_w});
      at::manual_seed(3);
      out.backward(at::randn(out.sizes()).to(out.dtype()));
      outs[run] = {out.detach()};
      grads[run] = {x0.grad(), x1.grad(), leaf_w.grad()};
    }
    const std::string label = std::string("Checkpoint ") + c10::toString(c.dtype);
    EXPECT_TRUE(at::equal(outs[1][0], outs[0][0])) << label;
    for (size_t i = 0; i < 3; ++i) {
      ASSERT_TRUE(grads[1][i].defined()) << label << ": input " << i;
      const double diff = RelDiff(grads[1][i], grads[0][i]);
      std::printf("%s: gradient of input %zu, relative difference %.3g\n", label.c_str(), i, diff);
      EXPECT_LE(diff, c.tolerance) << label << ": input " << i;
    }
  }
}

// A failure while the backward runs the layer again (an out-of-memory there, with
// drafter.recompute: layers) ends that backward with the error, and the next backward runs:
// the trainer splits the micro-batch on it. Injected: a c10::Error from the recomputation.
TEST(LeanOpsTest, AFailureInTheRecomputationEndsTheBackwardWithIt) {
  const at::Tensor w = (at::randn({8, 8}) * 0.3).requires_grad_(true);
  int calls = 0;
  bool fail = true;
  auto f = [&](const std::vector<at::Tensor>& in) {
    ++calls;
    TORCH_CHECK(!(fail && calls == 2), "CUDA out of memory. Tried to allocate 2.00 GiB (injected)");
    return at::silu(CastLinear(in[0], w, at::kFloat));
  };
  const at::Tensor x = at::randn({9, 8}).requires_grad_(true);
  at::Tensor out = Checkpoint(f, {x}, {w});
  try {
    out.sum().backward();
    ADD_FAILURE() << "the backward did not fail";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  }
  fail = false;
  calls = 0;
  w.mutable_grad() = at::Tensor();
  Checkpoint(f, {x}, {w}).sum().backward();
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(w.grad().defined());
}

// Only what is asked for: a frozen weight gets no gradient, and the input's is skipped when the
// input does not require one (the drafter's fc over the target features).
TEST(LeanOpsTest, GradientsOnlyWhereRequired) {
  const at::Tensor x = at::randn({8, 6}).to(at::kBFloat16);  // no grad
  const at::Tensor w = (at::randn({4, 6}) * 0.1).requires_grad_(true);
  at::Tensor y = CastLinear(x, w, at::kBFloat16);
  y.to(at::kFloat).sum().backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().scalar_type(), at::kFloat);
  EXPECT_FALSE(x.grad().defined());
}

}  // namespace
}  // namespace dflash::drafter
