// The fused gated attention op's node (attention_step.h) on lucebox's kernels (attention_step.cuh),
// for patch 0007's custom-op hook (delta_net_step.cu asks here for the nodes that are not its own).
#include <atomic>

#include "attention_step.cuh"
#include "attention_step.h"
#include "cuda_kernels.h"
#include "ggml.h"

namespace lucebox::kernels {
namespace {

static_assert(attention::MAX_TOKENS == attention::cuda_step::MAX_TOKENS, "one token limit for both backends");
static_assert(attention::MAX_GROUP == attention::cuda_step::MAX_GROUP, "one group limit for both backends");

std::atomic<uint64_t> g_runs{0};

int64_t elems(size_t bytes, size_t size) { return int64_t(bytes / size); }

}  // namespace

int attention_custom_op(const ggml_tensor * dst, void * stream) {
    if (!attention::is_gated(dst) || !device_runs_own_kernels()) return 0;
    const attention::shape s = attention::shape_of(dst);
    if (!attention::cuda_step::supported(int(s.hd), int(s.H), int(s.Hkv), int(s.T))) return 0;
    if (stream == nullptr) return 1;  // supports_op
    const ggml_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2], *mask = dst->src[3], *gate = dst->src[4];
    attention::cuda_step::gated_args a;
    a.q = static_cast<const float *>(q->data), a.q_head = elems(q->nb[1], 4), a.q_token = elems(q->nb[2], 4);
    a.k = static_cast<const __half *>(k->data), a.k_row = elems(k->nb[1], 2);
    a.v = static_cast<const __half *>(v->data), a.v_row = elems(v->nb[1], 2);
    a.mask = static_cast<const __half *>(mask->data), a.mask_row = elems(mask->nb[1], 2);
    a.gate = static_cast<const float *>(gate->data), a.gate_head = elems(gate->nb[1], 4),
    a.gate_token = elems(gate->nb[2], 4);
    a.out = static_cast<float *>(dst->data), a.out_token = s.hd * s.H;
    a.partial = attention::partial_floats(dst) > 0 ? a.out + s.hd * s.H * s.T : nullptr;
    a.hd = int(s.hd), a.H = int(s.H), a.Hkv = int(s.Hkv), a.T = int(s.T), a.n_kv = int(s.n_kv), a.scale = s.scale;
    const cudaError_t err = attention::cuda_step::run_gated(a, static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) GGML_ABORT("lucebox gated attention (%s): %s", ggml_get_name(dst), cudaGetErrorString(err));
    g_runs.fetch_add(1, std::memory_order_relaxed);
    return 1;
}

uint64_t attention_step_runs() { return g_runs.load(); }

}  // namespace lucebox::kernels
