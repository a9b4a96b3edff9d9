# Sourced by bench/gpu_suite.sh and bench/multi_gpu_suite.sh (after they set OUT): the repository
# root as the working directory, ggml's pinned source (ROOT), and lucebox installed for CUDA with its
# C++ tests (unless the caller set SUITE_BUILD_TESTS=OFF), built in $TMPDIR/lucebox-cuda (log:
# $OUT/build.log), with the extra `-C` settings the caller put in SUITE_BUILD_ARGS. Sets ARCHS
# (LUCEBOX_CUDA_ARCHS, default 90a), TMP ($TMPDIR, default /tmp), t0 (the start, seconds). Offline
# machines: LUCEBOX_GGML_SOURCE (see README.md).
ARCHS="${LUCEBOX_CUDA_ARCHS:-90a}"
TMP="${TMPDIR:-/tmp}"
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)  # (absolute: the working directory changes next)
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1
t0=$(date +%s)
ROOT=$(python3 ggml/fetch.py) || exit 1
python3 -m pip install --no-build-isolation --no-deps -q -C build-dir="$TMP/lucebox-cuda" \
    -C cmake.define.LUCEBOX_CUDA=ON -C cmake.define.CMAKE_CUDA_ARCHITECTURES="$ARCHS" \
    -C cmake.define.LUCEBOX_BUILD_TESTS="${SUITE_BUILD_TESTS:-ON}" ${SUITE_BUILD_ARGS[@]+"${SUITE_BUILD_ARGS[@]}"} . \
    > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
echo "lucebox build: $(( $(date +%s) - t0 )) s"
