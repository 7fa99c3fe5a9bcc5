// Client channels with reconnect backoff suited to a cluster whose processes restart: a
// coordinator that comes back is found again within about a second, not gRPC's default of up to
// two minutes.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace dflash {

// `creds` null = plaintext (TransportSecurity::ChannelCredentials() gives TLS ones).
std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> creds = nullptr);

}  // namespace dflash
