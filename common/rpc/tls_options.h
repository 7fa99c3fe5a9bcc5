// The `tls` block of the coordinator's, the workers' and dflashctl's configuration (plain data; no
// gRPC). What each field means for each process: common/rpc/tls.h and docs/security.md.
#pragma once

#include <string>

namespace dflash {

struct TlsOptions {
  std::string cert_file;  // PEM certificate chain this process presents
  std::string key_file;   // its PEM private key; must not be readable by group or others
  std::string ca_file;    // PEM CA bundle that peers' certificates must chain to
  bool mutual = false;    // see above: peers must present a certificate signed by ca_file
};

}  // namespace dflash
