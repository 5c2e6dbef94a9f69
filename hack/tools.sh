#!/usr/bin/env bash
# Installs the command-line tools the tests need into ~/.cache/specfleet/bin/<tool>-<version>/,
# built from the Go module proxy (nothing here downloads release binaries), and prints the bin dir.
# Usage: hack/tools.sh helm
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

case "${1:-}" in
  helm) install_helm ;;
  *) echo "usage: $0 helm" >&2; exit 2 ;;
esac
