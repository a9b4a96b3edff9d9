#!/usr/bin/env bash
# Installs upstream llama.cpp's Python binding (llama-cpp-python, the version pinned in
# ggml/pin.json) into the environment of the given interpreter: the independent oracle used by
# tests/integration. CPU only, built from the pinned, hash-checked sdist, never from a binary of
# unknown origin.
#
# Usage: bash scripts/install_oracle.sh VENV_PYTHON
#   LUCEBOX_CACHE_DIR  cache outside the checkout (default: ~/.cache/lucebox); holds the archive
#                      (downloaded by ggml/fetch.py) and the built wheel under wheels/<key>/
#   LUCEBOX_ORACLE_JOBS  parallel compile jobs (default: nproc)
#
# Run 1: downloads the archive if needed, builds a wheel (several minutes on 2 cores), installs it.
# Later runs: installs the cached wheel (seconds), or do nothing if the pinned version is already
# installed in that environment.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 VENV_PYTHON" >&2
    exit 2
fi
# shellcheck source=pinned_source.sh
. "$(dirname "$0")/pinned_source.sh"
pinned_setup install_oracle "$1"
PACKAGE="$(pin package)"
VERSION="$(pin version)"
ARCHIVE_NAME="$(pin archive)"
SHA256="$(pin sha256)"

# 0. Already installed in that environment: nothing to do.
installed="$("$PY" -c "import importlib.metadata as m
try: print(m.version('$PACKAGE'))
except m.PackageNotFoundError: pass" 2>/dev/null || true)"
if [ "$installed" = "$VERSION" ]; then
    log "$PACKAGE==$VERSION already installed for $PY"
    exit 0
fi

# What we build: libggml + libllama for the CPU, nothing else.
#   LLAVA_BUILD=OFF            no libmtmd (multimodal), which the oracle never loads
#   LLAMA_BUILD_TESTS/TOOLS/EXAMPLES/SERVER=OFF (already the default in a subproject; explicit)
#   GGML_BUILD_TESTS/EXAMPLES=OFF, LLAMA_OPENSSL=OFF, LLAMA_CURL=OFF
#   The sdist's top CMakeLists forces LLAMA_BUILD_COMMON=ON (libllama-common + cpp-httplib, about
#   as much code as libllama itself, unused by the Python binding). A CMake project hook, run
#   right after llama.cpp's own project() call, turns it back off; written by us into the cache.
#   GGML_NATIVE keeps its default (on): the wheel is then only valid on this CPU, hence the
#   CPU flags in the cache key below.
HOOK_DIR="$CACHE/oracle"
HOOK="$HOOK_DIR/no-common.cmake"
#   AMX off: with GGML_NATIVE on an AMX CPU, upstream runs its matmuls on AMX tiles in the OpenMP
#   workers, and some sandboxed machines (the 2-core development VM, 2026-12) kill those threads
#   with SIGILL at the first tile instruction; the oracle needs no AMX.
HOOK_TEXT='set(LLAMA_BUILD_COMMON OFF CACHE BOOL "lucebox oracle: libllama only" FORCE)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64" AND CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
    string(APPEND CMAKE_C_FLAGS " -mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
    string(APPEND CMAKE_CXX_FLAGS " -mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
endif()'
ORACLE_CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF"

cc_version="$( (${CC:-cc} --version 2>/dev/null || true) | head -n1)"
cpu_flags="$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null || uname -m)"
KEY="$(printf '%s\n' "$SHA256" "$ORACLE_CMAKE_ARGS" "$HOOK_TEXT" "${CMAKE_ARGS:-}" "$(uname -m)" "$cc_version" "$cpu_flags" \
    | sha256sum | cut -c1-16)"
WHEEL_DIR="$CACHE/wheels/$PACKAGE-$VERSION-${SHA256:0:8}-$KEY"

mkdir -p "$CACHE/wheels" "$HOOK_DIR"
# One builder at a time per cache (a second concurrent run waits, then finds the wheel).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE/wheels/.oracle.lock"
    flock 9
fi

wheel="$(ls "$WHEEL_DIR"/*.whl 2>/dev/null | head -n1 || true)"
if [ -z "$wheel" ]; then
    # 1. The pinned archive, as ggml/fetch.py caches it.
    "$PY" "$ROOT/ggml/fetch.py" >/dev/null
    pinned_archive

    # 2. Build the wheel once into the cache.
    printf '%s\n' "$HOOK_TEXT" > "$HOOK"
    jobs="${LUCEBOX_ORACLE_JOBS:-$(nproc 2>/dev/null || echo 2)}"
    tmp="$(mktemp -d "$CACHE/wheels/.build-XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    log "building $PACKAGE==$VERSION (CPU, $jobs jobs) from $ARCHIVE; this takes a few minutes once"
    start=$(date +%s)
    CMAKE_ARGS="$ORACLE_CMAKE_ARGS -DCMAKE_PROJECT_llama.cpp_INCLUDE=$HOOK ${CMAKE_ARGS:-}" \
    CMAKE_BUILD_PARALLEL_LEVEL="$jobs" \
        "$PY" -m pip wheel --no-deps --no-cache-dir -q -w "$tmp" "$ARCHIVE"
    log "built in $(( $(date +%s) - start )) s"
    rm -rf "$WHEEL_DIR"
    mv "$tmp" "$WHEEL_DIR"
    trap - EXIT
    wheel="$(ls "$WHEEL_DIR"/*.whl | head -n1)"
fi

# 3. Install the cached wheel (its small pure-Python dependencies come from the index as usual).
start=$(date +%s)
"$PY" -m pip install -q "$wheel"
"$PY" -c "import llama_cpp; assert llama_cpp.__version__ == '$VERSION', llama_cpp.__version__"
log "installed $(basename "$wheel") in $(( $(date +%s) - start )) s"
