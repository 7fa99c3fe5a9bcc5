#!/usr/bin/env bash
# Writes a private CA and certificates signed by it for a dflash cluster, into DIR:
#   ca.crt / ca.key                 the CA (keep ca.key offline in production)
#   coordinator.crt / .key          the coordinator's certificate (server + client use)
#   worker.crt / .key               one certificate for the workers (server + client use)
# Usage: scripts/make-dev-certs.sh DIR [HOST ...]
#   HOSTs (default: 127.0.0.1 localhost) are the IPs or DNS names the certificates are valid for:
#   every address dflashctl and workers dial the coordinator at, and every worker's
#   advertise_host. For development and tests; production clusters use their own PKI
#   (docs/security.md). Keys are written with mode 600. Needs the openssl command.
set -euo pipefail
dir=${1:?usage: make-dev-certs.sh DIR [HOST ...]}
shift
hosts=("$@")
[ ${#hosts[@]} -gt 0 ] || hosts=(127.0.0.1 localhost)
san=""
for h in "${hosts[@]}"; do
  if [[ $h =~ ^[0-9.]+$ || $h == *:* ]]; then san+="IP:$h,"; else san+="DNS:$h,"; fi
done
san=${san%,}
umask 077
mkdir -p "$dir"
days=${DFLASH_CERT_DAYS:-365}
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
key "$dir/ca.key"
openssl req -x509 -new -key "$dir/ca.key" -out "$dir/ca.crt" -days "$days" \
  -subj "/CN=${DFLASH_CA_NAME:-dflash-dev-ca}" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
ext=$(mktemp)
trap 'rm -f "$ext"' EXIT
printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n' \
  "$san" >"$ext"
for name in coordinator worker; do
  key "$dir/$name.key"
  openssl req -new -key "$dir/$name.key" -subj "/CN=dflash-$name" -out "$dir/$name.csr"
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -days "$days" -extfile "$ext" -out "$dir/$name.crt" 2>/dev/null
  rm -f "$dir/$name.csr"
done
chmod 644 "$dir"/*.crt
echo "certificates for ${hosts[*]} in $dir" >&2
