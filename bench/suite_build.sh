# Sourced by bench/gpu_suite.sh and bench/multi_gpu_suite.sh (after they set OUT): the repository
# root as the working directory, ggml's pinned source (ROOT), and lucebox installed for CUDA with its
# C++ tests (unless the caller set SUITE_BUILD_TESTS=OFF), built in $TMPDIR/lucebox-cuda (log:
# $OUT/build.log), with the extra `-C` settings the caller put in SUITE_BUILD_ARGS. Sets ARCHS
# (LUCEBOX_CUDA_ARCHS, default 90a), TMP ($TMPDIR, default /tmp), t0 (the start, seconds). Offline
# machines: LUCEBOX_GGML_SOURCE (see README.md).
# SUITE_PREBUILT=DIR (with SUITE_BUILD_TESTS=OFF), for a device lent for minutes, where a fresh machine
# would build again (~280 s): if DIR holds lucebox-cuda-KEY.tar.xz.part* whose KEY is this tree's (a hash
# of cpp/, ggml/, CMakeLists.txt, pyproject.toml, ARCHS, SUITE_BUILD_ARGS and the Python version), that
# package is unpacked into python3's site-packages with this tree's python/lucebox and server/ copied over
# it (the bundled models too: the pack leaves them out), instead of building; otherwise the build's
# package is packed into $OUT/prebuilt (xz, parts of 15 MiB: the device's files come back at most 16 MiB
# each), to be carried as DIR by later calls.
ARCHS="${LUCEBOX_CUDA_ARCHS:-90a}"
TMP="${TMPDIR:-/tmp}"
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)  # (absolute: the working directory changes next)
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1
t0=$(date +%s)
ROOT=$(python3 ggml/fetch.py) || exit 1
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
suite_prebuilt_key() {
    { echo "$ARCHS ${SUITE_BUILD_ARGS[*]-} $(python3 -V)"
      find cpp ggml CMakeLists.txt pyproject.toml -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    } | sha256sum | cut -c1-16
}
suite_prebuilt_install() {  # 0 when DIR's package for this tree was installed and imports
    local parts=("$SUITE_PREBUILT"/lucebox-cuda-"$(suite_prebuilt_key)".tar.xz.part*)
    [ -f "${parts[0]}" ] || return 1
    rm -rf "$SITE"/lucebox "$SITE"/lucebox-*.dist-info
    cat "${parts[@]}" | xz -d | tar -C "$SITE" -xf - || return 1
    cp -r python/lucebox/. "$SITE/lucebox/" && cp -r server/. "$SITE/lucebox/server/" || return 1
    printf '#!/bin/sh\nexec "%s" -m lucebox "$@"\n' "$(command -v python3)" > "$(dirname "$(command -v python3)")/lucebox"
    chmod +x "$(dirname "$(command -v python3)")/lucebox"
    (cd / && python3 -c "import lucebox._core") >> "$OUT/build.log" 2>&1
}
if [ -n "${SUITE_PREBUILT:-}" ] && [ "${SUITE_BUILD_TESTS:-ON}" = OFF ] && suite_prebuilt_install; then
    echo "lucebox: the prebuilt package from $SUITE_PREBUILT, $(( $(date +%s) - t0 )) s"
    return 0 2>/dev/null || exit 0
fi
python3 -m pip install --no-build-isolation --no-deps -q -C build-dir="$TMP/lucebox-cuda" \
    -C cmake.define.LUCEBOX_CUDA=ON -C cmake.define.CMAKE_CUDA_ARCHITECTURES="$ARCHS" \
    -C cmake.define.LUCEBOX_BUILD_TESTS="${SUITE_BUILD_TESTS:-ON}" ${SUITE_BUILD_ARGS[@]+"${SUITE_BUILD_ARGS[@]}"} . \
    > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
echo "lucebox build: $(( $(date +%s) - t0 )) s"
if [ -n "${SUITE_PREBUILT:-}" ] && [ "${SUITE_BUILD_TESTS:-ON}" = OFF ]; then
    mkdir -p "$OUT/prebuilt" && tar -C "$SITE" --exclude=lucebox/models --exclude=__pycache__ -cf - lucebox $(cd "$SITE" && ls -d lucebox-*.dist-info) | xz -T0 -6 |
        split -b 15M - "$OUT/prebuilt/lucebox-cuda-$(suite_prebuilt_key).tar.xz.part" &&
        echo "packed: $(du -ch "$OUT"/prebuilt/* | tail -1 | cut -f1) in $OUT/prebuilt ($(( $(date +%s) - t0 )) s)"
fi
