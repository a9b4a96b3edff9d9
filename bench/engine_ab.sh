#!/usr/bin/env bash
# A/B of source files in the whole engine: each variant is a directory of replacement files laid out by
# repository path (VARIANT/cpp/kernels/q8_0_matmul.cuh replaces cpp/kernels/q8_0_matmul.cuh), NAME=. the
# working tree as it is. For each round and each variant, in order: the working tree's own copies of every
# replaced file are put back, the variant's laid over them and touched (so that the build sees them as new
# even where a copy is older than the build's outputs), lucebox is rebuilt incrementally in one build
# directory and CMD runs; its output goes to OUT_DIR/NAME_ROUND.log and its last lines are printed. The
# working tree's files are restored at the end (also on failure or interruption). Rounds run the variants
# one after the other (A B A B ...), so that drifts of the machine fall on every variant alike.
#
# Usage: bash bench/engine_ab.sh [--cpu] OUT_DIR ROUNDS NAME=DIR|NAME=. ... -- CMD [ARGS...]
#   --cpu     build without CUDA (an A/B of CPU code, or a dry run of the swaps on a machine without a GPU)
#   e.g. the working tree against a branch's header (the variant made where git is):
#     mkdir -p /tmp/v && git diff --name-only main wip/x | while read -r f; do
#         mkdir -p "/tmp/v/$(dirname "$f")" && git show "wip/x:$f" > "/tmp/v/$f"; done
#     bash bench/engine_ab.sh OUT 2 main=. x=/tmp/v -- python3 bench/bench_spec.py --model /tmp/t27q4.gguf \
#         --device cuda --reps 3 --accept 1,6
# The first build of a fresh build directory is a whole one (about 4 minutes on 16 cores for CUDA); later
# ones recompile what the swapped files reach. Build logs: OUT_DIR/build_NAME_ROUND.log. The build
# directory is $TMPDIR/lucebox-cuda (gpu_suite.sh's; $TMPDIR/lucebox-cpu with --cpu), TMPDIR default /tmp. The
# working tree's files are back at the end, but the installed lucebox is the last variant's build.
# CUDA architectures: LUCEBOX_CUDA_ARCHS (default 90a). Offline machines: LUCEBOX_GGML_SOURCE (README.md).
set -euo pipefail
CUDA=ON
[ "${1:-}" = "--cpu" ] && { CUDA=OFF; shift; }
usage() { sed -n 2,23p "$0" >&2; exit 2; }
[ $# -ge 4 ] || usage
OUT=$1 ROUNDS=$2
shift 2
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "engine_ab.sh: ROUNDS must be a positive integer, got '$ROUNDS'" >&2; exit 2; }
names=() dirs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    [[ "$1" == *=* ]] || { echo "engine_ab.sh: a variant is NAME=DIR, got '$1'" >&2; exit 2; }
    name=${1%%=*} dir=${1#*=}
    [[ "$name" =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "engine_ab.sh: variant name '$name': letters, digits, '.', '_', '-'" >&2; exit 2; }
    [ -d "$dir" ] || { echo "engine_ab.sh: no directory '$dir' (variant $name)" >&2; exit 2; }
    names+=("$name") dirs+=("$(cd "$dir" && pwd)")
    shift
done
[ "${1:-}" = "--" ] && [ $# -ge 2 ] || { echo "engine_ab.sh: no command after --" >&2; usage; }
shift
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
TMP="${TMPDIR:-/tmp}"
BUILD="$TMP/lucebox-$([ "$CUDA" = ON ] && echo cuda || echo cpu)"

# every file a variant replaces, as a path in the repository; the tree's own copies kept aside
files=()
for i in "${!dirs[@]}"; do
    [ "${dirs[i]}" = "$root" ] && continue
    while IFS= read -r -d '' f; do
        rel=${f#"${dirs[i]}"/}
        [ -e "$rel" ] || { echo "engine_ab.sh: $rel (variant ${names[i]}) is not a file of the repository" >&2; exit 2; }
        files+=("$rel")
    done < <(find "${dirs[i]}" -type f -print0)
done
[ ${#files[@]} -eq 0 ] || mapfile -t files < <(printf '%s\n' "${files[@]}" | sort -u)
keep=$(mktemp -d "$TMP/engine_ab_keep.XXXXXX")
for f in ${files[@]+"${files[@]}"}; do mkdir -p "$keep/$(dirname "$f")" && cp -p "$f" "$keep/$f"; done
restore() { for f in ${files[@]+"${files[@]}"}; do cp -p "$keep/$f" "$f"; touch "$f"; done; }
trap 'restore; rm -rf "$keep"' EXIT
t0=$(date +%s)
for round in $(seq 1 "$ROUNDS"); do
    for i in "${!names[@]}"; do
        name=${names[i]}
        restore
        if [ "${dirs[i]}" != "$root" ]; then
            (cd "${dirs[i]}" && find . -type f -print0) | while IFS= read -r -d '' f; do
                cp "${dirs[i]}/${f#./}" "${f#./}" && touch "${f#./}"
            done
        fi
        python3 -m pip install --no-build-isolation --no-deps -q -C build-dir="$BUILD" \
            -C cmake.define.LUCEBOX_CUDA="$CUDA" -C cmake.define.CMAKE_CUDA_ARCHITECTURES="${LUCEBOX_CUDA_ARCHS:-90a}" . \
            > "$OUT/build_${name}_$round.log" 2>&1 || { tail -40 "$OUT/build_${name}_$round.log"; exit 1; }
        echo "=== $name $round (built at $(( $(date +%s) - t0 )) s)"
        "$@" > "$OUT/${name}_$round.log" 2>&1 || echo "(the command exited $?)"
        tail -8 "$OUT/${name}_$round.log"
    done
done
echo "engine_ab.sh: $(( $(date +%s) - t0 )) s; logs in $OUT; the installed lucebox is variant ${names[-1]}'s build"
