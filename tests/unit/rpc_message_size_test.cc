// Messages above gRPC's 4 MiB default pass between this project's channels and servers
// (common/rpc/channel.h kMaxMessageBytes): a Generate call of 12 MiB of prompt tokens and its
// 12 MiB answer, through a real server on a loopback port. A server built without the limit
// raised refuses the same call, so the test would fail if either side lost the setting.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/rpc/channel.h"
#include "common/rpc/process.h"
#include "dflash/v1/worker.grpc.pb.h"

namespace dflash {
namespace {

// Answers each prompt with itself.
class EchoTarget final : public v1::TargetWorker::Service {
  grpc::Status Generate(grpc::ServerContext*, const v1::GenerateRequest* req,
                        v1::GenerateResponse* resp) override {
    for (const v1::TokenIds& p : req->prompts()) *resp->add_outputs() = p;
    return grpc::Status::OK;
  }
};

v1::GenerateRequest BigRequest() {
  v1::GenerateRequest req;
  for (int p = 0; p < 64; ++p) {
    v1::TokenIds* ids = req.add_prompts();
    for (int t = 0; t < 65536; ++t) ids->add_ids(1000 + t % 40000);  // 3 bytes each as varints
  }
  return req;
}

TEST(RpcMessageSize, ChannelsAndServersCarryMessagesAboveFourMiB) {
  EchoTarget service;
  int port = 0;
  auto server = StartGrpcServer("127.0.0.1:0", {&service}, &port);
  ASSERT_TRUE(server.ok()) << server.status();
  const v1::GenerateRequest req = BigRequest();
  ASSERT_GT(req.ByteSizeLong(), 8u << 20);
  ASSERT_LT(req.ByteSizeLong(), static_cast<size_t>(kMaxMessageBytes));
  auto stub = v1::TargetWorker::NewStub(MakeChannel("127.0.0.1:" + std::to_string(port)));
  grpc::ClientContext ctx;
  v1::GenerateResponse resp;
  grpc::Status s = stub->Generate(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.outputs_size(), 64);
  EXPECT_EQ(resp.outputs(63).ids_size(), 65536);
  (*server)->Shutdown();
}

TEST(RpcMessageSize, AServerWithGrpcDefaultsRefusesTheSameCall) {
  EchoTarget service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto stub = v1::TargetWorker::NewStub(MakeChannel("127.0.0.1:" + std::to_string(port)));
  grpc::ClientContext ctx;
  v1::GenerateResponse resp;
  grpc::Status s = stub->Generate(&ctx, BigRequest(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  server->Shutdown();
}

}  // namespace
}  // namespace dflash
