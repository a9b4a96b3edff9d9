// The MUL_MAT hook (ggml patch 0003) that hands ggml's Q8_0 and Q4_K products of 1..64 columns to
// q8_0_matmul.cuh: plain MUL_MAT nodes; gate/up + SWIGLU on one input; a product and the residual
// ADD that follows it; and a product (or gate/up pair) whose input is an RMS norm times a weight
// vector, normalized inside the product. Everything else (other types, shapes the kernel refuses,
// batched or permuted operands, other GLU ops, a bias with a GLU) returns 0 and stays with ggml.
// Also sets the column count from which ggml runs quantized products as BF16 GEMMs (patch 0004),
// and converts their Q8_0 / Q4_K / Q6_K weights to BF16 for them (bf16_dequant.cuh), and the query
// rows up to which ggml's flash attention cuts its keys at fixed rows (patch 0008).
//
// Row-tiled weights (weight_tiles.h: Q8_0 / Q4_K product weights lucebox loaded onto a CUDA device)
// can be read by these kernels only, so every product of one is taken here whatever its column
// count (more than 64: in groups of 64 columns), except where patch 0004's BF16 route will take it
// (its converter below reads the tiles), and whatever set_cuda_kernels_enabled says. A fused form
// the kernel refuses is left to ggml, which brings a simpler form back here; should one of ggml's
// own kernels get a tiled weight anyway, it aborts with a message (patch 0003's foreign-weights
// check, foreign_weights below). lucebox's graphs build no refused forms (tiles_declined(): tests).
#include "cuda_kernels.h"

#include <algorithm>
#include <atomic>

#include "ggml-cuda.h"
#include "ggml.h"
#include "bf16_dequant.cuh"
#include "q8_0_ggml_args.h"
#include "q8_0_matmul.cuh"
#include "weight_tiles.h"

