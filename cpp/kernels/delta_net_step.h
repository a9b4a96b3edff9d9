// A Gated DeltaNet layer's step (decode, chain verify: a few tokens, no tree) as two fused graph
// ops instead of ~14 of ggml's (cont, sigmoid, add, softplus, mul, concat, the conv-state copy,
// conv, SiLU, L2 norm, the gated delta net, RMS norm, SiLU x mul):
//
//   inputs:     the projections' q/k/v conv inputs, beta and alpha -> [q | k | v | g | beta] per token
//               (causal conv over the carried window + SiLU, q and k L2-normed per head,
//               beta = sigmoid(beta), g = softplus(alpha + dt_bias) * a); writes the conv window
//   recurrence: the gated delta rule over the tokens from the carried state (value head h reads
//               key head h % Hk, as ggml_gated_delta_net), then RMSNorm(out) * norm_w * SiLU(z);
//               writes the final state, or every token's (a verify's checkpoints)
//
// Both are GGML_OP_CUSTOM nodes: the CPU backend runs the functions below (the reference), ggml's
// CUDA backend hands them to lucebox's kernels (delta_net_step.cuh, through ggml patch 0007's
// custom-op hook). A token's results do not depend on how many tokens the op has (decode and
// verify compute the same bits, on either backend). Plain C++: compiled in every build.
#pragma once

#include <cstdint>

#include "ggml.h"

