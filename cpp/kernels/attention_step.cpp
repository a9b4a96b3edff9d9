// The fused gated attention op (attention_step.h): the graph node and the CPU reference.
#include "attention_step.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "custom_op.h"
#include "lucebox/errors.h"

namespace lucebox::kernels::attention {
namespace {

std::atomic<uint64_t> g_cpu_runs{0};

// the node's own parameters (custom_op.h)
struct op_params {
    int32_t n_kv = 0;
    float scale = 0.0f;
};
op_params params_of(const ggml_tensor * dst) {
    op_params p;
    custom_op::read_params(dst, &p, sizeof p);
    return p;
}

void require(bool ok, const std::string & what) {
    if (!ok) throw error("internal: attention::gated: " + what);
}

template <class T>
const T * at(const ggml_tensor * t, int64_t i1, int64_t i2 = 0) {
    return reinterpret_cast<const T *>(static_cast<const char *>(t->data) + i1 * t->nb[1] + i2 * t->nb[2]);
}

}  // namespace

uint64_t cpu_runs() { return g_cpu_runs.load(); }

bool supported(int64_t head_dim, int64_t n_head, int64_t n_head_kv, ggml_type k_type, ggml_type v_type, int64_t T) {
    return (head_dim == 128 || head_dim == 256) && n_head_kv > 0 && n_head % n_head_kv == 0 &&
           n_head / n_head_kv <= MAX_GROUP && k_type == GGML_TYPE_F16 && v_type == GGML_TYPE_F16 && T >= 1 &&
           T <= MAX_TOKENS;
}

bool is_gated(const ggml_tensor * node) { return custom_op::function_of(node) == &gated_cpu; }

shape shape_of(const ggml_tensor * dst) {
    shape s;
    s.hd = dst->src[0]->ne[0];
    s.H = dst->src[0]->ne[1];
    s.T = dst->src[0]->ne[2];
    s.Hkv = dst->src[1]->ne[0] / s.hd;
    const op_params p = params_of(dst);
    s.n_kv = p.n_kv;
    s.scale = p.scale;
    return s;
}

int64_t partial_floats(const ggml_tensor * dst) {
    const shape s = shape_of(dst);
    return attention::partial_floats(int(s.hd), int(s.H), int(s.T), int(s.n_kv));
}

ggml_tensor * gated(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k_cache, ggml_tensor * v_cache, int64_t n_kv,
                    ggml_tensor * mask, ggml_tensor * gate, float scale) {
    const int64_t hd = q->ne[0], H = q->ne[1], T = q->ne[2];
    require(q->type == GGML_TYPE_F32 && q->nb[0] == sizeof(float) && q->ne[3] == 1, "q [hd, H, T] F32, contiguous rows");
    require(gate->type == GGML_TYPE_F32 && gate->nb[0] == sizeof(float) && gate->ne[0] == hd && gate->ne[1] == H &&
                gate->ne[2] == T && gate->ne[3] == 1,
            "gate [hd, H, T] F32, contiguous rows");
    require(k_cache->ne[0] % hd == 0 && v_cache->ne[0] == k_cache->ne[0] && k_cache->ne[2] == 1 && v_cache->ne[2] == 1,
            "K and V caches [hd Hkv, n_ctx]");
    const int64_t Hkv = k_cache->ne[0] / hd;
    require(supported(hd, H, Hkv, k_cache->type, v_cache->type, T), "a shape or type the op does not take");
    require(k_cache->nb[0] == 2 && v_cache->nb[0] == 2, "contiguous cache rows");
    // the CUDA kernels read q and the cache rows in 16-byte vectors
    require(q->nb[1] % 16 == 0 && q->nb[2] % 16 == 0 && q->view_offs % 16 == 0, "q heads 16-byte aligned");
    require(k_cache->nb[1] % 16 == 0 && v_cache->nb[1] % 16 == 0 && k_cache->view_offs % 16 == 0 &&
                v_cache->view_offs % 16 == 0,
            "cache rows 16-byte aligned");
    require(n_kv >= 1 && n_kv <= k_cache->ne[1] && n_kv <= v_cache->ne[1] && n_kv <= INT32_MAX, "1 <= n_kv <= cache rows");
    require(mask->type == GGML_TYPE_F16 && mask->nb[0] == 2 && mask->ne[0] >= n_kv && mask->ne[1] >= T,
            "mask [>= n_kv, >= T] F16");
    ggml_tensor * srcs[5] = {q, k_cache, v_cache, mask, gate};
    const int64_t extra = attention::partial_floats(int(hd), int(H), int(T), int(n_kv));
    ggml_tensor * node = ggml_custom_4d(ctx, GGML_TYPE_F32, hd * H * T + extra, 1, 1, 1, srcs, 5, &gated_cpu,
                                        GGML_N_TASKS_MAX, nullptr);
    op_params p;
    p.n_kv = static_cast<int32_t>(n_kv);
    p.scale = scale;
    custom_op::write_params(node, &p, sizeof p);
    return ggml_view_2d(ctx, node, hd * H, T, size_t(hd * H) * sizeof(float), 0);
}

ggml_tensor * unfused(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k_cache, ggml_tensor * v_cache, int64_t n_kv,
                      ggml_tensor * mask, ggml_tensor * gate, float scale) {
    const int64_t hd = q->ne[0], H = q->ne[1], T = q->ne[2], Hkv = k_cache->ne[0] / hd;
    ggml_tensor * kv_k = ggml_view_3d(ctx, k_cache, hd, Hkv, n_kv, ggml_row_size(k_cache->type, hd), k_cache->nb[1], 0);
    ggml_tensor * kv_v = ggml_view_3d(ctx, v_cache, hd, Hkv, n_kv, ggml_row_size(v_cache->type, hd), v_cache->nb[1], 0);
    // [hd, T, H] queries, [hd, n_kv, Hkv] keys and values -> [hd, H, T]
    ggml_tensor * att = ggml_flash_attn_ext(ctx, ggml_permute(ctx, q, 0, 2, 1, 3), ggml_permute(ctx, kv_k, 0, 2, 1, 3),
                                            ggml_permute(ctx, kv_v, 0, 2, 1, 3), mask, scale, 0.0f, 0.0f);
    att = ggml_reshape_2d(ctx, att, hd * H, T);
    return ggml_mul(ctx, att, ggml_sigmoid(ctx, ggml_cont_2d(ctx, gate, hd * H, T)));
}

// One (token, KV head) a unit, units split over the threads: each K and V row converted to float
// once for the unit's G query heads. Per (token, head): the scores' dot products in dim order, the
// softmax's sums in key order; nothing depends on the other tokens.
void gated_cpu(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    const shape s = shape_of(dst);
    const ggml_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2], *mask = dst->src[3], *gate = dst->src[4];
    const int64_t G = s.H / s.Hkv, hd = s.hd, n_kv = s.n_kv;
    std::vector<float> score(static_cast<size_t>(G * n_kv)), row(static_cast<size_t>(hd)),
        acc(static_cast<size_t>(G * hd)), m(static_cast<size_t>(G)), l(static_cast<size_t>(G));
    constexpr float NEG_INF = -std::numeric_limits<float>::infinity();
    for (int64_t u = ith; u < s.T * s.Hkv; u += nth) {
        const int64_t t = u / s.Hkv, kvh = u % s.Hkv;
        const ggml_fp16_t * mrow = at<ggml_fp16_t>(mask, t);
        std::fill(m.begin(), m.end(), NEG_INF);
        for (int64_t j = 0; j < n_kv; ++j) {
            ggml_fp16_to_fp32_row(at<ggml_fp16_t>(k, j) + kvh * hd, row.data(), hd);
            const float mk = ggml_fp16_to_fp32(mrow[j]);
            for (int64_t g = 0; g < G; ++g) {
                const float * qv = at<float>(q, kvh * G + g, t);
                float dot = 0.0f;
                for (int64_t d = 0; d < hd; ++d) dot += qv[d] * row[d];
                const float sc = s.scale * dot + mk;
                score[g * n_kv + j] = sc;
                m[g] = std::fmax(m[g], sc);
            }
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        std::fill(l.begin(), l.end(), 0.0f);
        for (int64_t j = 0; j < n_kv; ++j) {
            bool converted = false;
            for (int64_t g = 0; g < G; ++g) {
                if (m[g] == NEG_INF) continue;  // (every key hidden: zeros)
                const float p = std::exp(score[g * n_kv + j] - m[g]);
                if (p == 0.0f) continue;
                if (!converted) {
                    ggml_fp16_to_fp32_row(at<ggml_fp16_t>(v, j) + kvh * hd, row.data(), hd);
                    converted = true;
                }
                l[g] += p;
                float * a = acc.data() + g * hd;
                for (int64_t d = 0; d < hd; ++d) a[d] += p * row[d];
            }
        }
        for (int64_t g = 0; g < G; ++g) {
            const int64_t h = kvh * G + g;
            const float * gv = at<float>(gate, h, t);
            const float * a = acc.data() + g * hd;
            float * o = static_cast<float *>(dst->data) + (t * s.H + h) * hd;
            for (int64_t d = 0; d < hd; ++d) o[d] = (l[g] > 0.0f ? a[d] / l[g] : 0.0f) / (1.0f + std::exp(-gv[d]));
        }
    }
    if (ith == 0) g_cpu_runs.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace lucebox::kernels::attention
