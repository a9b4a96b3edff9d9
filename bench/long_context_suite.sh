#!/usr/bin/env bash
# The attention's fixed split at long contexts (cuda_kernels.h: k_fattn_long_keys, the key-view length
# from which the query tile is wide and the pieces long, and k_fattn_long_piece_keys, the keys a CTA in
# those views) on one GPU:
# - builds lucebox for CUDA with its C++ tests and runs their GPU cases (ctest -R _gpu_: the DeltaNet
#   step and commit kernels against the CPU ops' bits among them);
# - runs tests/gpu (the attention's bit-equality and switch tests among them: patch 0008 changes ggml's
#   attention code for every caller);
# - writes the qwen3.6-27b synthetic target and its draft in Q4_K_M;
# - runs bench_spec.py at each prompt length four times: the defaults (with the random-weight draft, for
#   its "real draft" line: a full step's cost at that length), the narrow tile and short pieces
#   throughout (--attention-long-keys 0), and long pieces of 256 and 1024 keys (--attention-long-piece).
#   bench_spec's greedy identity check ("verify-path greedy vs plain decode") covers every run, those
#   whose generation crosses the switch among them;
# - last, the kernels of a decode step and a verify at the longest prompt (bench_kernels.py --no-pdl: the
#   attention and its fixup kernel's share).
# About 20 minutes on one H200 with the default lengths.
#
# Usage: bash bench/long_context_suite.sh OUT_DIR [PROMPTS]
#   OUT_DIR    logs: build.log, ctest_gpu.log, pytest_gpu.log, spec_p<PROMPT>_<RUN>.log (RUN: default,
#              narrow, long256, long1024), kernels_p<PROMPT>.log
#   PROMPTS    comma-separated prompt lengths (default 256,4096,8192,32000)
#   CUDA architectures: LUCEBOX_CUDA_ARCHS (default 90a). Offline machines: LUCEBOX_GGML_SOURCE (the
#   archive or an extracted tree, see README.md); the builds go to $TMPDIR (default /tmp).
set -uo pipefail
OUT="${1:?usage: bash bench/long_context_suite.sh OUT_DIR [PROMPTS]}"
PROMPTS="${2:-256,4096,8192,32000}"
source "$(dirname "$0")/suite_build.sh"
( lucebox synth qwen3.6-27b -o "$TMP/t27q4.gguf" --draft-out "$TMP/d27q4.gguf" --type q4_k_m > "$OUT/synth.log" 2>&1
  echo $? > "$TMP/synth.done" ) &
ctest --test-dir "$TMP/lucebox-cuda" -R _gpu_ --output-on-failure > "$OUT/ctest_gpu.log" 2>&1
tail -1 "$OUT/ctest_gpu.log"
python3 -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log" | tail -3
wait
[ "$(cat "$TMP/synth.done" 2>/dev/null)" = 0 ] || { echo "synth failed: $OUT/synth.log"; exit 1; }
declare -A RUNS=([default]="--draft $TMP/d27q4.gguf" [narrow]="--attention-long-keys 0" [long256]="--attention-long-piece 256"
                [long1024]="--attention-long-piece 1024")
for prompt in ${PROMPTS//,/ }; do
    ctx=$(( (prompt + 97 + 32 + 255) / 256 * 256 ))  # the prompt, the 97 tokens and bench_spec's 32 more
    for run in default narrow long256 long1024; do
        echo "== prompt $prompt, $run ${RUNS[$run]}"
        # shellcheck disable=SC2086  # (the run's options)
        python3 bench/bench_spec.py --model "$TMP/t27q4.gguf" --device cuda --reps 1 --accept 1,6 --prompt "$prompt" \
            --ctx "$ctx" ${RUNS[$run]} 2>&1 | tee "$OUT/spec_p${prompt}_${run}.log" | tail -5
    done
done
longest=$(tr , '\n' <<< "$PROMPTS" | sort -n | tail -1)
echo "== kernels at prompt $longest"
python3 bench/bench_kernels.py "$TMP/t27q4.gguf" --depth "$longest" --no-pdl --top 12 2>&1 \
    | tee "$OUT/kernels_p$longest.log" | tail -40
echo "total: $(( $(date +%s) - t0 )) s"
