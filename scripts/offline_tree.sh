#!/usr/bin/env bash
# Writes the pinned llama.cpp tree, trimmed to what lucebox's CUDA/CPU build and the llama-bench
# anchor (bench/llama_anchor) need (~23 MB instead of ~75), to DIR/llama.cpp, for a machine without
# network: copy DIR there and set LUCEBOX_GGML_SOURCE=DIR/llama.cpp (ggml/fetch.py copies and patches
# it; the unpatched tree is never modified). The archive comes from the cache (downloaded and
# sha256-checked by ggml/fetch.py if absent).
# Usage: bash scripts/offline_tree.sh DIR [PYTHON]
set -euo pipefail
DIR="${1:?usage: bash scripts/offline_tree.sh DIR [PYTHON]}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"  # before pinned_setup moves to the checkout: DIR is relative to the caller
source "$(dirname "$0")/pinned_source.sh"
pinned_setup offline_tree "${2:-python3}"
pinned_archive
rm -rf "$DIR/llama.cpp" "$DIR/.extract"
mkdir "$DIR/.extract"
top="llama_cpp_python-$(pin version)"  # the sdist's root
tar xzf "$ARCHIVE" -C "$DIR/.extract" "$top/$(pin subtree)"
mv "$DIR/.extract/$top/$(pin subtree)" "$DIR/llama.cpp"
rm -rf "$DIR/.extract"
cd "$DIR/llama.cpp"
# not needed to build ggml (CPU, CUDA), libllama, common, tools/llama-bench and tools/perplexity
rm -rf models docs media benches tests conversion examples gguf-py scripts grammars .git
find tools -mindepth 1 -maxdepth 1 ! -name llama-bench ! -name perplexity ! -name CMakeLists.txt -exec rm -rf {} +
for b in cann et hexagon metal opencl openvino rpc sycl virtgpu vulkan webgpu zdnn zendnn musa blas; do
    rm -rf "ggml/src/ggml-$b"
done
log "wrote $DIR/llama.cpp ($(du -sh . | cut -f1)); use LUCEBOX_GGML_SOURCE=$DIR/llama.cpp"
