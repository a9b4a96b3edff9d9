#!/usr/bin/env bash
# One pass over a machine with 2 or more GPUs (issue 11): builds lucebox for CUDA with its C++ tests
# and ggml's NCCL all-reduce, runs the split tests (tests/gpu/test_cuda_split.py, the layer and tensor
# splits' tokens against one GPU), writes the qwen3.6-27b Q8_0 synthetic pair, then bench_spec.py for
# one GPU, the tensor split (NCCL, then ggml's internal all-reduce) and the layer split: plain decode
# and forced acceptance lengths 1 and 6, the real draft's step. Compare each row with the one-GPU row
# of the same pass (docs/benchmarks.md, "Two GPUs").
#
# Usage: bash bench/multi_gpu_suite.sh OUT_DIR [DEVICES]
#   OUT_DIR   logs: build.log, pytest_split.log, spec_*.log
#   DEVICES   the split's devices (default cuda:0,cuda:1)
#   CUDA architectures: LUCEBOX_CUDA_ARCHS (default 90a). Offline machines: LUCEBOX_GGML_SOURCE (the
#   archive or an extracted tree, see README.md); the builds go to $TMPDIR (default /tmp). NCCL: found
#   under NCCL_ROOT, else in the nvidia-nccl Python package if one is installed.
set -uo pipefail
OUT="${1:?usage: bash bench/multi_gpu_suite.sh OUT_DIR [DEVICES]}"
DEVICES="${2:-cuda:0,cuda:1}"
TMP="${TMPDIR:-/tmp}"

# NCCL: ggml's FindNCCL looks for nccl.h and libnccl.so under NCCL_ROOT; the Python package ships
# libnccl.so.2 only, so it is linked into a root of its own
if [ -z "${NCCL_ROOT:-}" ]; then
    pkg=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))" 2>/dev/null ||
          python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null)
    if [ -n "$pkg" ] && [ -f "$pkg/include/nccl.h" ]; then
        export NCCL_ROOT="$TMP/nccl-root"
        mkdir -p "$NCCL_ROOT/lib"
        ln -sfn "$pkg/include" "$NCCL_ROOT/include"
        lib=$(ls "$pkg"/lib/libnccl.so* | head -1)
        ln -sf "$lib" "$NCCL_ROOT/lib/libnccl.so"
        export LD_LIBRARY_PATH="$pkg/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
fi
echo "NCCL_ROOT=${NCCL_ROOT:-(none)}"
SUITE_BUILD_ARGS=(${NCCL_ROOT:+-C cmake.define.NCCL_ROOT="$NCCL_ROOT"})
source "$(dirname "$0")/suite_build.sh"
if ! grep -q "^NCCL_LIBRARY:FILEPATH=/" "$TMP/lucebox-cuda/CMakeCache.txt" 2>/dev/null; then
    echo "ggml was built WITHOUT NCCL: the tensor split all-reduces with ggml's internal kernels"
fi
( lucebox synth qwen3.6-27b -o "$TMP/t27.gguf" --draft-out "$TMP/d27.gguf" --type q8_0 > "$OUT/synth.log" 2>&1
  echo $? > "$TMP/synth.done" ) &
nvidia-smi --query-gpu=index,name,memory.total --format=csv | tee "$OUT/gpus.txt"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
python3 -m pytest tests/gpu/test_cuda_split.py -q -p no:cacheprovider -rs 2>&1 | tee "$OUT/pytest_split.log" | tail -3
wait
[ "$(cat "$TMP/synth.done" 2>/dev/null)" = 0 ] || { echo "synth failed: $OUT/synth.log"; exit 1; }
SPEC=(python3 bench/bench_spec.py --model "$TMP/t27.gguf" --draft "$TMP/d27.gguf" --reps 2 --accept 1,6)
run() {  # run NAME [ENV=..] ARGS..: one bench_spec row, its log in $OUT/spec_NAME.log
    local name=$1; shift
    echo "== $name"
    env "$@" 2>&1 | tee "$OUT/spec_$name.log" | grep -E "plain decode|^ +[0-9]+ |real draft|identical|differ"
}
run one_gpu "${SPEC[@]}" --device "${DEVICES%%,*}"
run tensor_nccl "${SPEC[@]}" --devices "$DEVICES" --split tensor
run tensor_internal GGML_CUDA_ALLREDUCE=internal "${SPEC[@]}" --devices "$DEVICES" --split tensor
run layer "${SPEC[@]}" --devices "$DEVICES" --split layer
echo "total: $(( $(date +%s) - t0 )) s"
