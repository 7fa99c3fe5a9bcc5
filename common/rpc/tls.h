// Transport security of every gRPC connection: TLS from PEM files, mutual TLS as an
// option. One `tls` block per process (docs/security.md):
//
//   coordinator  cert_file/key_file: serves TLS. ca_file: verifies the workers' certificates (their
//                control ports when it dials back, their client certificates when they register).
//                mutual: Register/Heartbeat need a client certificate signed by ca_file
//                (dflashctl is not asked for one; it uses the bearer token).
//   worker       ca_file: dials the coordinator over TLS, verifying it. cert_file/key_file: serves
//                its control port over TLS and presents the certificate to the coordinator.
//                mutual: its control port accepts only clients with a certificate signed by
//                ca_file (the coordinator).
//   dflashctl    ca_file (and optionally cert_file/key_file) to reach a TLS coordinator.
//
// Certificates must name the host they are dialed at (a subjectAltName for the IP or DNS name).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/rpc/tls_options.h"

namespace dflash {

// The PEM material read from the files, and credentials built from it. Default: plaintext.
class TransportSecurity {
 public:
  TransportSecurity() = default;
  // Reads the files; errors name the field and the file (a key readable by others is refused).
  static absl::StatusOr<TransportSecurity> Load(const TlsOptions& o, const std::string& prefix);

  // Serves TLS when a certificate is configured; requests client certificates when ca_file is
  // set and requires them when `require_client_cert`.
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials(bool require_client_cert) const;
  // Dials TLS when ca_file or a certificate is configured (system roots when ca_file is empty),
  // presenting the certificate when there is one.
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;

  bool serves_tls() const { return !cert_.empty(); }
  bool dials_tls() const { return !ca_.empty() || !cert_.empty(); }
  bool mutual() const { return mutual_; }
  // "plaintext", "TLS" or "mutual TLS", for the start-up log line.
  std::string Describe() const;

 private:
  std::string cert_, key_, ca_;
  bool mutual_ = false;
};

// Whether the peer of a call presented a certificate that verified against the server's CA.
bool PeerHasVerifiedCertificate(const grpc::ServerContext& ctx);

}  // namespace dflash
