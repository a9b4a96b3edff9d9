#!/usr/bin/env bash
# A/B of kernel headers with one of the standalone probes: builds PROBE once for each variant, with the
# variant's directory searched before cpp/kernels (so its copies of the headers replace the
# repository's), then runs the builds one after the other, ROUNDS times, so that drifts of the machine
# fall on every variant alike. A variant is NAME=DIR; NAME=. is the repository's own headers; NAME=-DX=1
# (comma-separated -D flags) is the repository's headers compiled with those macros (a probe knob).
#     bash bench/probes/ab.sh PROBE.cu ROUNDS NAME=DIR|NAME=-DMACRO=V[,-D...]... [-- PROBE ARGS]
# e.g. the working tree against a branch's recurrence kernel (the copy made where git is):
#     mkdir -p /tmp/ab_new && git show BRANCH:cpp/kernels/delta_net_step.cuh > /tmp/ab_new/delta_net_step.cuh
#     bash bench/probes/ab.sh bench/probes/delta_net_bench.cu 2 main=. new=/tmp/ab_new
# The product probe's tables summed per variant (min over rounds): python3 bench/probes/ab_sums.py OUTPUT.
# Builds go to $TMPDIR/ab_builds (TMPDIR default /tmp); each run's output is printed under "=== NAME ROUND".
# NVCC_ARCH (default 90a) picks the architecture.
# --test "SOURCES" (first): also builds SOURCES (a test and what it links, e.g. "tests/cpp/test_q8_0_matmul.cu
# cpp/kernels/weight_tiles.cpp") with each variant's headers and flags, runs those builds side by side
# before any timing, and times only the variants whose test exits 0 (a knob's times mean nothing if
# its products are wrong).
set -euo pipefail
test_src=()
if [ "${1:-}" = "--test" ]; then read -r -a test_src <<< "$2"; shift 2; fi
[ $# -ge 3 ] || { sed -n 2,17p "$0"; exit 2; }
probe=$1 rounds=$2
shift 2
names=() dirs=() args=()
while [ $# -gt 0 ]; do
    if [ "$1" = "--" ]; then shift; args=("$@"); break; fi
    [[ "$1" == *=* ]] || { echo "ab.sh: a variant is NAME=DIR, got '$1'" >&2; exit 2; }
    names+=("${1%%=*}") dirs+=("${1#*=}")
    [[ "${dirs[-1]}" == -D* ]] || [ -d "${dirs[-1]}" ] || { echo "ab.sh: no directory '${dirs[-1]}' (variant ${names[-1]})" >&2; exit 2; }
    shift
done
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${TMPDIR:-/tmp}/ab_builds arch=${NVCC_ARCH:-90a}
mkdir -p "$out"
pids=()
for i in "${!names[@]}"; do
    inc=()
    if [[ "${dirs[i]}" == -D* ]]; then
        IFS=, read -r -a inc <<< "${dirs[i]}"
    elif [ "${dirs[i]}" != "." ]; then
        inc=(-I"$(cd "${dirs[i]}" && pwd)")
    fi
    nvcc -O3 -std=c++17 -lineinfo -gencode "arch=compute_$arch,code=sm_$arch" "${inc[@]}" -I"$root/cpp/kernels" \
        -I"$root/tests/cpp" -o "$out/${names[i]}" "$probe" &
    pids+=($!)
    if [ ${#test_src[@]} -gt 0 ]; then
        nvcc -O3 -std=c++17 -gencode "arch=compute_$arch,code=sm_$arch" "${inc[@]}" -I"$root/cpp/kernels" \
            -I"$root/tests/cpp" -o "$out/${names[i]}_test" "${test_src[@]}" &
        pids+=($!)
    fi
done
for pid in "${pids[@]}"; do wait "$pid" || { echo "ab.sh: a build failed" >&2; exit 1; }; done
timed=("${names[@]}")
if [ ${#test_src[@]} -gt 0 ]; then
    test_pids=()
    for name in "${names[@]}"; do "$out/${name}_test" > "$out/${name}_test.log" 2>&1 & test_pids+=($!); done
    timed=()
    for i in "${!names[@]}"; do
        if wait "${test_pids[i]}"; then timed+=("${names[i]}"); r=passed; else r=FAILED; fi
        echo "=== test ${names[i]}: $r ($(tail -1 "$out/${names[i]}_test.log"); all of it: $out/${names[i]}_test.log)"
    done
fi
for r in $(seq 1 "$rounds"); do
    for name in "${timed[@]}"; do
        echo "=== $name $r"
        "$out/$name" ${args[@]+"${args[@]}"} || echo "ab.sh: $name exited with status $?"
    done
done