namespace lucebox::kernels::delta_net {

// Head size the ops take (q, k and v heads alike; the 27B's and every qwen35 GGUF's 128).
constexpr int64_t HEAD = 128;
// Most tokens a step op takes on CUDA (decode, a verify); longer batches there (prefill) run ggml's
// ops. The CPU code takes any number (qwen35.cpp's fused_takes).
constexpr int64_t MAX_TOKENS = 64;
// Longest causal conv the inputs op takes (the CUDA kernel's; every qwen35 GGUF's is 4); longer
// ones run ggml's ops.
constexpr int64_t MAX_D_CONV = 8;

// What a state destination of the recurrence receives.
enum class state_out : int32_t {
    final_state = 0,  // the state after the last token, into slot 0
    every_state = 1,  // the state after token t into slot T-1-t (a verify's checkpoints)
    none = 2,         // nothing (a verify whose commit replays the kept tokens: replay_layers())
};

// What a node carries besides its sources, after ggml's custom-op header in op_params.
struct step_params {
    int32_t n_k_heads = 0;    // Hk (q and k heads); value heads Hv from the shapes
    int32_t window_from = 0;  // inputs: conv window values [window_from, d_conv-1+T) go to the conv destination
    int32_t kept = 0;         // inputs: 1 when the node is a view of `keep` (src[0]; its operands from src[1])
    int32_t state_mode = 0;   // recurrence: a state_out
    int32_t x_tokens = 0;     // recurrence: the tokens of the inputs op's result x (>= n_tokens)
    int32_t n_tokens = 0;     // recurrence: the tokens run (x's first n_tokens)
    float eps = 0.0f;         // inputs: the L2 norm's; recurrence: the gated RMS norm's
    int32_t n_v_heads = 0;    // replay_layers: Hv (the other ops take it from their operands)
    int32_t d_conv = 0;       // replay_layers: the conv's length (a carried window holds d_conv-1 values)
    int32_t conv_src_stride = 0;  // replay_layers: floats from one channel's window source to the next
};

// The inputs op. qkv [(2 Hk + Hv) HEAD, T], beta / alpha [Hv, T] (rows contiguous, any column
// stride: views of one stacked product), conv_state [d_conv-1, conv_dim] and conv_w [d_conv,
// conv_dim] contiguous, dt_bias / a [Hv]; conv_dst [>= d_conv-1+T-window_from, conv_dim] (row
// stride nb[1]) receives each channel's window values from window_from on: the new carried state
// (window_from = T; conv_dst may be conv_state itself) or the whole window (0: a verify's
// checkpoint). Returns one F32 buffer of (conv_dim + 2 Hv) T values in three parts: [conv_dim, T]
// (per token q (Hk HEAD) | k | v (Hv HEAD)), then g [Hv, T], then beta [Hv, T]. keep: null (a
// new tensor of the graph), or a contiguous F32 tensor of exactly that many values that receives
// the result and outlives the graph (a chain verify's checkpoint, for a commit that replays it):
// the node is then a view of keep. tree_rows (a DDTree verify; null for a chain): I32 [d_conv T],
// node t's conv inputs (oldest first) as indices into [carried window (d_conv-1) | the T tokens]
// (qwen35_tree_conv_rows), instead of the d_conv values ending at token t; conv_dst may then be
// null (no window written: the tree commit takes its checkpoint from elsewhere). A chain node's
// window indices t .. t+d_conv-1 give a chain's bits.
ggml_tensor * inputs(ggml_context * ctx, ggml_tensor * qkv, ggml_tensor * beta, ggml_tensor * alpha,
                     ggml_tensor * conv_state, ggml_tensor * conv_w, ggml_tensor * dt_bias, ggml_tensor * a,
                     ggml_tensor * conv_dst, int64_t n_k_heads, int64_t window_from, float eps,
                     ggml_tensor * keep = nullptr, ggml_tensor * tree_rows = nullptr);

// Operand i of an inputs node, in inputs()' order (0 qkv, 1 beta, 2 alpha, 3 conv_state, 4 conv_w,
// 5 dt_bias, 6 a, 7 conv_dst (may be null), 8 tree_rows (null for a chain)), whether or not the node
// writes into a kept tensor.
ggml_tensor * input_operand(const ggml_tensor * dst, int i);

// The recurrence op. x: the inputs op's result for x_tokens >= T tokens; z [Hv HEAD, T] (rows
// contiguous, any column stride); s0 [HEAD HEAD, Hv] contiguous (per head [HEAD, HEAD], k index
// fastest, as ggml's state); norm_w [HEAD]; state_dst [HEAD HEAD Hv, slots] (slot stride nb[1]; may
// be s0 itself) receives what `mode` says (every_state: T <= slots). Returns [Hv HEAD, T] F32:
// RMSNorm(o) * norm_w * SiLU(z). parents (a DDTree verify, mode every_state; null for a chain): I32
// [T], node t starts from its parent's state (slot T-1-parents[t], or s0 for -1) instead of token
// t-1's: a node's results are the bits of decode steps along its path.
ggml_tensor * recurrence(ggml_context * ctx, ggml_tensor * x, int64_t x_tokens, ggml_tensor * z, ggml_tensor * s0,
                         ggml_tensor * norm_w, ggml_tensor * state_dst, int64_t n_k_heads, state_out mode, float eps,
                         ggml_tensor * parents = nullptr);

// A chain commit after verifies that kept x (state_out::none): for each of n layers, the same
// recurrence over x's first T tokens for the state only, the final state written over the state
// the verify started from (the same bits as the verify's own state after token T-1), and the conv
// window after those T tokens copied into the layer's conv state. One node and one launch for all
// the layers: layers [REPLAY_COLUMNS, n] I64, in the memory of the backend that computes the node,
// row i = the addresses of layer i's
//   0: x, the inputs op's result for x_tokens tokens;
//   1: state [HEAD HEAD, Hv] F32, contiguous;
//   2: conv window source: channel c's d_conv-1+x_tokens values (the carried window, then the
//      verify's tokens: a verify's conv checkpoint) at c * conv_src_stride floats;
//   3: conv state [d_conv-1, conv_dim] F32, contiguous: receives each channel's source values
//      [T, T + d_conv - 1).
// Every layer has n_k_heads key and n_v_heads value heads; no two rows may share a state or a conv
// state. The node is a view of `layers` (it writes the states and conv states in place; nothing
// else).
constexpr int64_t REPLAY_COLUMNS = 4;
ggml_tensor * replay_layers(ggml_context * ctx, ggml_tensor * layers, int64_t x_tokens, int64_t T, int64_t n_k_heads,
                            int64_t n_v_heads, int64_t d_conv, int64_t conv_src_stride);

// The CPU implementations (ggml_custom_op_t); their addresses also tell the ops apart in a graph.
void inputs_cpu(ggml_tensor * dst, int ith, int nth, void * userdata);
void recurrence_cpu(ggml_tensor * dst, int ith, int nth, void * userdata);
void replay_layers_cpu(ggml_tensor * dst, int ith, int nth, void * userdata);

// How many of the ops the CPU functions have run in this process (tests check the ops were used;
// kernels::delta_net_step_runs counts the CUDA kernels').
uint64_t cpu_runs();

// The node's step_params (dst made by inputs(), recurrence() or replay_layers()).
step_params params_of(const ggml_tensor * dst);

// Which op a node is: 1 inputs, 2 recurrence, 3 replay_layers, 0 none of them.
int op_of(const ggml_tensor * node);

// The ops' shapes, from a node's sources.
struct shape {
    int64_t T = 0, Hk = 0, Hv = 0, conv_dim = 0, key_dim = 0, d_conv = 0;
};
shape shape_of(const ggml_tensor * dst);

}  // namespace lucebox::kernels::delta_net
