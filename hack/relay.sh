#!/usr/bin/env bash
# Builds the gateway's native pump (relay/, Rust via PyO3) into a wheel with maturin, under
# ~/.cache/specfleet/relay-<key>/ (hack/lib/cached-venv.sh), keyed by maturin's pin and the
# crate's sources, and prints `wheel=<path>`. Crates come from crates.io; cargo's own cache keeps
# them. Without the wheel the gateway relays every chunk in Python, and says so when it starts.
set -euo pipefail

MATURIN_VERSION=1.16.0
export PATH="$HOME/.cargo/bin:$PATH"  # rustup's cargo, also where a login shell was not read
command -v cargo >/dev/null || { echo "relay: cargo not found (install Rust with rustup)" >&2; exit 1; }
TOOL=relay
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=lib/cached-venv.sh
source "$ROOT/hack/lib/cached-venv.sh"

install_relay() {
  say "[1/2] installing maturin==$MATURIN_VERSION"
  "$DIR/venv/bin/pip" install -q "maturin==$MATURIN_VERSION" >&2
  say "[2/2] building the pump (cargo, release)"
  CARGO_TARGET_DIR="$CACHE/relay-target" "$DIR/venv/bin/maturin" build --release --locked \
    --quiet --manifest-path "$ROOT/relay/Cargo.toml" --out "$DIR/wheels" >&2
}

SOURCES="$(cd "$ROOT/relay" && cat Cargo.toml Cargo.lock pyproject.toml src/*.rs | sha256sum)"
DIR="$(venv_dir relay "$MATURIN_VERSION $SOURCES" install_relay)"
build_once venv_built build_venv "the native pump" "about a minute" install_relay
echo "wheel=$(ls "$DIR"/wheels/specfleet_relay-*.whl)"
