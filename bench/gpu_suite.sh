#!/usr/bin/env bash
# One pass over a single-GPU machine: builds lucebox for CUDA with its C++ tests, builds the
# llama-bench anchor (bench/llama_anchor; and llama-perplexity where the tree has it) in the background meanwhile, runs the GPU CTest cases and
# tests/gpu, writes the qwen3.6-27b synthetic target in Q8_0 (with its draft) and Q4_K_M, then
# bench_spec.py and bench_target.py on each: every number issue 9's bars name, in one run with the
# anchor; last, bench_kernels.py on each (where a decode step and a verify go on this card). About 13
# minutes on one H200 with 16 cores (twenty-ninth session: 753 s; build 4 min, tests 5.5 min, benches 3
# min); on an H100, fifty-sixth session: 671 s, then about a minute of bench_kernels.
#
# Usage: bash bench/gpu_suite.sh OUT_DIR [REPS] [--bars]
#   OUT_DIR   logs: build.log, ctest.log, pytest_gpu.log, spec.log, target.log (Q8_0),
#             spec_q4_k_m.log, target_q4_k_m.log, kernels.log, kernels_q4_k_m.log
#   REPS      repetitions of bench_target.py (default 2)
#   --bars    the measurements only: no C++ tests built, no GPU CTest, no tests/gpu (a few minutes
#             less, for a machine lent briefly; the numbers are the same runs)
#   CUDA architectures: LUCEBOX_CUDA_ARCHS (default 90a). Offline machines: LUCEBOX_GGML_SOURCE (the
#   archive or an extracted tree, see README.md); the builds go to $TMPDIR (default /tmp).
set -uo pipefail
OUT="${1:?usage: bash bench/gpu_suite.sh OUT_DIR [REPS] [--bars]}"
REPS="${2:-2}"
BARS=0
[ "${3:-}" = --bars ] && BARS=1
[ -n "${3:-}" ] && [ "$BARS" = 0 ] && { echo "gpu_suite.sh: unknown option '$3' (usage: OUT_DIR [REPS] [--bars])" >&2; exit 2; }
[ "$BARS" = 1 ] && SUITE_BUILD_TESTS=OFF
source "$(dirname "$0")/suite_build.sh"
rm -f "$TMP/anchor.done"
( cmake -S bench/llama_anchor -B "$TMP/anchor" -G Ninja -DLLAMA_CPP_ROOT="$ROOT" -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" -DCMAKE_BUILD_TYPE=Release > "$OUT/anchor.log" 2>&1 &&
  ninja -C "$TMP/anchor" llama-bench $([ -d "$ROOT/tools/perplexity" ] && echo llama-perplexity) \
      >> "$OUT/anchor.log" 2>&1; echo $? > "$TMP/anchor.done" ) &
( lucebox synth qwen3.6-27b -o "$TMP/t27.gguf" --draft-out "$TMP/d27.gguf" --type q8_0 > "$OUT/synth.log" 2>&1 &&
  lucebox synth qwen3.6-27b -o "$TMP/t27q4.gguf" --type q4_k_m >> "$OUT/synth.log" 2>&1
  echo $? > "$TMP/synth.done" ) &
# side by side (--parallel): correctness cases, no timings; the two q8_0 product tests (~100 s each on
# an H200, mostly their CPU reference) then take the time of one
if [ "$BARS" = 0 ]; then
    ctest --test-dir "$TMP/lucebox-cuda" -R "q8_0|gpu|top_k|rope" --parallel 4 --output-on-failure 2>&1 | tee "$OUT/ctest.log" | tail -4
    python3 -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log" | tail -3
fi
wait
[ "$(cat "$TMP/synth.done" 2>/dev/null)" = 0 ] || { echo "synth failed: $OUT/synth.log"; exit 1; }
[ "$(cat "$TMP/anchor.done" 2>/dev/null)" = 0 ] || echo "anchor build failed: $OUT/anchor.log (bench_target skipped)"
measure() {  # measure MODEL LOG_SUFFIX [bench_spec.py options]: bench_spec, then bench_target against the anchor
    local model="$1" suffix="$2"
    shift 2
    python3 bench/bench_spec.py --model "$model" --device cuda --reps 3 --accept 1,6,16 "$@" 2>&1 |
        tee "$OUT/spec$suffix.log" | tail -8
    [ "$(cat "$TMP/anchor.done" 2>/dev/null)" = 0 ] || return 0
    python3 bench/bench_target.py --model "$model" --device cuda \
        --llama-bench "$TMP/anchor/llama-bench/llama-bench" --reps "$REPS" 2>&1 | tee "$OUT/target$suffix.log" | tail -10
}
measure "$TMP/t27.gguf" "" --draft "$TMP/d27.gguf"
measure "$TMP/t27q4.gguf" _q4_k_m
python3 bench/bench_kernels.py "$TMP/t27.gguf" --top 24 > "$OUT/kernels.log" 2>&1
python3 bench/bench_kernels.py "$TMP/t27q4.gguf" --top 24 > "$OUT/kernels_q4_k_m.log" 2>&1
grep -h "busy by kind" "$OUT/kernels.log" "$OUT/kernels_q4_k_m.log"
echo "total: $(( $(date +%s) - t0 )) s"
