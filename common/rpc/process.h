// Process plumbing shared by every long-lived executable: signals, the gRPC server, ready files.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dflash {

// Blocks SIGINT and SIGTERM in the calling thread and every thread started after it. Call first
// in main(), then WaitForTerminationSignal() receives them synchronously.
void BlockTerminationSignals();
// Waits for SIGINT or SIGTERM and returns its number.
int WaitForTerminationSignal();

// Builds and starts a gRPC server on `address` (port 0 = chosen by the OS) with the services.
// *bound_port receives the port actually bound. `creds` null = plaintext.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services, int* bound_port,
    std::shared_ptr<grpc::ServerCredentials> creds = nullptr);

// Replaces `host:port`'s port with `port` ("127.0.0.1:0", 4242 -> "127.0.0.1:4242").
std::string WithPort(const std::string& address, int port);

// Atomically writes `contents` to `path` (write to a temp file, then rename), so a reader that
// sees the file sees all of it. Tests and scripts use it to learn OS-chosen ports.
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);

}  // namespace dflash
