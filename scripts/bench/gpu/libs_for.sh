#!/usr/bin/env bash
# The Debian shared libraries that the named binaries load (absl, yaml-cpp, protobuf, ...), copied
# into one folder, for a device call that cannot also carry .devdeps (24 MB) beside something
# large (the peers' wheels): LD_LIBRARY_PATH=DIR there. LibTorch, CUDA, NCCL and the C runtime are
# left out (the GPU machine has its own).
#   scripts/bench/gpu/libs_for.sh OUT_DIR BINARY...      (CPU machine) -> OUT_DIR, its size printed
set -euo pipefail
dir=${1:?usage: libs_for.sh OUT_DIR BINARY...}; shift
rm -rf "$dir" && mkdir -p "$dir"
ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libpthread|libdl|librt|libutil|ld-linux[^/]*|libgcc_s|libstdc\+\+)\.so' |
  grep -vE 'torch|cuda|nccl|nvidia|libcu|libnv' |
  while read -r lib; do cp -L "$lib" "$dir/"; done
du -sb "$dir"
