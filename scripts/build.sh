#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and builds dflash with CMake + Ninja + ccache into $DFLASH_BUILD_DIR
# (default: build/ in the source tree). Extra arguments go to the CMake configure step.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"

DFLASH_VENV=${DFLASH_VENV:-$HOME/.local/share/dflash/venv}
build=${DFLASH_BUILD_DIR:-$root/build}
prefix=${CMAKE_PREFIX_PATH:-}
prefix=${prefix//:/;}  # CMake lists use ";"
if [ -z "${Torch_DIR:-}" ] && [ -x "$DFLASH_VENV/bin/python" ]; then
  torch_prefix=$("$DFLASH_VENV/bin/python" -W ignore -c 'import torch; print(torch.utils.cmake_prefix_path)')
  prefix="$torch_prefix${prefix:+;$prefix}"
fi
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-RelWithDebInfo} \
  ${prefix:+-DCMAKE_PREFIX_PATH="$prefix"} ${Torch_DIR:+-DTorch_DIR="$Torch_DIR"} "$@" >/dev/null
# Two jobs fit the 2-core, 24 GiB machines this project is built on; override with DFLASH_JOBS.
cmake --build "$build" -j "${DFLASH_JOBS:-$(nproc)}"
echo "[build] binaries in $build/services" >&2
