// CPU-only build: no CUDA kernels to install (see cuda_kernels.h).
#include "cuda_kernels.h"

namespace lucebox::kernels {

void install_cuda_kernels() {}
void set_cuda_kernels_enabled(bool) {}
void set_bf16_gemm_min_cols(int64_t) {}
void set_fattn_fixed_split(int64_t rows, int64_t piece_keys, int64_t tile_cols) {
    check_fattn_fixed_split(rows, piece_keys, tile_cols);
}
uint64_t gdn_prefill_runs() { return 0; }
bool device_runs_own_kernels() { return false; }
void install_gdn_prefill() {}
void set_gdn_prefill_enabled(bool) {}
bool tile_weights_in(ggml_backend_buffer_t) { return false; }
void set_weight_tiles_enabled(bool) {}
uint64_t tiles_declined() { return 0; }
bool fused_ops_in(ggml_backend_buffer_t buffer) { return buffer != nullptr && ggml_backend_buffer_is_host(buffer); }
uint64_t delta_net_step_runs() { return 0; }
void install_delta_net_step() {}

}  // namespace lucebox::kernels
