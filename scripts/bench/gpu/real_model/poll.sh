#!/usr/bin/env bash
# Polls for up to $1 seconds; every 15 s packs the small results into $OUT/rm.tgz.
limit=${1:-500}; t0=$(date +%s)
pack() {
  mkdir -p /tmp/pack/rm; cd /tmp/rm 2>/dev/null || return 0
  find . -maxdepth 3 -type f -size -3M ! -name 'regen.jsonl*' ! -name 'train-prompts.jsonl' \
    ! -name '*.safetensors' ! -path './state/*' -print0 | tar --null -cf - -T - | tar -xf - -C /tmp/pack/rm
  for f in target.log drafter.log coordinator.log; do [ -f "$f" ] && tail -c 3000000 "$f" >/tmp/pack/rm/$f; done
  for extra in rmref rmw rmw2; do
    [ -d /tmp/$extra ] || continue
    mkdir -p /tmp/pack/$extra; cd /tmp/$extra
    find . -maxdepth 3 -type f -size -3M ! -name 'regen.jsonl*' ! -name 'train-prompts.jsonl' \
      ! -name '*.safetensors' ! -path './state/*' -print0 | tar --null -cf - -T - | tar -xf - -C /tmp/pack/$extra
    cp /tmp/$extra.log /tmp/pack/ 2>/dev/null
  done
  cp /tmp/rm.log /tmp/b.build.log /tmp/b.rc /tmp/pack/ 2>/dev/null
  ls -l /tmp/rm >/tmp/pack/ls.txt 2>/dev/null; wc -l /tmp/rm/regen.jsonl.partial /tmp/rm/regen.jsonl >>/tmp/pack/ls.txt 2>/dev/null
  tar -czf "$OUT/rm.tgz.tmp" -C /tmp/pack . && mv "$OUT/rm.tgz.tmp" "$OUT/rm.tgz"; cd /
}
# The regenerated answers, gzip-compressed, in pieces of 15 MB (the device tool returns files of
# up to 16 MiB): `cat regen.jsonl.gz.* | gunzip` restores them.
regen_pieces() {
  [ -f /tmp/regen.jsonl.gz ] && [ -n "${OUT:-}" ] && [ ! -f "$OUT/regen.jsonl.gz.00" ] &&
    split -b 15000000 -d /tmp/regen.jsonl.gz "$OUT/regen.jsonl.gz."
}
while :; do
  pack; regen_pieces
  [ -f /tmp/rm.done ] && { echo PIPELINE-DONE; break; }
  [ $(( $(date +%s) - t0 )) -ge "$limit" ] && break
  sleep 15
done
echo "deadline in $(( $(cat /tmp/deadline 2>/dev/null || echo 0) - $(date +%s) )) s"
tail -n 25 /tmp/rm.log
