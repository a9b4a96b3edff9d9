#!/usr/bin/env bash
# The attention's query tile width at long contexts (cuda_kernels.h, k_fattn_long_keys) on one GPU:
# builds lucebox for CUDA with its C++ tests, runs tests/gpu/test_cuda_attention.py (the switch's
# bit-equality and token tests among them), writes the qwen3.6-27b synthetic target in Q4_K_M, then
# bench_spec.py at each prompt length twice: the narrow tile throughout (--attention-long-keys 0) and
# the wide one from LONG_KEYS keys on. A prompt below LONG_KEYS - 256 whose generation reaches it
# crosses the switch, which bench_spec's greedy identity check ("verify-path greedy vs plain decode")
# then covers at the 27B's shape. Prompts of 8192 tokens and more also run the wide tile with 512-key
# pieces (--attention-piece 512). About 16 minutes on one H200 with the default lengths.
#
# Usage: bash bench/long_context_suite.sh OUT_DIR [PROMPTS] [LONG_KEYS]
#   OUT_DIR    logs: build.log, pytest_attention.log, spec_p<PROMPT>_long<KEYS>[--attention-piece512].log
#   PROMPTS    comma-separated prompt lengths (default 480,1024,4096,8192,32000)
#   LONG_KEYS  the wide tile's first key-view length (default 768: decode steps from position 512 on)
#   CUDA architectures: LUCEBOX_CUDA_ARCHS (default 90a). Offline machines: LUCEBOX_GGML_SOURCE (the
#   archive or an extracted tree, see README.md); the builds go to $TMPDIR (default /tmp).
set -uo pipefail
OUT="${1:?usage: bash bench/long_context_suite.sh OUT_DIR [PROMPTS] [LONG_KEYS]}"
PROMPTS="${2:-480,1024,4096,8192,32000}"
LONG_KEYS="${3:-768}"
source "$(dirname "$0")/suite_build.sh"
( lucebox synth qwen3.6-27b -o "$TMP/t27q4.gguf" --type q4_k_m > "$OUT/synth.log" 2>&1; echo $? > "$TMP/synth.done" ) &
python3 -m pytest tests/gpu/test_cuda_attention.py -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest_attention.log" | tail -3
wait
[ "$(cat "$TMP/synth.done" 2>/dev/null)" = 0 ] || { echo "synth failed: $OUT/synth.log"; exit 1; }
for prompt in ${PROMPTS//,/ }; do
    ctx=$(( (prompt + 97 + 16 + 255) / 256 * 256 ))
    runs=("0" "$LONG_KEYS")
    # long prompts: also the wide tile with 512-key pieces (a quarter of the partial sums to combine)
    [ "$prompt" -ge 8192 ] && runs+=("$LONG_KEYS --attention-piece 512")
    for run in "${runs[@]}"; do
        echo "== prompt $prompt, --attention-long-keys $run"
        # shellcheck disable=SC2086  # (run holds the options)
        python3 bench/bench_spec.py --model "$TMP/t27q4.gguf" --device cuda --reps 1 --accept 1,6 --prompt "$prompt" \
            --ctx "$ctx" --attention-long-keys $run 2>&1 | tee "$OUT/spec_p${prompt}_long${run// /}.log" | tail -5
    done
done
echo "total: $(( $(date +%s) - t0 )) s"
