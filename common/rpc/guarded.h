// Runs an RPC handler's body so that no exception leaves it. An exception escaping a gRPC handler
// is answered UNKNOWN "Unexpected error in RPC handling" and logged nowhere; here it becomes
// INTERNAL "<operation>: <what>" (RESOURCE_EXHAUSTED for the host's std::bad_alloc) and an
// error line in the process log.
#pragma once

#include <grpcpp/support/status.h>

#include <exception>
#include <new>

#include "absl/strings/string_view.h"

namespace dflash {

// The status and log line of an exception that escaped `operation` (its what(); a LibTorch
// backtrace after the first "\nException raised from" is left out).
grpc::Status EscapedException(absl::string_view operation, absl::string_view what,
                              bool out_of_host_memory = false);

template <typename Body>
grpc::Status Guarded(absl::string_view operation, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc& e) {
    return EscapedException(operation, e.what(), /*out_of_host_memory=*/true);
  } catch (const std::exception& e) {
    return EscapedException(operation, e.what());
  } catch (...) {
    return EscapedException(operation, "an exception of a type that is not std::exception");
  }
}

}  // namespace dflash
