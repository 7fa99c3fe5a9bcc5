// Placement rules (services/coordinator/placement.h): the feature transport a pair gets, and the
// explicit choices that cannot work for it refused by name.
#include "services/coordinator/placement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace dflash::coordinator {
namespace {

using ::testing::HasSubstr;

v1::WorkerInfo Worker(const std::string& name, const std::string& host, const std::string& kind,
                      int index) {
  v1::WorkerInfo w;
  w.set_name(name);
  w.set_control_address(absl::StrCat(host, ":7001"));
  w.mutable_device()->set_kind(kind);
  w.mutable_device()->set_index(index);
  return w;
}

absl::StatusOr<std::string> Resolve(const std::string& transport, const v1::WorkerInfo& target,
                                    const v1::WorkerInfo& drafter) {
  config::RunSpec spec;
  spec.placement.transport = transport;
  absl::StatusOr<transport::Transport> t = ResolveTransport(spec, target, drafter);
  if (!t.ok()) return t.status();
  return std::string(transport::TransportName(*t));
}

TEST(Placement, AutoPicksCudaIpcOnOneGpuNcclOnTwoAndHostWithACpu) {
  const auto g0 = Worker("t", "10.0.0.1", "cuda", 0), g0b = Worker("d", "10.0.0.1", "cuda", 0);
  const auto g1 = Worker("d", "10.0.0.1", "cuda", 1), other = Worker("d", "10.0.0.2", "cuda", 0);
  const auto cpu = Worker("d", "10.0.0.1", "cpu", -1);
  EXPECT_EQ(*Resolve("auto", g0, g0b), "cuda_ipc");
  EXPECT_EQ(*Resolve("auto", g0, g1), "nccl");
  EXPECT_EQ(*Resolve("auto", g0, other), "nccl");  // GPU 0 of another machine
  EXPECT_EQ(*Resolve("auto", g0, cpu), "host");
  EXPECT_EQ(*Resolve("auto", Worker("t", "10.0.0.1", "cpu", -1), cpu), "host");
  // A CPU worker on another machine: nothing can connect them, said at once.
  const absl::Status far = Resolve("auto", g0, Worker("d", "10.0.0.2", "cpu", -1)).status();
  EXPECT_EQ(far.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(far.message(), HasSubstr("placement.transport: host moves features through shared "
                                       "memory on one machine"));
}

TEST(Placement, ExplicitTransportsThatCannotWorkAreRefusedByName) {
  const auto g0 = Worker("t", "10.0.0.1", "cuda", 0), g0b = Worker("d", "10.0.0.1", "cuda", 0);
  const auto g1 = Worker("d", "10.0.0.1", "cuda", 1), far = Worker("d", "10.0.0.2", "cpu", -1);
  const auto cpu = Worker("d", "10.0.0.1", "cpu", -1);
  EXPECT_EQ(*Resolve("nccl", g0, g1), "nccl");
  EXPECT_EQ(*Resolve("cuda_ipc", g0, g0b), "cuda_ipc");
  EXPECT_EQ(*Resolve("host", g0, g1), "host");
  const absl::Status same = Resolve("nccl", g0, g0b).status();
  EXPECT_EQ(same.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(same.message(), HasSubstr("placement.transport: nccl needs two GPUs"));
  EXPECT_THAT(same.message(), HasSubstr("10.0.0.1/cuda0"));
  EXPECT_THAT(Resolve("nccl", g0, cpu).status().message(), HasSubstr("on GPUs"));
  EXPECT_THAT(Resolve("cuda_ipc", g0, g1).status().message(), HasSubstr("on the same GPU"));
  EXPECT_THAT(Resolve("host", g0, far).status().message(), HasSubstr("on one machine"));
}

}  // namespace
}  // namespace dflash::coordinator
