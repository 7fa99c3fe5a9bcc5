// The bucketed, backward-overlapped gradient all-reduce (common/train/grad_reducer.h) with two
// ranks (threads, host communicator) and buckets of a few bytes, so that a step has many: the
// buckets start during the backward in order, a parameter one rank's backward never reaches takes
// part as zeros, a rank that runs no backward at all still starts every bucket, and afterwards
// every gradient holds the sum over the ranks, bit for bit the sum of the two ranks' own. The
// same when the loss is computed inside an activation checkpoint (drafter.recompute: layers),
// whose recomputed graph hands the gradients back through the checkpoint's node.
#include "common/train/grad_reducer.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros_like.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <string>
#include <vector>

#include "common/drafter/lean_ops.h"
#include "tests/train/two_ranks.h"

namespace dflash::train {
namespace {

constexpr int kParams = 6;

std::vector<at::Tensor> Params() {
  at::manual_seed(7);
  std::vector<at::Tensor> p;
  for (int k = 0; k < kParams; ++k) p.push_back(at::randn({3 + k, 2}).set_requires_grad(true));
  return p;
}

// Rank r's loss: sum_k c_k * sum(p_k^2), c_k = r + k + 1; rank 1 leaves out parameter 2, and in
// `idle` mode a rank runs no backward at all. `checkpointed`: the loss through drafter::Checkpoint.
void Backward(const std::vector<at::Tensor>& p, int rank, bool checkpointed) {
  auto loss_of = [&p, rank](const std::vector<at::Tensor>&) {
    at::Tensor loss;
    for (int k = 0; k < kParams; ++k) {
      if (rank == 1 && k == 2) continue;
      at::Tensor term = (p[k] * p[k]).sum() * static_cast<double>(rank + k + 1);
      loss = loss.defined() ? loss + term : term;
    }
    return loss;
  };
  (checkpointed ? drafter::Checkpoint(loss_of, {}, p) : loss_of({})).backward();
}

TEST(GradReducerTest, BucketsStartDuringTheBackwardAndSumOverRanks) {
  for (const bool checkpointed : {false, true}) {
    for (const bool idle_rank1 : {false, true}) {
      SCOPED_TRACE(idle_rank1 ? "rank 1 runs no backward" : "both ranks run a backward");
      SCOPED_TRACE(checkpointed ? "through a checkpoint" : "plain");
      // The expected sums, from the ranks' own gradients.
      std::vector<at::Tensor> want;
      {
        std::vector<at::Tensor> a = Params(), b = Params();
        Backward(a, 0, false);
        if (!idle_rank1) Backward(b, 1, false);
        for (int k = 0; k < kParams; ++k) {
          at::Tensor gb = b[k].grad().defined() ? b[k].grad() : at::zeros_like(b[k]);
          want.push_back(a[k].grad() + gb);
        }
      }
      const std::string name = "dflash-test-gr-" + std::to_string(getpid());
      std::vector<at::Tensor> params[2] = {Params(), Params()};
      size_t buckets[2] = {0, 0}, in_backward[2] = {0, 0};
      const std::array<absl::Status, 2> status =
          RunTwoRanks(name, [&](int rank, transport::Communicator* comm) {
            GradReducer reducer(params[rank], comm, /*bucket_bytes=*/1);
            buckets[rank] = reducer.num_buckets();
            reducer.Arm();
            if (!(rank == 1 && idle_rank1)) Backward(params[rank], rank, checkpointed);
            in_backward[rank] = reducer.started_in_backward();
            return reducer.Finish();
          });
      for (int r = 0; r < 2; ++r) {
        ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
        EXPECT_EQ(buckets[r], static_cast<size_t>(kParams));  // 1 byte: one parameter each
        for (int k = 0; k < kParams; ++k) {
          EXPECT_TRUE(at::equal(params[r][k].grad(), want[k])) << "rank " << r << " param " << k;
        }
      }
      // Buckets hold parameters in reverse order: all six start inside rank 0's backward; on rank 1
      // bucket 3 (parameter 2, never reached) holds up the rest until the flush.
      EXPECT_EQ(in_backward[0], 6u);
      // Through a checkpoint the node has an edge to every weight it was given, so parameter 2's
      // hook runs too, with no gradient, which the reducer counts as zeros as the flush would.
      EXPECT_EQ(in_backward[1], idle_rank1 ? 0u : (checkpointed ? 6u : 3u));
    }
  }
}

}  // namespace
}  // namespace dflash::train
