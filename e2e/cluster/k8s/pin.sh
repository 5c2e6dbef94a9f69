#!/usr/bin/env bash
# Re-pins the Go module that builds the cluster binaries to one Kubernetes release (and the
# etcd server that release requires). go.mod is the single place the versions live; this
# script only rewrites it.
# Usage: e2e/cluster/k8s/pin.sh v1.36.3 [kwok-version]
set -euo pipefail
cd "$(dirname "$0")"
k8s_version="$1"
kwok_version="${2:-$(go list -m -f '{{.Version}}' sigs.k8s.io/kwok)}"
staging_version="v0.${k8s_version#v1.}"

go mod edit -require="k8s.io/kubernetes@$k8s_version" -require="sigs.k8s.io/kwok@$kwok_version"
upstream_gomod="$(go mod download -json "k8s.io/kubernetes@$k8s_version" \
  | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
for module in $(grep -oP '^\tk8s\.io/[a-z0-9-]+(?= v0\.0\.0$)' "$upstream_gomod"); do
  go mod edit -replace="$module=$module@$staging_version"
done
etcd_version="$(sed -n 's|^\tgo.etcd.io/etcd/server/v3 \(v[^ ]*\).*|\1|p' "$upstream_gomod")"
go mod edit -require="go.etcd.io/etcd/server/v3@$etcd_version"
go mod tidy
