#!/usr/bin/env bash
# Installs the command-line tools the tests need into ~/.cache/specfleet/bin/<tool>-<version>/
# and prints the bin dir: helm built from the Go module proxy (nothing here downloads release
# binaries); alertmanager is Debian's prometheus-alertmanager, installed if missing (its own
# system service is never started: the tests run their own processes).
# Usage: hack/tools.sh helm|alertmanager
set -euo pipefail
HELM_VERSION=v3.22.0
CACHE="${SPECFLEET_CACHE:-$HOME/.cache/specfleet}"

install_helm() {
  local dir="$CACHE/bin/helm-$HELM_VERSION"
  if [ ! -x "$dir/helm" ]; then
    echo "building helm $HELM_VERSION from the Go module proxy (once; cached in $dir)" >&2
    GOFLAGS=-buildvcs=false GOBIN="$dir" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
  fi
  echo "$dir"
}

install_alertmanager() {
  local dir="$CACHE/bin/alertmanager-debian"
  if ! dpkg-query -W -f '${Status}' prometheus-alertmanager 2>/dev/null \
    | grep -q '^install ok installed$'; then
    if [ "$(id -u)" -ne 0 ]; then
      echo "as root: apt-get install --no-install-recommends prometheus-alertmanager" >&2
      exit 1
    fi
    echo "installing Debian's prometheus-alertmanager (once)" >&2
    with_services_blocked apt_install prometheus-alertmanager
    if [ -d /run/systemd/system ]; then
      systemctl disable --now prometheus-alertmanager >/dev/null 2>&1 || true
    fi
  fi
  mkdir -p "$dir"
  ln -sf /usr/bin/prometheus-alertmanager "$dir/alertmanager"
  echo "$dir"
}

apt_install() {
  apt-get install -y -q --no-install-recommends "$@" >&2 || {
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends "$@" >&2
  }
}

# policy-rc.d (exit 101) tells Debian's maintainer scripts not to start services.
with_services_blocked() {
  local policy=/usr/sbin/policy-rc.d
  if [ -e "$policy" ]; then
    "$@"
    return
  fi
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod +x "$policy"
  "$@" || { rm -f "$policy"; return 1; }
  rm -f "$policy"
}

case "${1:-}" in
  helm) install_helm ;;
  alertmanager) install_alertmanager ;;
  *) echo "usage: $0 helm|alertmanager" >&2; exit 2 ;;
esac
