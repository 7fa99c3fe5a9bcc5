#!/usr/bin/env bash
set -euo pipefail
cp .gpu/p2/b /tmp/pieces/b; ls -l /tmp/pieces; tail -n 1 /tmp/b.build.log 2>/dev/null || true; cat /tmp/b.rc 2>/dev/null || true
