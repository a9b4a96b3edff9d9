// A gated full-attention layer's attention for a few tokens (decode, a chain or DDTree verify) as
// one fused graph op instead of ggml's flash attention (and its fixup), the cont of the gate, its
// sigmoid and the product with it:
//
//   out[:, h, t] = sum_j softmax_j(scale * q[:, h, t] . K[:, j, h / G] + mask[j, t]) V[:, j, h / G]
//                  * sigmoid(gate[:, h, t])
//
// (G = H / Hkv query heads share a KV head, as ggml_flash_attn_ext maps them; j < n_kv, the cache
// rows in view; mask values -inf hide a row, a tree's ancestor mask included). GGML_OP_CUSTOM: the
// CPU backend runs gated_cpu below (the reference), ggml's CUDA backend hands the node to lucebox's
// kernels (attention_step.cuh, through ggml patch 0007's custom-op hook). A token's result does not
// depend on how many tokens the op has on the CPU (a decode step and a verify of the same token
// compute the same bits); on CUDA it is the same bits for every T >= 2 and, on devices of compute
// capability >= 8.0 (the tensor-core verify kernel: q and P in f16), within that rounding of the
// decode step's. Plain C++: compiled in every build.
#pragma once

#include <cstdint>

#include "attention_split.h"
#include "ggml.h"

namespace lucebox::kernels::attention {

// Most tokens the op takes (a decode, a verify of up to 64 nodes); longer batches (prefill) run
// ggml's flash attention.
constexpr int64_t MAX_TOKENS = 64;
// Most query heads sharing a KV head (the 27B's 6).
constexpr int64_t MAX_GROUP = 8;

// Whether the op takes this layer: head size 128 or 256, F16 K and V caches, H a multiple of Hkv
// with at most MAX_GROUP query heads a KV head, 1..MAX_TOKENS tokens. Else ggml's ops run.
bool supported(int64_t head_dim, int64_t n_head, int64_t n_head_kv, ggml_type k_type, ggml_type v_type, int64_t T);

// Not used by the model: tests/cpp/bench_attention on an H200 (sixteenth session, docs/benchmarks.md)
// measured ggml's flash attention and gate ops faster at every T in 1..64 and n_kv in 256..8192 (one
// token over 256 rows 9.7 against 11.5 us a layer, 16 tokens over 256 rows 17.7 against 22.8): these
// kernels score on CUDA cores. Kept, with their tests and bench_attention, as the base of a
// tensor-core kernel for verifies; the model takes an op again only where bench_attention shows it
// faster.

// The op. q [hd, H, T] F32 with contiguous rows (head and token strides multiples of 16 bytes: the
// roped queries);
// k_cache, v_cache [hd Hkv, n_ctx] F16 (rows nb[1] apart; the first n_kv rows are read, KV head i
// at values i hd .. i hd + hd - 1 of a row); mask [>= n_kv, >= T] F16 (row t for token t, as
// ggml_flash_attn_ext's); gate [hd, H, T] F32 with contiguous rows (a strided view of the query
// projection). Returns [hd H, T] F32: a view of the node, whose values after the output are the
// CUDA kernels' chunk sums (attention_split.h).
ggml_tensor * gated(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k_cache, ggml_tensor * v_cache, int64_t n_kv,
                    ggml_tensor * mask, ggml_tensor * gate, float scale);

// ggml's own ops for the same result, with the same arguments and result shape: flash attention over
// the caches' first n_kv rows (any cache type ggml's flash attention takes), then the gate's cont,
// sigmoid and product. The model's path (see above); the tests' reference.
ggml_tensor * unfused(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k_cache, ggml_tensor * v_cache, int64_t n_kv,
                      ggml_tensor * mask, ggml_tensor * gate, float scale);

// The CPU implementation (ggml_custom_op_t); its address also tells the op apart in a graph.
void gated_cpu(ggml_tensor * dst, int ith, int nth, void * userdata);

// Whether a node is the op.
bool is_gated(const ggml_tensor * node);

// A node's shape and parameters (srcs: 0 q, 1 k_cache, 2 v_cache, 3 mask, 4 gate).
struct shape {
    int64_t hd = 0, H = 0, Hkv = 0, T = 0, n_kv = 0;
    float scale = 0.0f;
};
shape shape_of(const ggml_tensor * dst);
// The node's floats after the output (partial_floats of its shape).
int64_t partial_floats(const ggml_tensor * dst);

// How many of the ops the CPU function has run in this process (tests check the op was used;
// kernels::attention_step_runs counts the CUDA kernels').
uint64_t cpu_runs();

}  // namespace lucebox::kernels::attention
