#!/usr/bin/env bash
# Collects what the runtime image needs from a finished build into a staging root that the
# runtime stage of deploy/docker/Dockerfile copies over / as is:
#   <root>/opt/dflash/bin/       the four executables
#   <root>/<site-packages>/torch/lib and nvidia/   LibTorch and the CUDA libraries of its wheel,
#                                at the same absolute path as in the builder, because the
#                                executables' RUNPATH and libtorch_cuda.so's $ORIGIN/../../nvidia
#                                RPATH point there
#   <root>/opt/dflash/lib/       every other shared library the executables load (gRPC, protobuf,
#                                abseil, yaml-cpp, prometheus-cpp, libmicrohttpd, ...), found with
#                                ldd, so the list never drifts from the build's dependencies and no
#                                runtime package names have to be guessed
#   <root>/etc/ld.so.conf.d/dflash.conf   makes the runtime's ldconfig find opt/dflash/lib
# Usage: stage-runtime.sh BUILD_DIR VENV STAGING_ROOT
set -euo pipefail
build=$1 venv=$2 root=$3

mkdir -p "$root/opt/dflash/bin" "$root/opt/dflash/lib" "$root/etc/ld.so.conf.d"
bins=(coordinator/dflash-coordinator target_worker/dflash-target-worker
      drafter_worker/dflash-drafter-worker dflashctl/dflashctl)
for b in "${bins[@]}"; do
  cp "$build/services/$b" "$root/opt/dflash/bin/"
done

site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# nvidia/ is absent from a CPU-only wheel; copy it when it is there. cp runs from / with relative
# paths: with an absolute source, cp -a --parents (coreutils 9.1) fails to copy the attributes
# of the parent directories.
for d in "$site/torch/lib" "$site/nvidia"; do
  if [ -d "$d" ]; then (cd / && cp -a --parents "${d#/}" "$root/"); fi
done

# glibc, the GCC runtime and libstdc++ come with the runtime image (same Ubuntu release as the
# builder); libcuda.so.1 belongs to the host's driver and is mounted by the NVIDIA container
# toolkit. Everything else that ldd resolves outside the wheel is copied.
for b in "$root"/opt/dflash/bin/*; do ldd "$b"; done |
  awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
  while read -r lib; do
    case "$lib" in "$venv"/* | "$site"/*) continue ;; esac
    case "${lib##*/}" in
      libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libutil.so.* | \
        ld-linux*.so.* | libgcc_s.so.* | libstdc++.so.* | libcuda.so.*) continue ;;
    esac
    cp -L "$lib" "$root/opt/dflash/lib/"
  done
echo /opt/dflash/lib >"$root/etc/ld.so.conf.d/dflash.conf"
echo "staged ${#bins[@]} executables and" \
  "$(find "$root/opt/dflash/lib" -type f | wc -l) libraries under $root" >&2
