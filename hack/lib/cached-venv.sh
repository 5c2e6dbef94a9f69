# Sourced by hack/real-engine.sh and hack/guidellm.sh: a tool specfleet runs but never depends on,
# in a venv of its own under ~/.cache/specfleet/<prefix>-<key>/. <key> hashes the pins and the
# install steps as bash reads them (comments and layout do not count), so an unchanged install
# keeps its directory. The venv counts as built only when its marker (written last) exists; one
# build of a tool at a time, the others wait for it. The sourcing script sets TOOL (the name in
# its messages and its lock) and DIR (from venv_dir).

CACHE="${SPECFLEET_CACHE:-$HOME/.cache/specfleet}"
PYTHON="${PYTHON:-python3}"

say() { echo "$TOOL: $*" >&2; }

# venv_dir PREFIX PINS INSTALL: where the venv that the function INSTALL builds with PINS lives.
venv_dir() {
  echo "$CACHE/$1-$(printf '%s\n' "$2" "$(declare -f "$3")" | sha256sum | cut -c1-12)"
}

venv_built() { [ -f "$DIR/.complete" ]; }

# build_once BUILT BUILD...: runs BUILD unless BUILT holds, under the tool's lock, asking BUILT
# again once the lock is held (the build waited for may have made it).
build_once() {
  local built=$1
  shift
  "$built" && return
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.$TOOL.lock"
  flock -n 9 || { say "waiting for another build to finish"; flock 9; }
  "$built" || "$@"
}

# build_venv WHAT HOW_LONG INSTALL: a new venv in $DIR, INSTALL run in it, then the marker.
build_venv() {
  local started=$SECONDS
  say "building $1 in $DIR (once; $2)"
  rm -rf "$DIR"
  mkdir -p "$DIR"
  "$PYTHON" -m venv "$DIR/venv"
  export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off
  "$3"
  touch "$DIR/.complete"
  say "built in $((SECONDS - started)) s"
}

# pip_progress: of pip's output, the packages it collects and installs and its errors, on stderr.
pip_progress() {
  grep --line-buffered -E '^(Collecting|Installing|ERROR)' | sed -u -E 's/ \(from .*//; s/^/  /' >&2
}