namespace lucebox::kernels {
namespace {

std::atomic<bool> g_enabled{true};

// Quantized products of at least this many columns (prefill micro-batches) run as BF16 cuBLAS GEMMs
// on dequantized weights (ggml patch 0004) instead of ggml's MMQ; products of 1..64 columns of
// weights in ggml's layout are the hook's. H200, 27B Q8_0, bench/probes/prefill_gemm_sweep.py
// --untiled: BF16 / MMQ prefill 0.87x at 128-token micro-batches, 1.26x at 256 (the weights'
// dequantization is paid per micro-batch).
constexpr int64_t k_bf16_gemm_min_cols = 256;
// The same for row-tiled weights, which MMQ cannot read: the alternative is lucebox's kernel (up to
// 64 columns a launch). Same sweep, tiled: BF16 / kernel 0.50x at 32-token micro-batches, 0.94x at
// 40, 0.97x at 48, 0.95x at 64, 1.17x at 96, 1.63x at 128, 2.80x at 256.
constexpr int64_t k_bf16_gemm_min_cols_tiled = 65;

}  // namespace

// mma.m16n8k32 and cp.async need compute capability 8.0 (this runs for every MUL_MAT node ggml
// dispatches: the answer is cached per device).
bool device_runs_own_kernels() {
    int dev = 0;
    return cudaGetDevice(&dev) == cudaSuccess && q8_0::detail::device_major(dev) >= 8;
}

namespace {

// Most columns the product kernel takes in one launch on the current device (0: it does not run).
int own_kernel_cols() {
    int dev = 0;
    return device_runs_own_kernels() && cudaGetDevice(&dev) == cudaSuccess ? q8_0::max_cols(dev) : 0;
}

std::atomic<bool> g_installed{false};  // install_cuda_kernels ran: the hook reads tiled weights
std::atomic<bool> g_tiles_enabled{true};
std::atomic<uint64_t> g_tiles_declined{0};
// set_fattn_fixed_split
std::atomic<int64_t> g_fattn_rows{k_fattn_fixed_rows}, g_fattn_piece{k_fattn_piece_keys}, g_fattn_tile{k_fattn_tile_cols},
    g_fattn_long_keys{k_fattn_long_keys}, g_fattn_long_tile{k_fattn_long_tile_cols},
    g_fattn_long_piece{k_fattn_long_piece_keys};

void apply_fattn_split(bool enabled) {
    ggml_backend_cuda_set_fattn_fixed_split(enabled ? g_fattn_rows.load() : 0, g_fattn_piece.load(), g_fattn_tile.load(),
                                            g_fattn_long_keys.load(), g_fattn_long_tile.load(),
                                            g_fattn_long_piece.load());
}

// Whether weight w (2-D, w->ne[1] rows nb[1] apart) is row-tiled; aborts when it cuts a tiled
// range's tiles (no kernel could read it).
bool is_tiled(const ggml_tensor * w) {
    if (w == nullptr) return false;
    switch (tiles::find(w->data, w->ne[1], int64_t(w->nb[1]))) {
        case tiles::lookup_result::not_tiled: return false;
        case tiles::lookup_result::tiled: return true;
        case tiles::lookup_result::misaligned: break;
    }
    GGML_ABORT("lucebox: %s reads rows of a row-tiled weight that do not start and end on its 16-row tiles",
               ggml_get_name(w));
}

size_t mul_mat_hook(const ggml_tensor * w, const ggml_tensor * gate, int glu_op, const ggml_tensor * bias,
                    const ggml_tensor * x, const ggml_tensor * norm_w, float norm_eps, ggml_tensor * dst,
                    void * scratch, void * stream) {
    const bool w_tiled = is_tiled(w), gate_tiled = is_tiled(gate);  // registry lookups: once
    const bool tiled = w_tiled || gate_tiled;
    if (!tiled && !g_enabled.load(std::memory_order_relaxed)) return 0;
    q8_0::matmul_args a;
    const bool fits = q8_0::args_from_ggml(w, gate, glu_op, bias, x, dst, a, norm_w, norm_eps, /*tiled =*/tiled);
    if (!tiled) {
        if (!fits) return 0;
        // more columns than one launch takes on this device (its shared memory): ggml's kernels
        if (scratch == nullptr) return a.N <= own_kernel_cols() ? q8_0::scratch_bytes(a) : 0;
    } else {
        // the BF16 route's (k_bf16_gemm_min_cols_tiled); up to 8 columns always the kernel's (ggml's
        // next choice there, MMVQ, cannot read tiles)
        if (fits && a.N > q8_0::COL_GROUP && ggml_backend_cuda_bf16_gemm_takes(w, x, dst)) return 0;
        // A fused form the kernel refuses: ggml then asks again with a simpler one (it computes the
        // norm or the other nodes itself), or its own kernel refuses the tiles (foreign_weights).
        // (as is a gated pair of which only one weight is tiled: each product then comes alone)
        const bool mixed_pair = gate != nullptr && w_tiled != gate_tiled;
        if ((!fits || mixed_pair) && (gate != nullptr || bias != nullptr || norm_w != nullptr)) {
            if (scratch == nullptr) g_tiles_declined.fetch_add(1, std::memory_order_relaxed);
            return 0;
        }
        if (!fits || (gate != nullptr && !gate_tiled) || !w_tiled || !device_runs_own_kernels())
            GGML_ABORT("lucebox: %s: a product of the row-tiled weight %s that lucebox's kernel cannot take",
                       ggml_get_name(dst), ggml_get_name(w));
        a.tiled = true;
        if (scratch == nullptr) return q8_0::scratch_bytes(a);  // 64 columns' worth at most
    }
    const cudaError_t err = q8_0::matmul(a, scratch, static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) {
        // ggml's own error path: it names the error and aborts, as for its kernels' launch failures
        GGML_ABORT("lucebox q8_0 matmul (%s): %s", ggml_get_name(dst), cudaGetErrorString(err));
    }
    return 1;
}

// Patch 0004's converter: Q8_0, Q4_K and Q6_K weights (contiguous, checked by the patch) to BF16
// with bf16_dequant.cuh; other types stay with ggml's converter.
// Patch 0003's check before ggml's own kernels read a weight: row-tiled ones (or ranges cutting
// their tiles) they cannot read.
bool foreign_weights(const ggml_tensor * w) {
    return tiles::find(w->data, w->ne[1], int64_t(w->nb[1])) != tiles::lookup_result::not_tiled;
}

int bf16_converter(const ggml_tensor * w, void * dst, void * stream) {
    const bool tiled = is_tiled(w);  // then ggml's converter cannot read it
    if (!tiled && !g_enabled.load(std::memory_order_relaxed)) return 0;
    bf16_dequant::format f;
    switch (w->type) {
        case GGML_TYPE_Q8_0: f = bf16_dequant::format::q8_0; break;
        case GGML_TYPE_Q4_K: f = bf16_dequant::format::q4_k; break;
        case GGML_TYPE_Q5_K: f = bf16_dequant::format::q5_k; break;
        case GGML_TYPE_Q6_K: f = bf16_dequant::format::q6_k; break;
        default: return 0;
    }
    const cudaError_t err = bf16_dequant::dequantize(f, w->data, ggml_nelements(w), static_cast<__nv_bfloat16 *>(dst),
                                                     static_cast<cudaStream_t>(stream), tiled ? w->ne[1] : 0,
                                                     int64_t(w->nb[1]));
    if (err != cudaSuccess) GGML_ABORT("lucebox bf16 dequantization (%s): %s", ggml_get_name(w), cudaGetErrorString(err));
    return 1;
}

}  // namespace

void install_cuda_kernels() {
    if (g_installed.exchange(true)) return;
    ggml_backend_cuda_set_mul_mat_hook(&mul_mat_hook);
    ggml_backend_cuda_set_foreign_weights(&foreign_weights);
    ggml_backend_cuda_set_bf16_converter(&bf16_converter);
    install_gdn_prefill();
    install_custom_ops();
    set_cuda_kernels_enabled(g_enabled.load());  // and the BF16 GEMM threshold that goes with it
}

void set_cuda_kernels_enabled(bool enabled) {
    g_enabled.store(enabled);
    set_gdn_prefill_enabled(enabled);
    // row-tiled weights keep theirs: only the hook and the route read them
    ggml_backend_cuda_set_bf16_gemm_min_cols(enabled ? k_bf16_gemm_min_cols : 0, k_bf16_gemm_min_cols_tiled);
    apply_fattn_split(enabled);
}

void set_fattn_fixed_split(int64_t rows, int64_t piece_keys, int64_t tile_cols, int64_t long_keys,
                           int64_t long_tile_cols, int64_t long_piece_keys) {
    check_fattn_fixed_split(rows, piece_keys, tile_cols, long_keys, long_tile_cols, long_piece_keys);
    g_fattn_rows.store(rows);
    g_fattn_piece.store(piece_keys);
    g_fattn_tile.store(tile_cols);
    g_fattn_long_keys.store(long_keys);
    g_fattn_long_tile.store(long_tile_cols);
    g_fattn_long_piece.store(long_piece_keys);
    if (g_installed.load()) apply_fattn_split(g_enabled.load());
}

int64_t fattn_long_keys() { return g_fattn_long_keys.load(); }

void set_bf16_gemm_min_cols(int64_t n) { ggml_backend_cuda_set_bf16_gemm_min_cols(n, n); }

namespace {

// The CUDA device of a buffer of ggml's CUDA backend, else -1 (host, a split's meta buffer or
// another backend's).
int cuda_device_of(ggml_backend_buffer_t buffer) {
    const ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(buffer);
    for (int dev = 0; dev < ggml_backend_cuda_get_device_count(); ++dev)
        if (buft == ggml_backend_cuda_buffer_type(dev)) return dev;
    return -1;
}

}  // namespace

bool tile_weights_in(ggml_backend_buffer_t buffer) {
    if (buffer == nullptr || !g_installed.load() || !g_enabled.load() || !g_tiles_enabled.load()) return false;
    const int dev = cuda_device_of(buffer);
    return dev >= 0 && q8_0::detail::device_major(dev) >= 8;
}

bool fused_ops_in(ggml_backend_buffer_t buffer) {
    if (buffer == nullptr) return false;
    return ggml_backend_buffer_is_host(buffer) || (g_installed.load() && g_enabled.load() && cuda_device_of(buffer) >= 0);
}

void set_weight_tiles_enabled(bool enabled) { g_tiles_enabled.store(enabled); }
uint64_t tiles_declined() { return g_tiles_declined.load(); }

}  // namespace lucebox::kernels
