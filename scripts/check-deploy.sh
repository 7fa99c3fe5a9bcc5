#!/usr/bin/env bash
# Checks the deployment files under deploy/ with whatever validators this machine has:
#   - systemd-analyze verify on the units of deploy/systemd/
#   - docker compose config (or docker-compose config) on deploy/compose/compose.yaml
#   - promtool check config on deploy/prometheus/prometheus.yml
#   - kubernetes-validate --strict on deploy/k8s/ (pip install kubernetes-validate)
#   - JSON and YAML syntax of every file under deploy/ (python3; YAML needs PyYAML)
# A missing tool is reported as skipped, not as a failure; the script exits 1 when a check that
# ran failed, 0 otherwise. The dashboard's metric names are checked by tests/unit/dashboard_test.cc.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
deploy=$root/deploy
failed=() passed=() skipped=()
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ok() { passed+=("$1"); printf '[check-deploy] ok      %s\n' "$1"; }
bad() { failed+=("$1"); printf '[check-deploy] FAILED  %s\n' "$1"; }
skip() { skipped+=("$1: $2"); printf '[check-deploy] skipped %s: %s\n' "$1" "$2"; }

# systemd-analyze verify. It loads the units from a scratch root that holds the system's own
# units (sysinit.target and the like, which every service depends on), ours, and a stand-in
# script for each ExecStart= binary: otherwise a machine without /opt/dflash/bin reports
# "Command ... is not executable" and nothing else is checked. verify exits 0 after "Unknown
# key" and "Failed to parse ... ignoring" warnings, so any output counts as a failure.
check_systemd() {
  if ! command -v systemd-analyze >/dev/null; then
    skip systemd "systemd-analyze not found"
    return
  fi
  local sysdir="" d
  for d in /usr/lib/systemd/system /lib/systemd/system; do
    if [ -f "$d/sysinit.target" ]; then sysdir=$d; break; fi
  done
  if [ -z "$sysdir" ]; then
    skip systemd "no system unit directory with sysinit.target to verify against"
    return
  fi
  local r=$tmp/systemd-root
  mkdir -p "$r/usr/lib/systemd" "$r/etc/systemd/system"
  cp -a "$sysdir" "$r/usr/lib/systemd/system"
  cp "$deploy"/systemd/*.service "$r/etc/systemd/system/"
  local exe
  while read -r exe; do
    mkdir -p "$r$(dirname "$exe")"
    printf '#!/bin/sh\nexit 0\n' >"$r$exe"
    chmod +x "$r$exe"
  done < <(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$deploy"/systemd/*.service | sort -u)
  # Templates are verified through an instance: GPU 0.
  local units=() f name
  for f in "$deploy"/systemd/*.service; do
    name=$(basename "$f")
    units+=("${name/@.service/@0.service}")
  done
  local out rc=0
  out=$(systemd-analyze verify --root="$r" "${units[@]}" 2>&1) || rc=$?
  if [ $rc -eq 0 ] && [ -z "$out" ]; then
    ok "systemd-analyze verify ${units[*]}"
  else
    printf '%s\n' "$out"
    bad "systemd-analyze verify ${units[*]} (exit $rc)"
  fi
}

check_compose() {
  local file=$deploy/compose/compose.yaml cmd=()
  if command -v docker >/dev/null && docker compose version >/dev/null 2>&1; then
    cmd=(docker compose)
  elif command -v docker-compose >/dev/null; then
    cmd=(docker-compose)  # v1 (Debian 12's package) reads the same file
  else
    skip compose "neither the docker compose plugin nor docker-compose is installed"
    return
  fi
  # Grafana's password file must be named (compose.yaml refuses to start without one); a
  # placeholder stands in for the check.
  : >"$tmp/grafana-admin-password"
  if GRAFANA_ADMIN_PASSWORD_FILE=${GRAFANA_ADMIN_PASSWORD_FILE:-$tmp/grafana-admin-password} \
    "${cmd[@]}" -f "$file" config -q; then
    ok "${cmd[*]} -f deploy/compose/compose.yaml config"
  else
    bad "${cmd[*]} -f deploy/compose/compose.yaml config"
  fi
}

check_prometheus() {
  if ! command -v promtool >/dev/null; then
    skip prometheus "promtool not found (Debian: apt-get install prometheus)"
    return
  fi
  if promtool check config "$deploy/prometheus/prometheus.yml"; then
    ok "promtool check config deploy/prometheus/prometheus.yml"
  else
    bad "promtool check config deploy/prometheus/prometheus.yml"
  fi
}

check_k8s() {
  if ! command -v kubernetes-validate >/dev/null; then
    skip k8s "kubernetes-validate not found (pip install kubernetes-validate)"
    return
  fi
  local files=() f
  for f in "$deploy"/k8s/*.yaml; do
    [ "$(basename "$f")" = kustomization.yaml ] || files+=("$f")
  done
  # It prints ERROR lines but exits 0 on some invalid input; its output decides too.
  local out rc=0
  out=$(kubernetes-validate --strict --quiet "${files[@]}" 2>&1) || rc=$?
  if [ $rc -eq 0 ] && ! grep -q 'ERROR' <<<"$out"; then
    ok "kubernetes-validate --strict deploy/k8s/*.yaml"
  else
    printf '%s\n' "$out"
    bad "kubernetes-validate --strict deploy/k8s/*.yaml"
  fi
}

check_syntax() {
  if ! command -v python3 >/dev/null; then
    skip syntax "python3 not found"
    return
  fi
  local f
  for f in $(find "$deploy" -name '*.json' | sort); do
    if python3 -m json.tool "$f" >/dev/null; then ok "JSON ${f#"$root"/}"; else bad "JSON ${f#"$root"/}"; fi
  done
  if ! python3 -c 'import yaml' 2>/dev/null; then
    skip "YAML syntax" "PyYAML not installed"
    return
  fi
  for f in $(find "$deploy" \( -name '*.yaml' -o -name '*.yml' \) | sort); do
    if python3 -c 'import sys, yaml; list(yaml.safe_load_all(open(sys.argv[1])))' "$f"; then
      ok "YAML ${f#"$root"/}"
    else
      bad "YAML ${f#"$root"/}"
    fi
  done
}

check_systemd
check_compose
check_prometheus
check_k8s
check_syntax

echo "[check-deploy] ${#passed[@]} passed, ${#failed[@]} failed, ${#skipped[@]} skipped"
for s in "${skipped[@]}"; do echo "[check-deploy]   skipped: $s"; done
[ ${#failed[@]} -eq 0 ]
