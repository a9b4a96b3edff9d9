// The GATED_DELTA_NET hook (ggml patch 0005) that hands a prefill micro-batch's gated delta net
// (scalar gate, final state only, head size 128, >= gdn_prefill::MIN_TOKENS tokens, no tree
// parents) to gdn_prefill.cuh. Everything else returns 0 and stays with ggml's kernel.
#include <atomic>
#include <cmath>
#include <cstring>

#include "cuda_kernels.h"
#include "gdn_prefill.cuh"
#include "ggml-cuda.h"
#include "ggml.h"

namespace lucebox::kernels {
namespace {

std::atomic<bool> g_gdn_enabled{true};
std::atomic<uint64_t> g_gdn_runs{0};

int gdn_prefill_hook(const ggml_tensor * dst, float * state, int64_t state_slot_stride, void * stream) {
    (void) state_slot_stride;  // one slot: the final state
    if (!g_gdn_enabled.load(std::memory_order_relaxed) || !device_runs_own_kernels()) return 0;  // cp.async: sm_80
    const ggml_tensor * q = dst->src[0], * k = dst->src[1], * v = dst->src[2], * g = dst->src[3],
                      * beta = dst->src[4], * s0 = dst->src[5];
    int32_t snapshots = 0;  // op param 0: the kept states K
    std::memcpy(&snapshots, dst->op_params, sizeof snapshots);
    if (dst->src[6] != nullptr || snapshots != 1) return 0;  // tree, or a verify's per-token states
    for (const ggml_tensor * t : {q, k, v, g, beta, s0})
        if (t == nullptr || t->type != GGML_TYPE_F32) return 0;
    if (v->ne[0] != gdn_prefill::HEAD || q->ne[0] != gdn_prefill::HEAD || g->ne[0] != 1 || q->ne[1] != k->ne[1] ||
        v->ne[1] % q->ne[1] != 0 || v->ne[3] % q->ne[3] != 0 || !ggml_is_contiguous(s0) || !ggml_is_contiguous(g) ||
        !ggml_is_contiguous(beta) || q->nb[0] != 4 || v->nb[0] != 4 || q->nb[1] != k->nb[1] || q->nb[2] != k->nb[2] ||
        q->nb[3] != k->nb[3])
        return 0;
    gdn_prefill::args a;
    a.q = static_cast<const float *>(q->data);
    a.k = static_cast<const float *>(k->data);
    a.v = static_cast<const float *>(v->data);
    a.g = static_cast<const float *>(g->data);
    a.beta = static_cast<const float *>(beta->data);
    a.state_in = static_cast<const float *>(s0->data);
    a.out = static_cast<float *>(dst->data);
    a.state_out = state;
    a.H = v->ne[1];
    a.Hk = q->ne[1];
    a.T = v->ne[2];
    a.n_seqs = v->ne[3];
    a.rq3 = v->ne[3] / q->ne[3];
    a.sq1 = int64_t(q->nb[1] / 4), a.sq2 = int64_t(q->nb[2] / 4), a.sq3 = int64_t(q->nb[3] / 4);
    a.sv1 = int64_t(v->nb[1] / 4), a.sv2 = int64_t(v->nb[2] / 4), a.sv3 = int64_t(v->nb[3] / 4);
    a.sb1 = int64_t(beta->nb[1] / 4), a.sb2 = int64_t(beta->nb[2] / 4), a.sb3 = int64_t(beta->nb[3] / 4);
    a.scale = 1.0f / sqrtf(float(gdn_prefill::HEAD));
    if (!gdn_prefill::supported(a)) return 0;
    const cudaError_t err = gdn_prefill::run(a, static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) GGML_ABORT("lucebox gated delta net (%s): %s", ggml_get_name(dst), cudaGetErrorString(err));
    g_gdn_runs.fetch_add(1, std::memory_order_relaxed);
    return 1;
}

}  // namespace

void install_gdn_prefill() { ggml_backend_cuda_set_gated_delta_net_hook(&gdn_prefill_hook); }
void set_gdn_prefill_enabled(bool enabled) { g_gdn_enabled.store(enabled); }
uint64_t gdn_prefill_runs() { return g_gdn_runs.load(); }

}  // namespace lucebox::kernels
