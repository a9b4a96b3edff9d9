#!/usr/bin/env bash
# Builds lucebox (CPU) with its C++ tests into a virtual environment, and upstream llama.cpp at the
# same pin (the llama-cpp-python oracle, the DFlash speculative example), then runs CTest and pytest.
# Usage: bash scripts/test.sh [extra pytest args]
#   LUCEBOX_VENV       virtual environment to use/create (default: .venv in the checkout)
#   LUCEBOX_BUILD_DIR  CMake build directory, reused between runs (default: under ~/.cache/lucebox)
#   LUCEBOX_CACHE_DIR  where the pinned ggml source is cached (default: ~/.cache/lucebox)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
PY="${PYTHON:-python3}"
VENV="${LUCEBOX_VENV:-$ROOT/.venv}"
CACHE="${LUCEBOX_CACHE_DIR:-$HOME/.cache/lucebox}"
BUILD_DIR="${LUCEBOX_BUILD_DIR:-$CACHE/build/test-$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "scikit-build-core>=0.10" "pybind11>=2.13" "cmake>=3.21" "ninja>=1.11"
start=$(date +%s)
"$VENV/bin/python" -m pip install --no-build-isolation ".[test,server]" \
    -C build-dir="$BUILD_DIR" -C cmake.define.LUCEBOX_BUILD_TESTS=ON
echo "build+install: $(( $(date +%s) - start )) s"
# upstream llama.cpp at the same pin, the oracle of tests/integration (built once, cached)
bash scripts/install_oracle.sh "$VENV/bin/python"
# upstream llama.cpp's own DFlash speculative decoding (its llama-speculative-simple example, CPU,
# same pin), the oracle of tests/integration/test_upstream_dflash.py (built once, cached)
start=$(date +%s)
LUCEBOX_UPSTREAM_SPEC="$(PATH="$VENV/bin:$PATH" bash scripts/build_upstream_spec.sh "$VENV/bin/python")"
export LUCEBOX_UPSTREAM_SPEC
echo "upstream DFlash example: $LUCEBOX_UPSTREAM_SPEC ($(( $(date +%s) - start )) s)"
PATH="$VENV/bin:$PATH" ctest --test-dir "$BUILD_DIR" --output-on-failure
cd "$ROOT"
"$VENV/bin/python" -m pytest "$@"
