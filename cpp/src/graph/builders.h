// Shared ggml graph builders for the model files. Shapes use ggml order ([ne0, ne1, ...]);
// T = tokens in the batch, E = hidden size. Every intermediate gets a name (layer-suffixed).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ggml.h"

namespace lucebox::graph {

// Nodes one forward graph may hold: the schedulers and graph contexts are sized for it.
constexpr size_t MAX_GRAPH_NODES = 16384;

// Bytes of tensor and graph metadata for a no-alloc context that holds one graph of MAX_GRAPH_NODES.
size_t graph_meta_bytes();

// Names a tensor "<name>-<layer>" (layer < 0: just "<name>") and returns it.
ggml_tensor * named(ggml_tensor * t, const char * name, int layer = -1);

// RMSNorm over ne0, times the gain `w` ([ne0]); w may be null.
ggml_tensor * rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, float eps);

// x / sqrt(sum(x^2) + eps) over ne0 (the L2 norm Qwen's DeltaNet applies to q and k).
ggml_tensor * l2_norm(ggml_context * ctx, ggml_tensor * x, float eps);

// Products of one input x [K, T] with several weights w[i] [K, M_i]: result i is [M_i, T].
// Consecutive weights that tensor_store stacked (views of one tensor at consecutive rows) run as
// one product over their rows, each result then a view of its rows of that product (strided when
// T > 1: see contiguous()); the others run on their own. Per row the values are those of separate
// products.
std::vector<ggml_tensor *> stacked_products(ggml_context * ctx, const std::vector<ggml_tensor *> & w, ggml_tensor * x);

// The rows rms_norm(x, eps) * w of x [E, T] (a layer's normalized input), built where they are used,
// each copy named "<name>-<layer>".
struct rms_normed {
    ggml_tensor * x;
    ggml_tensor * w;  // [E]; may be null
    float eps;
    const char * name;
    int layer;
};

// stacked_products of x's normalized rows, each product with RMS_NORM and MUL nodes of its own: a norm
// whose one consumer is a product is one that a backend can take into the product (lucebox's CUDA
// kernels through ggml patch 0003: no norm kernel, no normalized copy), which a norm shared by the
// products of a split stack is not (a stack splits where its weights' types differ: a Q4_K_M layer's
// Q6_K attn_v beside its Q4_K attn_q and attn_k: 32 norm kernels of 4.9 us a step of the 27B, H100).
// Per row the values are those of one shared norm (the same operations on the same rows); a backend
// that does not take the norm computes it once a product (E values a token).
std::vector<ggml_tensor *> stacked_products(ggml_context * ctx, const std::vector<ggml_tensor *> & w, const rms_normed & x);

// ggml_cpy(src, dst) (same element count and order; dst at most 3-D) that ggml's CUDA backend runs
// as its copy kernel. A same-shape copy of strided rows becomes cudaMemcpy2DAsync there, which is
// slow for narrow rows: a DeltaNet conv window is conv_dim rows of d_conv-1 floats (10240 rows of
// 12 bytes: ~7 us on an H200, once per layer per step). dst is seen with an extra unit dimension,
// which keeps the element order and makes the shapes differ. A contiguous source whose nb[1] is one
// element (a column [1, n]) is flattened first: CUDA's copy would run its transpose kernel, which
// ignores a strided destination's strides.
ggml_tensor * copy_by_kernel(ggml_context * ctx, ggml_tensor * src, ggml_tensor * dst);

// x when it is contiguous, else a contiguous copy (reshapes and unary ops need one).
ggml_tensor * contiguous(ggml_context * ctx, ggml_tensor * x);

// A contiguous [a, b, c] tensor (a roped k [hd, Hkv, T]) as its [a * b, c] rows for a cache write: a VIEW,
// not a reshape, the form in which ggml's CUDA backend runs a norm, rope and SET_ROWS as one kernel.
ggml_tensor * cache_rows(ggml_context * ctx, ggml_tensor * x);

// Whether ggml's CUDA conv (ggml-cuda/ssm-conv.cu) has a kernel for `width` taps: 3, 4, 5, 9 and 15 only;
// it aborts inside a graph on the others, though its supports_op accepts them.
bool cuda_conv_kernel(int64_t width);

// ggml's SSM_CONV (a DeltaNet layer's causal depthwise conv) of sequences x [width-1+T, channels, S] and
// taps w [width, channels] (F32, oldest tap first) -> [channels, T, S]. `pad_to_kernel` (weights in one
// device's memory): a width below 15 without a CUDA kernel runs as the next width with one, zero taps
// prepended to w and as many zeros to x: the same sums, in the same order, but for rounding (ggml's CPU
// conv, for one, multiplies and adds wider rows otherwise than narrow ones). Without it (host weights,
// or a tensor split's, which its devices refuse instead) the op runs as it is: ggml's CPU conv takes any
// width, with upstream's bits.
ggml_tensor * ssm_conv(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, bool pad_to_kernel);

// SwiGLU FFN: down(silu(gate x) * up x). x [E, T] -> [E, T].
ggml_tensor * swiglu_ffn(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w_gate, ggml_tensor * w_up,
                         ggml_tensor * w_down, int layer);

// For a graph kept between computes (engine graph caches, layer-split range graphs), before it is
// allocated again in a scheduler that allocated another graph since: its compute tensors still
// point into the scheduler's buffer of that time, which a larger graph may have replaced (freed),
// and ggml's allocator leaves tensors that have data alone. Marks every tensor of `ctx` (the
// graph's own context: compute tensors, inputs, views; weights and state live in other contexts)
// unallocated, so the allocation gives each a fresh place (views are re-derived).
void forget_allocation(ggml_context * ctx);

}  // namespace lucebox::graph
