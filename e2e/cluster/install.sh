#!/usr/bin/env bash
# Installs what the local e2e cluster runs and prints one directory holding all of it:
#  - kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok, etcd (k8s/go.mod
#    pins them) and prometheus, promtool (prometheus/go.mod): built from the Go module proxy
#    once, cached in ~/.cache/specfleet/bin/ keyed by each module's go.mod and go.sum;
#  - kwok-stages.yaml: kwok's own default stages (nodes Ready with leases, pods Ready);
#  - alertmanager: Debian's prometheus-alertmanager (hack/tools.sh alertmanager).
# Usage: e2e/cluster/install.sh   (idempotent; a warm run takes a fraction of a second)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${SPECFLEET_CACHE:-$HOME/.cache/specfleet}"

log() { echo "install: $*" >&2; }

# timed WHAT COMMAND...: runs COMMAND, saying that WHAT started, that it is still going once a
# minute (go build is silent for minutes), and how long it took.
timed() {
  local what="$1" start=$SECONDS ticker rc=0
  shift
  log "$what"
  (
    trap 'kill "$nap" 2>/dev/null; exit 0' TERM
    while :; do
      sleep 60 &
      nap=$!
      wait "$nap"
      log "  still $what ($(elapsed "$start"))"
    done
  ) >/dev/null &
  ticker=$!
  "$@" || rc=$?
  kill "$ticker" && wait "$ticker" 2>/dev/null || true
  if [ "$rc" -ne 0 ]; then
    log "  failed after $(elapsed "$start"): $what"
    return "$rc"
  fi
  log "  done in $(elapsed "$start")"
}

elapsed() {
  local s=$((SECONDS - $1))
  printf '%dm%02ds' $((s / 60)) $((s % 60))
}

# module_version DIR MODULE: the version DIR/go.mod requires of MODULE.
module_version() {
  sed -n "s|^\t$2 \(v[^ ]*\).*|\1|p" "$here/$1/go.mod"
}

module_key() {
  cat "$here/$1/go.mod" "$here/$1/go.sum" | sha256sum | cut -c1-12
}

k8s_ldflags() {
  local version major minor flags=()
  version="$(module_version k8s k8s.io/kubernetes)"
  IFS=. read -r major minor _ <<<"${version#v}"
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    flags+=("-X $pkg.gitVersion=$version" "-X $pkg.gitMajor=$major" "-X $pkg.gitMinor=$minor"
      "-X $pkg.gitTreeState=clean")
  done
  echo "-s -w ${flags[*]}"
}

# Prometheus's Go module v0.309.1 is Prometheus 3.9.1.
prometheus_ldflags() {
  local number patch
  IFS=. read -r _ number patch <<<"$(module_version prometheus github.com/prometheus/prometheus)"
  local version="$((number / 100)).$((number % 100)).$patch"
  echo "-s -w -X github.com/prometheus/common/version.Version=$version"
}

# build_module DIR LABEL TAGS LDFLAGS [PACKAGE...]: builds every `tool` of DIR/go.mod and the
# given packages of DIR once; prints the directory holding the binaries.
build_module() {
  local dir="$cache/bin/$2-$(module_key "$1")" tmp
  if [ ! -d "$dir" ]; then
    tmp="$(mktemp -d "$cache/bin/.build.XXXXXX")"
    timed "building $2 ($(tools "$1" "${@:5}")) from the Go module proxy, once, into $dir" \
      build_tools "$1" "$tmp" "$3" "$4" "${@:5}"
    mv "$tmp" "$dir"
  fi
  echo "$dir"
}

# build_tools DIR OUT TAGS LDFLAGS [PACKAGE...]
build_tools() {
  (cd "$here/$1" && GOFLAGS=-buildvcs=false go build -trimpath -tags "$3" -ldflags "$4" \
    -o "$2/" tool "${@:5}")
}

# tools DIR [PACKAGE...]: the names of the binaries DIR/go.mod's tools and PACKAGEs build.
tools() {
  local names
  names="$(sed -n 's|^tool \([^(].*\)|\1|p; /^tool (/,/^)/s|^\t\([^ )]*\)$|\1|p' "$here/$1/go.mod")"
  for name in $names "${@:2}"; do basename "$name"; done | paste -sd, - | sed 's/,/, /g'
}

# kwok_stages FILE: kwok's "fast" stages, from the kwok module k8s/go.mod pins.
kwok_stages() {
  local src
  src="$(cd "$here/k8s" && go mod download -json sigs.k8s.io/kwok \
    | sed -n 's/.*"Dir": "\(.*\)",*/\1/p')"
  for stage in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
    pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
    echo "---"
    cat "$src/kustomize/stage/$stage.yaml"
  done >"$1.tmp"
  mv "$1.tmp" "$1"
}

main() {
  local alertmanager
  alertmanager="$("$here/../../hack/tools.sh" alertmanager)"
  mkdir -p "$cache/bin"
  exec 9>"$cache/bin/.lock"
  flock 9
  local k8s prometheus bin
  k8s="$(build_module k8s "k8s-$(module_version k8s k8s.io/kubernetes)" "" "$(k8s_ldflags)" \
    ./etcd)"
  prometheus="$(build_module prometheus \
    "prometheus-$(module_version prometheus github.com/prometheus/prometheus)" \
    remove_all_sd,enable_kubernetes_sd "$(prometheus_ldflags)")"
  [ -s "$k8s/kwok-stages.yaml" ] \
    || timed "reading kwok's default stages" kwok_stages "$k8s/kwok-stages.yaml"
  bin="$cache/bin/e2e-cluster-$(basename "$k8s")-$(basename "$prometheus")"
  if [ ! -d "$bin" ]; then
    mkdir -p "$bin.tmp"
    ln -sf "$k8s"/* "$prometheus"/* "$bin.tmp/"
    ln -sf "$alertmanager/alertmanager" "$bin.tmp/alertmanager"
    mv "$bin.tmp" "$bin"
  fi
  echo "$bin"
}

main "$@"
exit
