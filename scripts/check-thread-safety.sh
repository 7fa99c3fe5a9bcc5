#!/usr/bin/env bash
# Clang's thread-safety analysis (-Wthread-safety) over the sources whose shared state is guarded
# by annotated mutexes (absl::Mutex with ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED): each
# file is compiled with clang, syntax only, with the flags CMake recorded for it in
# BUILD_DIR/compile_commands.json; any thread-safety warning fails (exit 1). A ctest
# (thread_safety_analysis) runs it; it needs clang++ (scripts/setup.sh installs clang-14).
#   scripts/check-thread-safety.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: check-thread-safety.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
clang=${CLANGXX:-$(command -v clang++-14 || command -v clang++ || true)}
[ -n "$clang" ] || { echo "check-thread-safety: no clang++ (scripts/setup.sh installs clang-14)" >&2; exit 1; }
py=${DFLASH_PYTHON:-python3}
# The annotated sources (the coordinator: one mutex shared by the tick, the RPC handlers and the
# step threads).
files=(services/coordinator/coordinator.cc services/coordinator/run_driver.cc
       services/coordinator/run_start.cc services/coordinator/step_commit.cc
       services/coordinator/pair_prepare.cc
       services/coordinator/worker_control.cc)
status=0
for f in "${files[@]}"; do
  # The recorded command, with clang in place of the compiler, no object output, syntax only.
  mapfile -t args < <("$py" - "$build/compile_commands.json" "$root/$f" <<'PY'
import json, shlex, sys
for e in json.load(open(sys.argv[1])):
    if e["file"] == sys.argv[2]:
        a = shlex.split(e["command"]) if "command" in e else e["arguments"]
        out, skip = [], False
        for x in a[1:]:
            if skip: skip = False; continue
            if x in ("-o", "-c"): skip = x == "-o"; continue
            if x == sys.argv[2]: continue
            out.append(x)
        print("\n".join(out))
        break
else:
    sys.exit("not in compile_commands.json: " + sys.argv[2])
PY
)
  if ! (cd "$build" && "$clang" "${args[@]}" -fsyntax-only -Wno-everything -Wthread-safety \
          -Werror=thread-safety "$root/$f"); then
    echo "check-thread-safety: $f: thread-safety analysis failed (above)" >&2
    status=1
  fi
done
[ "$status" = 0 ] && echo "check-thread-safety: ${#files[@]} files pass clang's -Wthread-safety"
exit "$status"
