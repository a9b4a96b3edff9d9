// CPU-only build: no CUDA kernels to install (see cuda_kernels.h).
#include "cuda_kernels.h"

#include <atomic>

namespace lucebox::kernels {

void install_cuda_kernels() {}
void set_cuda_kernels_enabled(bool) {}
void set_bf16_gemm_min_cols(int64_t) {}
namespace {
std::atomic<int64_t> g_fattn_long_keys{k_fattn_long_keys};
}  // namespace
void set_fattn_fixed_split(int64_t rows, int64_t piece_keys, int64_t tile_cols, int64_t long_keys,
                           int64_t long_tile_cols, int64_t long_piece_keys) {
    check_fattn_fixed_split(rows, piece_keys, tile_cols, long_keys, long_tile_cols, long_piece_keys);
    g_fattn_long_keys.store(long_keys);
}
int64_t fattn_long_keys() { return g_fattn_long_keys.load(); }
uint64_t gdn_prefill_runs() { return 0; }
bool device_runs_own_kernels() { return false; }
void install_gdn_prefill() {}
void set_gdn_prefill_enabled(bool) {}
bool tile_weights_in(ggml_backend_buffer_t) { return false; }
void set_weight_tiles_enabled(bool) {}
uint64_t tiles_declined() { return 0; }
bool fused_ops_in(ggml_backend_buffer_t buffer) { return buffer != nullptr && ggml_backend_buffer_is_host(buffer); }
uint64_t delta_net_step_runs() { return 0; }
uint64_t range_mask_runs() { return 0; }
void install_custom_ops() {}

}  // namespace lucebox::kernels
