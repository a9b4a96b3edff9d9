#!/usr/bin/env bash
# Builds upstream llama.cpp's speculative decoding example, `llama-speculative-simple`, for the
# CPU from the pinned, hash-checked sdist (ggml/pin.json; its vendor/llama.cpp, unpatched: our
# ggml patches only add things, and this is upstream's behaviour as shipped) and prints the
# binary's path on stdout. It is the oracle of tests/integration/test_upstream_dflash.py (lucebox's
# chain speculation vs upstream's own `--spec-type draft-dflash`) and the other side of
# bench/bench_upstream_dflash.py. Nothing from upstream is copied into the checkout.
#
# Usage: bash scripts/build_upstream_spec.sh [--find] [PYTHON]
#   --find             print the cached binary's path if it is built (exit 1 otherwise), never build
#   PYTHON             interpreter for ggml/fetch.py and the pin (default: $PYTHON or python3)
#   LUCEBOX_CACHE_DIR  cache outside the checkout (default: ~/.cache/lucebox); holds the archive
#                      (downloaded by ggml/fetch.py) and the binary under upstream-spec/<key>/
#   LUCEBOX_ORACLE_JOBS  parallel compile jobs (default: nproc)
#   cmake (>= 3.21) and a C++17 compiler on PATH; ninja is used when present
#
# Run 1: downloads the archive if needed, extracts vendor/llama.cpp into a temporary directory,
# configures a CPU-only, static build and builds that one target (ggml, libllama, libllama-common,
# the example: about 5 minutes on 2 cores), keeps only the binary, removes the sources and build
# tree. Later runs: print the cached path (milliseconds).
set -euo pipefail

FIND=0
if [ "${1:-}" = "--find" ]; then
    FIND=1
    shift
fi
if [ $# -gt 1 ]; then
    echo "usage: $0 [--find] [PYTHON]" >&2
    exit 2
fi
# shellcheck source=pinned_source.sh
. "$(dirname "$0")/pinned_source.sh"
pinned_setup build_upstream_spec "${1:-${PYTHON:-python3}}"
VERSION="$(pin version)"
ARCHIVE_NAME="$(pin archive)"
SUBTREE="$(pin subtree)"
SHA256="$(pin sha256)"

TARGET=llama-speculative-simple
# What we build: upstream's CMake project with only what the example needs, for the CPU.
#   BUILD_SHARED_LIBS=OFF      one self-contained binary (libggml, libllama, libllama-common static)
#   LLAMA_BUILD_COMMON/EXAMPLES=ON  the example and its libllama-common; everything else off, and
#                              only the one target is built (`--target`)
#   GGML_NATIVE=ON             tuned to this CPU, as the oracle wheel (scripts/install_oracle.sh);
#                              hence the CPU flags in the cache key below
#   AMX off, the same flags as install_oracle.sh's CMake hook: with GGML_NATIVE on an AMX CPU,
#   upstream runs its matmuls on AMX tiles in the OpenMP workers, and some sandboxed machines (the
#   2-core development VM, 2026-12) kill those threads with SIGILL at the first tile instruction.
#   GCC and Clang let an explicit -mno-* win over what -march=native implies, in any order.
UPSTREAM_CMAKE_ARGS="-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DGGML_CCACHE=OFF -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF"
NO_AMX=""
case "$(uname -m)" in
    x86_64|amd64|AMD64) NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" ;;
esac

cc_version="$( (${CC:-cc} --version 2>/dev/null || true) | head -n1)"
cxx_version="$( (${CXX:-c++} --version 2>/dev/null || true) | head -n1)"
cpu_flags="$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null || uname -m)"
KEY="$(printf '%s\n' "$SHA256" "$TARGET" "$UPSTREAM_CMAKE_ARGS" "$NO_AMX" "$(uname -m)" "$cc_version" "$cxx_version" "$cpu_flags" \
    | sha256sum | cut -c1-16)"
DIR="$CACHE/upstream-spec/$TARGET-$VERSION-${SHA256:0:8}-$KEY"
BIN="$DIR/$TARGET"

if [ -x "$BIN" ]; then
    echo "$BIN"
    exit 0
fi
if [ "$FIND" = 1 ]; then
    log "not built yet (expected $BIN); run: bash scripts/build_upstream_spec.sh"
    exit 1
fi

command -v cmake >/dev/null 2>&1 || { echo "build_upstream_spec: cmake not found on PATH" >&2; exit 2; }
mkdir -p "$CACHE/upstream-spec"
# One builder at a time per cache (a second concurrent run waits, then finds the binary).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE/upstream-spec/.lock"
    flock 9
fi
if [ -x "$BIN" ]; then
    echo "$BIN"
    exit 0
fi

# 1. The pinned archive, as ggml/fetch.py caches it.
pinned_archive

# 2. Extract vendor/llama.cpp, configure, build the one target, keep the binary.
jobs="${LUCEBOX_ORACLE_JOBS:-$(nproc 2>/dev/null || echo 2)}"
tmp="$(mktemp -d "$CACHE/upstream-spec/.build-XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
log "building upstream $TARGET (llama.cpp of $ARCHIVE_NAME, CPU, $jobs jobs); this takes a few minutes once"
start=$(date +%s)
prefix="${ARCHIVE_NAME%.tar.gz}/$SUBTREE"
strip=$(( $(printf '%s' "$prefix" | tr -cd '/' | wc -c) + 1 ))
mkdir -p "$tmp/src"
tar -xzf "$ARCHIVE" -C "$tmp/src" --strip-components="$strip" "$prefix"
generator=()
if command -v ninja >/dev/null 2>&1; then
    generator=(-G Ninja)
fi
# shellcheck disable=SC2086  # the argument lists are word lists
cmake -S "$tmp/src" -B "$tmp/build" "${generator[@]}" $UPSTREAM_CMAKE_ARGS \
    -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" > "$tmp/configure.log" 2>&1 \
    || { tail -n 40 "$tmp/configure.log" >&2; echo "build_upstream_spec: cmake configure failed" >&2; exit 1; }
cmake --build "$tmp/build" --target "$TARGET" --parallel "$jobs" > "$tmp/build.log" 2>&1 \
    || { tail -n 40 "$tmp/build.log" >&2; echo "build_upstream_spec: build failed" >&2; exit 1; }
mkdir -p "$tmp/out"
cp "$tmp/build/bin/$TARGET" "$tmp/out/$TARGET"
"$tmp/out/$TARGET" --version > "$tmp/out/version.txt" 2>&1 || true
printf 'archive %s (sha256 %s), subtree %s\ncmake %s -DCMAKE_C_FLAGS="%s" -DCMAKE_CXX_FLAGS="%s"\ncmake --build . --target %s\n' \
    "$ARCHIVE_NAME" "$SHA256" "$SUBTREE" "$UPSTREAM_CMAKE_ARGS" "$NO_AMX" "$NO_AMX" "$TARGET" > "$tmp/out/BUILD.txt"
rm -rf "$DIR"
mv "$tmp/out" "$DIR"
log "built in $(( $(date +%s) - start )) s: $BIN"
echo "$BIN"
