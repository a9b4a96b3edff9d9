// An attention mask built in the graph from each query row's visible key range, instead of written on
// the host and uploaded:
//
//     mask[t][k] = 0 if ranges[t][0] <= k < ranges[t][1], else -inf       (F16 [n_kv, T])
//
// from ranges I32 [2, T] (8 T bytes to upload, not 2 n_kv T: at 32768 keys a 16-token verify's mask
// is 1 MiB, a 512-token prefill micro-batch's at 131072 keys 128 MiB). Every mask of a chain (a
// decode step, a chain verify, a prefill micro-batch: row t sees keys 0 .. its position) and of the
// DFlash draft (context window, then its block) is one range per row. A tree's (a DDTree verify of
// T nodes in batch order, parents I32 [T]: parents[0] = -1, parents[t] < t) adds, after the range
// [0, end) of the committed context, the keys end + j of node t's ancestors j and of t itself:
//
//     mask[t][k] = 0 also if k = ranges[t][1] + j, j an ancestor of t or t    (with parents)
//
// A GGML_OP_CUSTOM node: the CPU backend runs range_mask_cpu, ggml's CUDA backend lucebox's kernel
// (range_mask.cu, through ggml patch 0007's custom-op hook); both write the bits `fill` writes, which
// the host path (a tensor-parallel split, whose meta backend runs no custom op) uploads. Plain C++:
// compiled in every build.
#pragma once

#include <cstdint>

#include "ggml.h"

namespace lucebox::kernels::range_mask {

#if defined(__CUDACC__)
#define LUCEBOX_RANGE_MASK_FN __host__ __device__ __forceinline__
#else
#define LUCEBOX_RANGE_MASK_FN inline
#endif
// Whether a tree's block key j (0 .. T-1) is node t or one of its ancestors: the walk up from t
// (parents[a] < a in a valid tree), at most T steps whatever the table holds. The one test of fill
// and of the CUDA kernel.
LUCEBOX_RANGE_MASK_FN bool on_path(const int32_t * parents, int64_t T, int64_t t, int64_t j) {
    int64_t a = t;
    for (int64_t steps = 0; a > j && a < T && steps <= T; ++steps) a = parents[a];
    return a == j;
}
#undef LUCEBOX_RANGE_MASK_FN

// The mask of T rows of n_kv keys from ranges [2, T] (row t: first visible key, one past the last;
// clipped to [0, n_kv], an empty range hides the whole row) into out [T][n_kv], rows first..last-1;
// parents (T entries, or null): a tree's, whose ancestors' keys follow each row's range (above).
void fill(const int32_t * ranges, int64_t n_kv, int64_t first, int64_t last, ggml_fp16_t * out, int64_t T = 0,
          const int32_t * parents = nullptr);

// The graph node: F16 [n_kv, T] from ranges (I32 [2, T], contiguous; an input the caller fills) and,
// for a tree, its parents (I32 [T] contiguous; null for a chain).
ggml_tensor * build(ggml_context * ctx, ggml_tensor * ranges, int64_t n_kv, ggml_tensor * parents = nullptr);

// Whether node is a range mask node (the CUDA hook's test).
bool is_range_mask(const ggml_tensor * node);

// The CPU function of the node (GGML_OP_CUSTOM: rows split over the threads).
void range_mask_cpu(ggml_tensor * dst, int ith, int nth, void * userdata);

// Off: graphs built from now on take host-written masks everywhere (the A/B of the masks' cost:
// bench_spec.py / bench_target.py --host-masks); on by default.
void set_enabled(bool enabled);
bool enabled();

// How many nodes range_mask_cpu has run in this process (kernels::range_mask_runs counts the CUDA
// kernel's): tests check which path built a mask.
uint64_t cpu_runs();

}  // namespace lucebox::kernels::range_mask
