// The one place where absl::Status and grpc::Status are translated into each other.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace dflash {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace dflash
