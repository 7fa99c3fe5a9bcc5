#include "common/metrics/http_exposer.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dflash::metrics {

struct HttpExposerAccess {
  static MHD_Result Handle(void* cls, MHD_Connection* conn, const char* url, const char* method,
                           const char*, const char*, size_t*, void**) {
    auto* self = static_cast<HttpExposer*>(cls);
    const bool is_metrics = std::strcmp(url, "/metrics") == 0;
    std::string body;
    unsigned int code = MHD_HTTP_OK;
    if (std::strcmp(method, "GET") != 0 && std::strcmp(method, "HEAD") != 0) {
      code = MHD_HTTP_METHOD_NOT_ALLOWED;
      body = "only GET\n";
    } else if (!is_metrics) {
      code = MHD_HTTP_NOT_FOUND;
      body = "see /metrics\n";
    } else {
      body = self->render_();
    }
    MHD_Response* resp =
        MHD_create_response_from_buffer(body.size(), body.data(), MHD_RESPMEM_MUST_COPY);
    MHD_add_response_header(resp, "Content-Type",
                            is_metrics ? "text/plain; version=0.0.4; charset=utf-8" : "text/plain");
    MHD_Result r = MHD_queue_response(conn, code, resp);
    MHD_destroy_response(resp);
    return r;
  }
};

absl::StatusOr<std::unique_ptr<HttpExposer>> HttpExposer::Start(
    const std::string& address, std::function<std::string()> render) {
  size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("must be host:port, got '", address, "'"));
  }
  std::string host = address.substr(0, colon);
  if (host == "localhost") host = "127.0.0.1";
  sockaddr_in addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("host must be an IPv4 address (e.g. 127.0.0.1 or 0.0.0.0), got '", host, "'"));
  }
  std::unique_ptr<HttpExposer> ex(new HttpExposer());
  ex->render_ = std::move(render);
  ex->daemon_ =
      MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, nullptr, nullptr,
                       &HttpExposerAccess::Handle, ex.get(), MHD_OPTION_SOCK_ADDR, &addr,
                       MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
  if (ex->daemon_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, " (port in use?)"));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(ex->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  ex->port_ = info ? info->port : port;
  return ex;
}

HttpExposer::~HttpExposer() {
  if (daemon_) MHD_stop_daemon(daemon_);
}

}  // namespace dflash::metrics
