# Shared by the scripts that build upstream llama.cpp from the pinned sdist (install_oracle.sh,
# build_upstream_spec.sh); sourced, not run. After `pinned_setup NAME PYTHON`:
#   ROOT     the checkout (the working directory from then on)
#   CACHE    $LUCEBOX_CACHE_DIR (default ~/.cache/lucebox), exported
#   log      messages on stderr prefixed [NAME]
#   pin KEY  a field of ggml/pin.json
# `pinned_archive` then sets ARCHIVE to the pinned archive in the cache (downloaded by
# ggml/fetch.py if absent) after checking its sha256 against the pin.

pinned_setup() {
    PINNED_NAME="$1"
    PY="$2"
    if ! [ -x "$PY" ] && ! command -v "$PY" >/dev/null 2>&1; then
        echo "$PINNED_NAME: $PY: no such interpreter" >&2
        exit 2
    fi
    cd "$(dirname "${BASH_SOURCE[0]}")/.."
    ROOT="$(pwd)"
    CACHE="${LUCEBOX_CACHE_DIR:-$HOME/.cache/lucebox}"
    export LUCEBOX_CACHE_DIR="$CACHE"
}

log() { echo "[$PINNED_NAME] $*" >&2; }

pin() { "$PY" -c "import json,sys; print(json.load(open('$ROOT/ggml/pin.json'))[sys.argv[1]])" "$1"; }

pinned_archive() {
    # fetch.py skips the download when its extracted tree is already there, so ask for it explicitly
    ARCHIVE="$CACHE/$(pin archive)"
    if [ ! -f "$ARCHIVE" ]; then
        (cd "$ROOT/ggml" && "$PY" -c "import fetch; fetch.download(fetch.cache_dir() / fetch.PIN['archive'])")
    fi
    local got want
    got="$(sha256sum "$ARCHIVE" | cut -d' ' -f1)"
    want="$(pin sha256)"
    if [ "$got" != "$want" ]; then
        echo "$PINNED_NAME: $ARCHIVE: sha256 $got does not match the pinned $want" >&2
        exit 1
    fi
}
