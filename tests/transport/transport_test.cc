// The transports' table (common/transport/transport.h) without their implementation: names,
// what auto picks where, each transport's placement rule and feature buffers.
#include "common/transport/transport.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dflash::transport {
namespace {

TEST(TransportTest, NamesRoundTrip) {
  const std::vector<std::string> names = TransportNames();
  ASSERT_EQ(names, (std::vector<std::string>{"nccl", "cuda_ipc", "host"}));
  for (const std::string& name : names) {
    absl::StatusOr<Transport> t = ParseTransport(name);
    ASSERT_TRUE(t.ok()) << name;
    EXPECT_EQ(TransportName(*t), name);
  }
  const absl::Status bad = ParseTransport("auto").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "placement.transport: 'auto' is none of nccl, cuda_ipc, host");
  EXPECT_FALSE(DeviceFeatures(Transport::kHost));
  EXPECT_TRUE(DeviceFeatures(Transport::kCudaIpc));
  EXPECT_TRUE(DeviceFeatures(Transport::kNccl));
}

// placement.transport as placement and `dflashctl plan --local` resolve it: auto by where the pair
// runs, a name as it is (even where its rule refuses it: PlacementProblem's to say), another name
// refused naming the field.
TEST(TransportTest, TheChosenTransportIsAutoOrTheNamedOne) {
  const PairLocation one_gpu{true, true, true};
  EXPECT_EQ(*ChosenTransport("auto", one_gpu), Transport::kCudaIpc);
  EXPECT_EQ(*ChosenTransport("nccl", one_gpu), Transport::kNccl);
  EXPECT_EQ(*ChosenTransport("host", one_gpu), Transport::kHost);
  const absl::StatusOr<Transport> bad = ChosenTransport("tcp", one_gpu);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("placement.transport"), std::string::npos) << bad.status();
}

TEST(TransportTest, AutoPicksByWhereThePairRunsAndEachRuleRefusesTheOthers) {
  const PairLocation one_gpu{true, true, true}, two_gpus{true, true, false},
      two_machines{false, true, false}, cpus{true, false, false}, cpus_apart{false, false, false};
  EXPECT_EQ(AutoTransport(one_gpu), Transport::kCudaIpc);
  EXPECT_EQ(AutoTransport(two_gpus), Transport::kNccl);
  EXPECT_EQ(AutoTransport(two_machines), Transport::kNccl);
  EXPECT_EQ(AutoTransport(cpus), Transport::kHost);
  // What auto picks always passes its own rule, except CPU workers on two machines (nothing can).
  for (const PairLocation& w : {one_gpu, two_gpus, two_machines, cpus}) {
    EXPECT_EQ(PlacementProblem(AutoTransport(w), w), "");
  }
  EXPECT_NE(PlacementProblem(AutoTransport(cpus_apart), cpus_apart), "");
  EXPECT_EQ(PlacementProblem(Transport::kCudaIpc, two_gpus),
            "needs the target and the drafter on the same GPU (nccl is for two GPUs)");
  EXPECT_EQ(PlacementProblem(Transport::kNccl, cpus), "needs the target and the drafter on GPUs");
  EXPECT_EQ(PlacementProblem(Transport::kNccl, one_gpu),
            "needs two GPUs: NCCL refuses two ranks on one device (cuda_ipc is for one GPU)");
  EXPECT_EQ(PlacementProblem(Transport::kHost, two_machines),
            "moves features through shared memory on one machine (nccl crosses machines)");
  EXPECT_EQ(PlacementProblem(Transport::kHost, one_gpu), "");  // host works anywhere on one machine
}

TEST(TransportTest, EachTransportsFeatureBuffers) {
  const FeatureBuffers host = BuffersOf(Transport::kHost), ipc = BuffersOf(Transport::kCudaIpc),
                       nccl = BuffersOf(Transport::kNccl);
  EXPECT_EQ(host.target_device_slots, 0);
  EXPECT_EQ(host.drafter_device_copies, 1);
  EXPECT_EQ(ipc.target_device_slots, 2);
  EXPECT_EQ(ipc.drafter_device_copies + ipc.drafter_receive_buffers, 0);
  EXPECT_TRUE(ipc.pair_shares_gpu);
  EXPECT_EQ(nccl.target_device_slots, 2);
  EXPECT_EQ(nccl.drafter_receive_buffers, 2);
  EXPECT_FALSE(host.pair_shares_gpu || nccl.pair_shares_gpu);
}

TEST(TransportTest, CollectivesByDeviceAndName) {
  EXPECT_EQ(CollectiveFor(/*on_gpu=*/true), Collective::kNccl);
  EXPECT_EQ(CollectiveFor(/*on_gpu=*/false), Collective::kHost);
  for (Collective c : {Collective::kHost, Collective::kNccl}) {
    absl::StatusOr<Collective> parsed = ParseCollective(CollectiveName(c), "collective");
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, c);
  }
  const absl::Status bad = ParseCollective("mpi", "tp_collective").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "tp_collective: 'mpi' is neither host nor nccl");
}

}  // namespace
}  // namespace dflash::transport
