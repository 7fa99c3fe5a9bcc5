#!/usr/bin/env bash
# The product worker executables carry no test hooks; the -testhooks ones do (so the check itself
# can fail). Usage: no_test_hooks.sh BUILD/services
set -euo pipefail
for role in target drafter; do
  bin=$1/${role}_worker/dflash-${role}-worker
  grep -q DFLASH_TEST_OOM_ABOVE_TOKENS "$bin-testhooks" || { echo "$bin-testhooks reads no hooks"; exit 1; }
  if grep -q DFLASH_TEST_ "$bin"; then echo "$bin carries test hooks"; exit 1; fi
  echo "ok: $bin carries no DFLASH_TEST_* name; $bin-testhooks does"
done
