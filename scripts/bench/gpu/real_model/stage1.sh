#!/usr/bin/env bash
# Call 1: copy the tree to /tmp/repo, keep piece 1, use the binaries built on the CPU machine
# (stripped, sm_90a) if they load here, else start the Release build in the background.
set -euo pipefail
date -u +%FT%TZ; nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
rm -rf /tmp/repo /tmp/pieces /tmp/b /tmp/b.rc; mkdir -p /tmp/repo /tmp/pieces
tar --exclude=./.gpu -cf - . | tar -xf - -C /tmp/repo
cp .gpu/p1/a /tmp/pieces/a
cd /tmp/repo
echo "rev $(git rev-parse --short HEAD 2>/dev/null || echo '?'), prebuilt at $(cat "$OLDPWD/.gpu/p1/pb.rev")"
set +e; source .devdeps/env.sh >/dev/null 2>&1; set -e
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cuda/lib64
mkdir -p /tmp/pb /tmp/b/services/{coordinator,dflashctl,target_worker,drafter_worker}
tar -xzf "$OLDPWD/.gpu/p1/pb.tgz" -C /tmp/pb
for r in coordinator/dflash-coordinator dflashctl/dflashctl target_worker/dflash-target-worker drafter_worker/dflash-drafter-worker; do
  cp /tmp/pb/$(basename $r) /tmp/b/services/$r
done
missing=$(ldd /tmp/b/services/*/* | grep -c "not found" || true)
ldd /tmp/b/services/*/* | grep "not found" | sort -u | head || true
if [ "$missing" = 0 ] && /tmp/b/services/dflashctl/dflashctl --help >/dev/null 2>&1; then
  echo "prebuilt binaries load"; echo "0 0 prebuilt" >/tmp/b.rc
else
  echo "prebuilt binaries do not load: building"; rm -rf /tmp/b
  # scripts/bench/device_run.sh configures and builds; `true` is its command.
  setsid nohup bash -c '
    t0=$(date +%s); rc=0
    OUT=/tmp scripts/bench/device_run.sh /tmp/b "dflash-coordinator dflash-target-worker \
      dflash-drafter-worker dflashctl" true >/tmp/b.build.log 2>&1 || rc=$?
    echo "$rc $(( $(date +%s) - t0 ))" >/tmp/b.rc' >/dev/null 2>&1 </dev/null &
fi
