#!/usr/bin/env bash
# Builds guidellm, the load generator of an experiment's capacity phase, in its own venv under
# ~/.cache/specfleet/guidellm-<key>/ (hack/lib/cached-venv.sh), and prints
# `guidellm=<path of the guidellm command>`. guidellm is never a dependency of specfleet: the
# operator image stays lean.
set -euo pipefail

GUIDELLM_VERSION=0.8.1
# guidellm needs torch (its data loader); the same pin as hack/real-engine.sh so that pip's cache
# serves the one download to both.
TORCH_VERSION=2.13.0
TOOL=guidellm
# shellcheck source=lib/cached-venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cached-venv.sh"

install_guidellm() {
  say "[1/2] upgrading pip"
  "$DIR/venv/bin/pip" install -q -U pip >&2

  say "[2/2] installing guidellm==$GUIDELLM_VERSION with torch==$TORCH_VERSION"
  "$DIR/venv/bin/pip" install "guidellm==$GUIDELLM_VERSION" "torch==$TORCH_VERSION" 2>&1 |
    pip_progress
  "$DIR/venv/bin/guidellm" --help >/dev/null
}

DIR="$(venv_dir guidellm "$GUIDELLM_VERSION $TORCH_VERSION" install_guidellm)"
build_once venv_built \
  build_venv "guidellm $GUIDELLM_VERSION" "a few minutes, torch is ~4 GB" install_guidellm
echo "guidellm=$DIR/venv/bin/guidellm"
