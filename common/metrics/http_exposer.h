// Serves GET /metrics (Prometheus text format) with GNU libmicrohttpd.
//
// Why not prometheus-cpp's own Exposer: it runs civetweb, whose worker threads are created with
// a fixed small stack; in a process that links LibTorch with CUDA (whose libraries carry ~200 KB
// of static TLS) pthread_create fails and /metrics never comes up ("Cannot create first worker
// thread"). libmicrohttpd's threads use the default stack size.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

struct MHD_Daemon;

namespace dflash::metrics {

class HttpExposer {
 public:
  // `render` produces the exposition text for each scrape. Listens on host:port (port 0: OS picks).
  static absl::StatusOr<std::unique_ptr<HttpExposer>> Start(const std::string& address,
                                                            std::function<std::string()> render);
  ~HttpExposer();
  int port() const { return port_; }

 private:
  HttpExposer() = default;
  std::function<std::string()> render_;
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
  friend struct HttpExposerAccess;
};

}  // namespace dflash::metrics
