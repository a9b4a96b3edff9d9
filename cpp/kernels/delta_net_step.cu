// The fused DeltaNet step ops' nodes (delta_net_step.h) on lucebox's kernels (delta_net_step.cuh),
// for the custom-op hook (custom_op_hook.cu).
#include <atomic>

#include "cuda_kernels.h"
#include "delta_net_step.cuh"
#include "delta_net_step.h"
#include "ggml-cuda.h"
#include "ggml.h"

namespace lucebox::kernels {
namespace {

static_assert(delta_net::MAX_TOKENS == delta_net::cuda_step::MAX_TOKENS, "one token limit for both backends");
static_assert(delta_net::HEAD == delta_net::cuda_step::HEAD, "one head size for both backends");
static_assert(delta_net::MAX_D_CONV == delta_net::cuda_step::MAX_D_CONV, "one conv limit for both backends");

std::atomic<uint64_t> g_step_runs{0};

int64_t floats(size_t bytes) { return int64_t(bytes / sizeof(float)); }
const float * cf(const ggml_tensor * t) { return static_cast<const float *>(t->data); }
float * f(const ggml_tensor * t) { return static_cast<float *>(t->data); }

static_assert(delta_net::REPLAY_COLUMNS == 4, "replay_layers_kernel reads rows of 4 addresses");

}  // namespace

int delta_net_step_node(const ggml_tensor * dst, void * stream) {
    const int op = delta_net::op_of(dst);
    if (op == 0) return 0;  // not a node of lucebox's
    const delta_net::shape s = delta_net::shape_of(dst);
    const delta_net::step_params p = delta_net::params_of(dst);
    if (!delta_net::cuda_step::supported(op == 2 ? 2 : int(s.d_conv), int(s.conv_dim), int(s.T))) return 0;
    if (stream == nullptr) return 1;  // supports_op
    cudaError_t err = cudaSuccess;
    if (op == 1) {
        delta_net::cuda_step::inputs_args a;
        const auto operand = [&](int i) { return delta_net::input_operand(dst, i); };
        a.qkv = cf(operand(0)), a.qkv_stride = floats(operand(0)->nb[1]);
        a.beta = cf(operand(1)), a.beta_stride = floats(operand(1)->nb[1]);
        a.alpha = cf(operand(2)), a.alpha_stride = floats(operand(2)->nb[1]);
        a.conv_state = cf(operand(3)), a.conv_w = cf(operand(4)), a.dt_bias = cf(operand(5)), a.a = cf(operand(6));
        if (operand(7) != nullptr) a.conv_dst = f(operand(7)), a.conv_dst_stride = floats(operand(7)->nb[1]);
        a.window_from = p.window_from;
        if (operand(8) != nullptr) a.tree_rows = static_cast<const int32_t *>(operand(8)->data);  // a tree's windows
        a.out = f(dst);
        a.T = int(s.T), a.Hk = int(s.Hk), a.Hv = int(s.Hv), a.conv_dim = int(s.conv_dim), a.d_conv = int(s.d_conv);
        a.eps = p.eps;
        err = delta_net::cuda_step::run_inputs(a, static_cast<cudaStream_t>(stream));
    } else if (op == 3) {  // replay_layers: the layers' addresses are in the node's table (src[0])
        delta_net::cuda_step::replay_layers_args r;
        r.layers = static_cast<const int64_t *>(dst->src[0]->data);
        r.x_tokens = p.x_tokens, r.T = int(s.T), r.Hk = int(s.Hk), r.Hv = int(s.Hv), r.d_conv = p.d_conv;
        r.conv_src_stride = p.conv_src_stride;
        err = delta_net::cuda_step::run_replay_layers(r, int(dst->src[0]->ne[1]), static_cast<cudaStream_t>(stream));
    } else {
        delta_net::cuda_step::recurrence_args a;
        a.state_dst = f(dst->src[0]), a.slot_stride = floats(dst->src[0]->nb[1]), a.state_mode = p.state_mode;
        a.x = cf(dst->src[1]), a.x_tokens = p.x_tokens;
        a.s0 = cf(dst->src[2]);
        a.z = cf(dst->src[3]), a.z_stride = floats(dst->src[3]->nb[1]), a.norm_w = cf(dst->src[4]);
        a.out = f(dst);
        a.T = int(s.T), a.Hk = int(s.Hk), a.Hv = int(s.Hv);
        a.eps = p.eps;
        if (dst->src[5] != nullptr) a.parents = static_cast<const int32_t *>(dst->src[5]->data);  // a tree's
        err = delta_net::cuda_step::run_recurrence(a, static_cast<cudaStream_t>(stream));
    }
    if (err != cudaSuccess) GGML_ABORT("lucebox DeltaNet step (%s): %s", ggml_get_name(dst), cudaGetErrorString(err));
    g_step_runs.fetch_add(1, std::memory_order_relaxed);
    return 1;
}

uint64_t delta_net_step_runs() { return g_step_runs.load(); }

}  // namespace lucebox::kernels
