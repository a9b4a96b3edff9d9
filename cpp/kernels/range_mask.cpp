// The range mask op (range_mask.h): graph node, host fill and the CPU function.
#include "range_mask.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>

#include "custom_op.h"
#include "lucebox/errors.h"

namespace lucebox::kernels::range_mask {
namespace {
std::atomic<uint64_t> g_cpu_runs{0};
std::atomic<bool> g_enabled{true};
}  // namespace

uint64_t cpu_runs() { return g_cpu_runs.load(); }
void set_enabled(bool enabled) { g_enabled.store(enabled); }
bool enabled() { return g_enabled.load(); }

void fill(const int32_t * ranges, int64_t n_kv, int64_t first, int64_t last, ggml_fp16_t * out, int64_t T,
          const int32_t * parents) {
    const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), hidden = ggml_fp32_to_fp16(-INFINITY);
    for (int64_t t = first; t < last; ++t) {
        const int64_t lo = std::clamp<int64_t>(ranges[2 * t], 0, n_kv);
        const int64_t hi = std::clamp<int64_t>(ranges[2 * t + 1], lo, n_kv);
        ggml_fp16_t * row = out + t * n_kv;
        std::fill(row, row + lo, hidden);
        std::fill(row + lo, row + hi, zero);
        std::fill(row + hi, row + n_kv, hidden);
        if (parents == nullptr) continue;
        for (int64_t j = 0; j < T && hi + j < n_kv; ++j)  // the node and its ancestors
            if (on_path(parents, T, t, j)) row[hi + j] = zero;
    }
}

void range_mask_cpu(ggml_tensor * dst, int ith, int nth, void * /*userdata*/) {
    if (ith == 0) g_cpu_runs.fetch_add(1, std::memory_order_relaxed);
    const int64_t T = dst->ne[1], per = (T + nth - 1) / nth;
    const int32_t * parents = dst->src[1] != nullptr ? static_cast<const int32_t *>(dst->src[1]->data) : nullptr;
    fill(static_cast<const int32_t *>(dst->src[0]->data), dst->ne[0], std::min<int64_t>(T, ith * per),
         std::min<int64_t>(T, (ith + 1) * per), static_cast<ggml_fp16_t *>(dst->data), T, parents);
}

ggml_tensor * build(ggml_context * ctx, ggml_tensor * ranges, int64_t n_kv, ggml_tensor * parents) {
    if (ranges->type != GGML_TYPE_I32 || ranges->ne[0] != 2 || ranges->ne[2] != 1 || ranges->ne[3] != 1 ||
        !ggml_is_contiguous(ranges) || n_kv <= 0) {
        throw error("internal: range_mask::build needs contiguous I32 ranges [2, T] and n_kv > 0, got [" +
                    std::to_string(ranges->ne[0]) + ", " + std::to_string(ranges->ne[1]) + "], n_kv " +
                    std::to_string(n_kv));
    }
    if (parents != nullptr && (parents->type != GGML_TYPE_I32 || ggml_nelements(parents) != ranges->ne[1] ||
                               !ggml_is_contiguous(parents))) {
        throw error("internal: range_mask::build needs a tree's parents as I32 [T], contiguous");
    }
    ggml_tensor * srcs[2] = {ranges, parents};
    return ggml_custom_4d(ctx, GGML_TYPE_F16, n_kv, ranges->ne[1], 1, 1, srcs, parents != nullptr ? 2 : 1,
                          &range_mask_cpu, GGML_N_TASKS_MAX, nullptr);
}

bool is_range_mask(const ggml_tensor * node) { return custom_op::function_of(node) == &range_mask_cpu; }

}  // namespace lucebox::kernels::range_mask
