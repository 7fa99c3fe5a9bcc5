#include "common/rpc/guarded.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace dflash {

grpc::Status EscapedException(absl::string_view operation, absl::string_view what,
                              bool out_of_host_memory) {
  const size_t backtrace = what.find("\nException raised from");
  if (backtrace != absl::string_view::npos) what = what.substr(0, backtrace);
  std::string message = out_of_host_memory
                            ? absl::StrCat(operation, ": out of host memory (", what, ")")
                            : absl::StrCat(operation, ": ", what);
  LOG(ERROR) << "exception in RPC handler: " << message;
  return grpc::Status(
      out_of_host_memory ? grpc::StatusCode::RESOURCE_EXHAUSTED : grpc::StatusCode::INTERNAL,
      message);
}

}  // namespace dflash
