#!/usr/bin/env bash
# Builds guidellm, the load generator of an experiment's capacity phase, in its own venv under
# ~/.cache/specfleet/guidellm-<key>/ (<key> hashes this script and the pins), and prints
# `guidellm=<path of the guidellm command>`. Built once; it counts as built only when its marker
# (written last) exists. guidellm is never a dependency of specfleet: the operator image stays lean.
set -euo pipefail

GUIDELLM_VERSION=0.8.1
# guidellm needs torch (its data loader); the same pin as hack/real-engine.sh so that pip's cache
# serves the one download to both.
TORCH_VERSION=2.13.0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${SPECFLEET_CACHE:-$HOME/.cache/specfleet}"
PYTHON="${PYTHON:-python3}"
KEY="$(cat "$HERE/guidellm.sh" <(echo "$GUIDELLM_VERSION $TORCH_VERSION") | sha256sum | cut -c1-12)"
DIR="$CACHE/guidellm-$KEY"

say() { echo "guidellm: $*" >&2; }

build() {
  started=$SECONDS
  say "building guidellm $GUIDELLM_VERSION in $DIR (once; a few minutes, torch is ~4 GB)"
  rm -rf "$DIR"
  mkdir -p "$DIR"
  "$PYTHON" -m venv "$DIR/venv"
  export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off
  PIP=("$DIR/venv/bin/pip")

  say "[1/2] upgrading pip"
  "${PIP[@]}" install -q -U pip >&2

  say "[2/2] installing guidellm==$GUIDELLM_VERSION with torch==$TORCH_VERSION"
  "${PIP[@]}" install "guidellm==$GUIDELLM_VERSION" "torch==$TORCH_VERSION" 2>&1 |
    grep --line-buffered -E '^(Collecting|Installing|ERROR)' | sed -u -E 's/ \(from .*//; s/^/  /' >&2
  "$DIR/venv/bin/guidellm" --help >/dev/null

  touch "$DIR/.complete"
  say "built in $((SECONDS - started)) s"
}

if [ ! -f "$DIR/.complete" ]; then
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.guidellm.lock"
  flock -n 9 || { say "waiting for another build to finish"; flock 9; }
  [ -f "$DIR/.complete" ] || build
fi
echo "guidellm=$DIR/venv/bin/guidellm"
