// Client channels with reconnect backoff suited to a cluster whose processes restart: a
// coordinator that comes back is found again within about a second, not gRPC's default of up to
// two minutes. Messages up to kMaxMessageBytes.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace dflash {

// The largest message a channel or server of this project receives (gRPC's default is 4 MiB): a
// regeneration call of 4,096 chat prompts and their answers, or an evaluation's outputs, passes
// several MiB.
inline constexpr int kMaxMessageBytes = 256 << 20;

// `creds` null = plaintext (TransportSecurity::ChannelCredentials() gives TLS ones).
std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> creds = nullptr);

}  // namespace dflash
