// lucebox's own CUDA kernels inside ggml's CUDA backend (through ggml patch 0003's MUL_MAT hook):
// Q8_0 and Q4_K products of 1..64 activation columns, plain, fused gate/up SwiGLU, fused residual
// ADD and fused RMS norm (q8_0_matmul.cuh); large quantized products as BF16 cuBLAS GEMMs (ggml
// patch 0004); a prefill micro-batch's gated delta net (gdn_prefill.cuh, patch 0005); the fused
// DeltaNet step ops (delta_net_step.cuh, patch 0007); flash attention of few query rows with its keys cut
// at fixed rows (patch 0008), so that a token's results do not depend on its batch of up to 64.
// In a build without CUDA these do nothing.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "ggml-backend.h"

namespace lucebox::kernels {

// Routes the products the kernels take to them from now on, in every CUDA backend of the process.
// Idempotent and thread-safe; called before a device is first used (placement.cpp).
void install_cuda_kernels();

// Whether installed kernels take products (default: yes). Off: ggml's own kernels run everything,
// for A/B benchmarks and tests; takes effect at the next graph computed (a CUDA graph captured
// before keeps the kernels it captured until ggml captures again).
// Off also turns off the BF16 GEMM route of large quantized products (patch 0004) for weights in
// ggml's layout, and flash attention's fixed split for few query rows (patch 0008: ggml then picks
// its kernel and key split by the number of rows, so a decode step and a verify round differently);
// row-tiled weights loaded before keep the hook and the route (only they read tiles), and no weight
// loaded while off is tiled.
void set_cuda_kernels_enabled(bool enabled);

// Quantized products of at least n activation columns dequantize their weights to BF16 and run
// cuBLAS GEMMs (FP32 accumulation) instead of ggml's MMQ or, for row-tiled weights, lucebox's
// kernel (those of up to 8 columns stay the kernel's); 0: never. Installing the kernels sets the
// measured defaults (k_bf16_gemm_min_cols, k_bf16_gemm_min_cols_tiled; set_cuda_kernels_enabled
// restores them); for the threshold sweep of bench/probes/prefill_gemm_sweep.py.
void set_bf16_gemm_min_cols(int64_t n);

// Flash attention of at most this many query rows (a decode step, a chain or tree verify) runs
// ggml's tensor-core kernel with one query tile width and its keys cut into CTAs at fixed rows
// (ggml patch 0008), so that a token's attention is the same bits in a decode step and in a verify,
// as the products and the DeltaNet step ops already are; larger batches (prefill) keep ggml's choice.
constexpr int64_t k_fattn_fixed_rows = 64;
// Its keys in pieces of this many a CTA (the cuts at multiples of it; lucebox's cache views are
// multiples of 256 rows): fewer CTAs (longer pieces) cost a short-context decode step parallelism,
// more cost fixup memory and traffic at long contexts (a piece's partial sums: 64 columns x the head
// size in floats). H200, 27B, prompt 256 (docs/benchmarks.md, twenty-third session): a decode step
// against ggml's own split, Q4_K_M 7.11 / 6.77 ms with 256-key pieces, 7.14 / 6.87 with 128 (Q8_0
// 9.29 / 9.02): the piece length hardly moves the cost; the query tile width does (below). At prompt
// 32000 it does: long views take their own pieces (k_fattn_long_piece_keys, below). Pieces divide 256
// (check_fattn_fixed_split).
constexpr int64_t k_fattn_piece_keys = 128;
// and its query tile: 16 columns (2 queries of the 27B's 6 heads a KV head, padded to 8), so a decode
// step computes 8 of 16 columns and a 16-token verify reads each key 8 times (from L2). H200, 27B,
// prompt 256, one run (docs/benchmarks.md, twenty-fifth session), decode step at widths 64 / 32 / 16 / 8:
// Q4_K_M 7.01 / 7.03 / 6.80 / 6.97 ms; Q8_0 9.25 (64) / 8.95 (16); every width bit-exact (verify ==
// decode steps). 16 is also the fastest chain step at AL 6 for Q4_K_M (567.6 tok/s against 550.0 at 64);
// Q8_0 510.2 against 514.7. At prompt 4000 (twenty-seventh session) it costs a Q4_K_M verify 0.7 ms
// against 64 (chain AL 6 491.7 against 533.2 tok/s, -8 %) and saves a decode step 0.15 ms (6.92 against
// 7.07): 64 would serve long-context speculation better, but would take plain decoding of Q8_0 at
// depth 4096 under 1.5x llama.cpp (issue 9's bar; 1.50x at 16). Decode steps at 16 with verifies at
// 64 would take both, but ggml's MMA kernel rescales its softmax every 64 keys at widths 8 / 16 and
// every 32 at 32 / 64, so the two widths round a column differently. So a token's width follows
// the length of its key view instead, the same in its decode step and in its verify (below).
constexpr int64_t k_fattn_tile_cols = 16;
// Key views of at least k_fattn_long_keys rows take k_fattn_long_tile_cols columns instead: the
// width is then a function of the view's length, and the engine keeps a decode step and a verify of
// one token on the same side (split_safe_tokens in engine.cpp). H200, 27B Q4_K_M, one run (docs/
// benchmarks.md, thirtieth session), width 16 throughout / 64 from 768 keys: decode step, chain AL 6:
//   prompt  1024: 6.67 / 6.86 ms, 577.1 / 561.8 tok/s   (the wide tile loses both)
//   prompt  4096: 6.89 / 7.09 ms, 528.6 / 557.2 tok/s   (Q8_0: 9.16 / 9.25 ms, 458.6 / 489.6)
//   prompt  8192: 6.99 / 7.03 ms, 484.4 / 537.5 tok/s   (Q8_0: 9.22 / 9.32 ms, 437.8 / 478.2)
//   prompt 32000: 8.22 / 8.32 ms, 326.3 / 435.8 tok/s
// so it starts at 4096 keys (decode steps from position 3840 on), where speculation gains 5-7 % for
// 1-3 % of a plain decode step. 32 columns instead of 64 (H100, 27B Q4_K_M, fifty-seventh session, 2 reps):
// decode step 7.90 / 8.02 ms at prompt 4096 and 7.94 / 8.04 at 8192, but chain AL 6 598.6 / 588.4 and
// 572.1 / 586.2 tok/s: no gain in both phases, so 64.
constexpr int64_t k_fattn_long_keys = 4096;
constexpr int64_t k_fattn_long_tile_cols = 64;
// Long views are padded to multiples of k_fattn_long_view_pad rows (engine.cpp: kv_view_rows) and cut
// into pieces of k_fattn_long_piece_keys keys, a divisor of it. Short pieces cost long views: at 32000
// keys 128-key pieces make 250 CTAs a KV head, whose partial sums ggml's fixup combines one after the
// other (bench_kernels, Q4_K_M decode step: the attention 71 us a layer, its fixup 35 us). H200, 27B
// Q4_K_M, one run each (docs/benchmarks.md, thirty-first session), decode step ms, chain AL 1 / AL 6
// tok/s:
//   128 / 256-key pieces for every view (one run): prompt 4096 6.91 / 6.98 ms, AL 6 558.5 / 570.3;
//     prompt 8192 6.97 / 7.12 ms, 517.1 / 533.4; prompt 32000 8.28 / 7.88 ms, 439.4 / 491.0
//   long pieces 256 / 512 / 1024 at prompt 32000 (another run): 7.74 / 7.54 / 7.85 ms, AL 1 81.4 /
//     83.6 / 87.0, AL 6 440.1 / 494.5 / 501.6
// so 512: the fastest decode step there and within 2 % of 1024's verify. At 4096-8192 keys (thirty-
// second session, two runs) 128 / 256 / 512 differ by less than one setting moves between runs.
constexpr int64_t k_fattn_long_view_pad = 1024;
constexpr int64_t k_fattn_long_piece_keys = 512;

// Flash attention of at most `rows` query rows cuts its keys at fixed rows, pieces of `piece_keys`
// keys a CTA, with one query tile of `tile_cols` columns for every row count; key views of at least
// `long_keys` rows (0: none) take `long_tile_cols` columns and pieces of `long_piece_keys` (ggml patch
// 0008), so that a decode step and a verify of the same token compute the same bits; rows 0: ggml's own
// choice by the row count (the A/B of bench_spec / bench_batch_invariance). Defaults k_fattn_* (above);
// applies while the kernels are enabled, from the next graph captured. rows in 0..1023, piece_keys a
// divisor of 256, long_piece_keys a divisor of k_fattn_long_view_pad, long_keys >= 0, tile_cols and
// long_tile_cols 8, 16, 32 or 64, else std::invalid_argument (check_fattn_fixed_split). A CPU build keeps
// long_keys too: the engine's views and verify blocks follow it on every backend.
void set_fattn_fixed_split(int64_t rows, int64_t piece_keys, int64_t tile_cols, int64_t long_keys,
                           int64_t long_tile_cols, int64_t long_piece_keys);
// The key-view length from which the wide tile and the long pieces apply (0: never), as set.
int64_t fattn_long_keys();
inline void check_fattn_fixed_split(int64_t rows, int64_t piece_keys, int64_t tile_cols, int64_t long_keys,
                                    int64_t long_tile_cols, int64_t long_piece_keys) {
    auto width_ok = [](int64_t c) { return c == 8 || c == 16 || c == 32 || c == 64; };
    // pieces divide the row granularity of the engine's cache views (256 rows, k_fattn_long_view_pad
    // for long views), so every view is whole pieces and a piece's cuts fall on the same rows in a decode
    // step's view and in a verify's (a piece that did not divide a view would be cut at the kernel's KV
    // tiles instead, patch 0008). The one view that is not whole pieces, a long view clipped at a cache
    // size that is not a multiple of the long pad, is its own class (engine.cpp: split_safe_tokens).
    auto divides = [](int64_t piece, int64_t pad) { return piece > 0 && piece <= pad && pad % piece == 0; };
    if (rows < 0 || rows >= 1024 || !divides(piece_keys, 256) || !divides(long_piece_keys, k_fattn_long_view_pad) ||
        long_keys < 0 || !width_ok(tile_cols) || !width_ok(long_tile_cols))
        throw std::invalid_argument("attention split: rows must be in 0..1023, piece_keys a divisor of 256, "
                                    "long_piece_keys a divisor of " + std::to_string(k_fattn_long_view_pad) +
                                    ", long_keys >= 0 and tile_cols and long_tile_cols 8, 16, 32 or 64; got " +
                                    std::to_string(rows) + ", " + std::to_string(piece_keys) + ", " +
                                    std::to_string(tile_cols) + ", " + std::to_string(long_keys) + ", " +
                                    std::to_string(long_tile_cols) + ", " + std::to_string(long_piece_keys));
}

// Whether Q8_0 / Q4_K product weights loaded into `buffer` are to be row-tiled (weight_tiles.h):
// a CUDA device buffer (compute capability >= 8.0) while the kernels are enabled and tiling is not
// switched off. Their products then always run on lucebox's kernels.
bool tile_weights_in(ggml_backend_buffer_t buffer);
// Off: weights load in ggml's layout (A/B tests of the layout; takes effect at the next load).
void set_weight_tiles_enabled(bool enabled);
// Fused products of tiled weights the hook left to ggml to split (lucebox's graphs build none).
uint64_t tiles_declined();

// Whether a DeltaNet layer whose weights are in `buffer` runs its steps (decode, a verify: up to
// delta_net::MAX_TOKENS tokens) as the fused ops of delta_net_step.h: in host memory (the CPU
// backend runs the ops' reference code) or a CUDA device buffer (not a tensor split's meta buffer)
// while lucebox's kernels are installed and enabled (through ggml patch 0007). Asked when a graph is
// built (graphs built before keep their ops).
bool fused_ops_in(ggml_backend_buffer_t buffer);
// How many fused DeltaNet step ops lucebox's CUDA kernels have run (graph captures count once).
uint64_t delta_net_step_runs();
// How many range masks (range_mask.h) lucebox's CUDA kernel has built (graph captures count once).
uint64_t range_mask_runs();

// Whether the current CUDA device runs lucebox's kernels (compute capability >= 8.0; cached per device).
bool device_runs_own_kernels();

// How many gated delta nets lucebox's prefill kernel (gdn_prefill.cuh, ggml patch 0005) has run in
// this process: tests check that it was used.
uint64_t gdn_prefill_runs();

// Parts of install_cuda_kernels / set_cuda_kernels_enabled (gdn_prefill.cu; custom_op_hook.cu: ggml
// patch 0007's hook for lucebox's custom nodes).
void install_gdn_prefill();
void install_custom_ops();
void set_gdn_prefill_enabled(bool enabled);
// The custom-op hook's parts (CUDA builds): stream null asks whether node dst is theirs and runs here,
// else they run it on stream; 1 when taken, 0 when not theirs.
int delta_net_step_node(const ggml_tensor * dst, void * stream);
int range_mask_node(const ggml_tensor * dst, void * stream);

}  // namespace lucebox::kernels
