// Client channels with reconnect backoff suited to a cluster whose processes restart: a
// coordinator that comes back is found again within about a second, not gRPC's default of up to
// two minutes.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace dflash {

std::shared_ptr<grpc::Channel> CreateChannel(const std::string& address);

}  // namespace dflash
