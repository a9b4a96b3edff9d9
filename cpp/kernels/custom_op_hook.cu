// The custom-op hook (ggml patch 0007): lucebox's GGML_OP_CUSTOM nodes on CUDA, the fused DeltaNet
// step ops (delta_net_step.cu) and the range mask (range_mask.cu). Other custom nodes are not taken
// (ggml then places them elsewhere, or its CUDA backend says it cannot run them).
#include "cuda_kernels.h"
#include "ggml-cuda.h"

namespace lucebox::kernels {
namespace {

// stream null: whether the node runs here (supports_op); else runs it on stream, 1 when taken
int custom_op_hook(const ggml_tensor * dst, void * stream) {
    if (const int taken = delta_net_step_node(dst, stream)) return taken;
    return range_mask_node(dst, stream);
}

}  // namespace

void install_custom_ops() { ggml_backend_cuda_set_custom_op_hook(&custom_op_hook); }

}  // namespace lucebox::kernels
