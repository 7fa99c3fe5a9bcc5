#include "common/rpc/tls.h"

#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/base/file_mode.h"

namespace dflash {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(field, ": cannot read ", path));
  std::string pem((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, " is not PEM"));
  }
  return pem;
}

}  // namespace

absl::StatusOr<TransportSecurity> TransportSecurity::Load(const TlsOptions& o,
                                                          const std::string& prefix) {
  if (o.cert_file.empty() != o.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, o.cert_file.empty() ? "cert_file" : "key_file",
                     ": a certificate and its key go together: set both cert_file and key_file"));
  }
  TransportSecurity t;
  t.mutual_ = o.mutual;
  if (!o.cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadPem(o.cert_file, prefix + "cert_file");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadSecretFile(o.key_file, "TLS private key");
    if (!key.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "key_file: ", key.status().message()));
    }
    if (key->find("PRIVATE KEY-----") == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "key_file: ", o.key_file, " is not a PEM private key"));
    }
    t.cert_ = *std::move(cert);
    t.key_ = *std::move(key);
  }
  if (!o.ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(o.ca_file, prefix + "ca_file");
    if (!ca.ok()) return ca.status();
    t.ca_ = *std::move(ca);
  }
  return t;
}

std::shared_ptr<grpc::ServerCredentials> TransportSecurity::ServerCredentials(
    bool require_client_cert) const {
  if (cert_.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions opts(
      ca_.empty()           ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
      : require_client_cert ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                            : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  opts.pem_root_certs = ca_;
  opts.pem_key_cert_pairs.push_back({key_, cert_});
  return grpc::SslServerCredentials(opts);
}

std::shared_ptr<grpc::ChannelCredentials> TransportSecurity::ChannelCredentials() const {
  if (!dials_tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions opts;
  opts.pem_root_certs = ca_;  // empty: gRPC's default roots
  opts.pem_private_key = key_;
  opts.pem_cert_chain = cert_;
  return grpc::SslCredentials(opts);
}

std::string TransportSecurity::Describe() const {
  if (!serves_tls() && !dials_tls()) return "plaintext";
  return mutual_ ? "mutual TLS" : "TLS";
}

bool PeerHasVerifiedCertificate(const grpc::ServerContext& ctx) {
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  return auth && auth->IsPeerAuthenticated() && !auth->FindPropertyValues("x509_pem_cert").empty();
}

}  // namespace dflash
