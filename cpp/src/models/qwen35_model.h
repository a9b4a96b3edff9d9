// qwen35 runtime pieces: weights bound to ggml tensors, per-sequence state, and the forward graph.
// Internal to the core (used by the engine); hparams and tensor layout are in lucebox/models.h.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "lucebox/backend_buffers.h"
#include "../graph/builders.h"
#include "lucebox/models.h"

namespace lucebox {

struct qwen35_layer_weights {
    ggml_tensor * attn_norm = nullptr;            // [E]
    ggml_tensor * post_attention_norm = nullptr;  // [E] (pre-FFN norm)
    ggml_tensor * ffn_gate = nullptr;             // [E, n_ff]
    ggml_tensor * ffn_up = nullptr;               // [E, n_ff]
    ggml_tensor * ffn_down = nullptr;             // [n_ff, E]
    // Gated DeltaNet
    ggml_tensor * ssm_qkv = nullptr;      // [E, conv_dim]   rows: q (key_dim), k (key_dim), v (value_dim)
    ggml_tensor * ssm_gate = nullptr;     // [E, value_dim]  z
    ggml_tensor * ssm_conv1d = nullptr;   // [d_conv, conv_dim]
    ggml_tensor * ssm_dt_bias = nullptr;  // [Hv]
    ggml_tensor * ssm_a = nullptr;        // [Hv]  = -exp(A_log)
    ggml_tensor * ssm_beta = nullptr;     // [E, Hv]
    ggml_tensor * ssm_alpha = nullptr;    // [E, Hv]
    ggml_tensor * ssm_norm = nullptr;     // [dk]
    ggml_tensor * ssm_out = nullptr;      // [value_dim, E]
    // gated attention
    ggml_tensor * wq = nullptr;       // [E, 2*H*hd]  per head: hd query then hd gate
    ggml_tensor * wk = nullptr;       // [E, Hkv*hd]
    ggml_tensor * wv = nullptr;       // [E, Hkv*hd]
    ggml_tensor * wo = nullptr;       // [H*hd, E]
    ggml_tensor * q_norm = nullptr;   // [hd]
    ggml_tensor * k_norm = nullptr;   // [hd]
};

struct qwen35_weights {
    ggml_tensor * token_embd = nullptr;   // [E, V]
    ggml_tensor * output_norm = nullptr;  // [E]
    ggml_tensor * output = nullptr;       // [E, V] (token_embd when tied)
    std::vector<qwen35_layer_weights> layers;
};

qwen35_weights bind_qwen35_weights(const qwen35_hparams & hp, const tensor_store & store);
// The same from tensors spread over several stores (a layer split): `get(name)` returns the tensor
// or throws. Layers for which `want_layer(il)` is false are left null.
qwen35_weights bind_qwen35_weights(const qwen35_hparams & hp, const std::function<ggml_tensor *(const std::string &)> & get,
                                   const std::function<bool(uint32_t)> & want_layer);

// State of one sequence: KV cache of the attention layers, conv + ssm state of the DeltaNet
// layers, and the ring of captured hidden features. Per-layer vectors are indexed by layer
// (null where the layer has no such state).
struct qwen35_state {
    uint32_t kv_size = 0;  // cache capacity in tokens (multiple of the KV padding)
    std::vector<ggml_tensor *> k;     // [Hkv*hd, kv_size] of kv_type_k
    std::vector<ggml_tensor *> v;     // [Hkv*hd, kv_size] of kv_type_v
    std::vector<ggml_tensor *> conv;  // [d_conv-1, conv_dim] F32: the last d_conv-1 conv inputs
    std::vector<ggml_tensor *> ssm;   // [dk*dk, Hv] F32: the recurrent state of each V head, [dk, dk] with
                                      // the k index fastest (2-D so a tensor split deals it by V head)
    std::vector<int32_t> capture_layers;  // layer ids whose *input* is captured (n_layer: final hidden)
    std::vector<ggml_tensor *> ring;  // per capture layer: [E, ring_size] F32
    uint32_t ring_size = 0;
    // Verify checkpoints (speculative decoding), per DeltaNet layer, for up to n_checkpoints tokens:
    // [dk*dk*Hv, n_checkpoints]: state after token T-1-s in column s; null for a layer with
    // inputs_ckpt until a verify needs whole states (a tree, more than delta_net::MAX_TOKENS tokens,
    // a backup: add_state_checkpoints), since its chain verifies keep the fused inputs instead
    std::vector<ggml_tensor *> ssm_ckpt;
    std::vector<ggml_tensor *> conv_ckpt;  // [d_conv-1+n_checkpoints, conv_dim]: the verify batch's conv input
                                           // [carried | batch] (a tree verify: the same channels fastest,
                                           // its first floats as [conv_dim, d_conv-1+T])
    // [(conv_dim + 2 Hv) n_checkpoints] F32: a chain verify's fused inputs (kernels/delta_net_step.h),
    // which the commit re-runs for the kept tokens instead of copying a state; only for layers whose
    // steps run the fused ops (qwen35_fused_layers), else null
    std::vector<ggml_tensor *> inputs_ckpt;
    // [4, n] I64, for a commit's one delta_net::replay_layers node: row i = {inputs_ckpt, ssm,
    // conv_ckpt, conv} addresses of the i-th layer with inputs_ckpt (layer order), written when
    // allocated; null without such layers. A layer split's full state has none: each range's view has
    // its own.
    ggml_tensor * replay_table = nullptr;
    uint32_t n_checkpoints = 0;
    tensor_store store;
    // A layer split's state spans one store per device: the others (store holds the first); and
    // the state checkpoints add_state_checkpoints allocated later.
    std::vector<tensor_store> more_stores;
    // the replay tables' memory (a layer split's: every range's), which clear() leaves as it is
    std::vector<tensor_store> table_stores;

    void clear();  // zero every store but table_stores

    // The DeltaNet layers with a state but no ssm_ckpt (allocated without them); none: a verify may
    // keep whole states.
    std::vector<uint32_t> layers_without_state_checkpoints() const;
    bool has_state_checkpoints() const;
    // Allocates the missing ssm_ckpt (layers with inputs_ckpt, allocated without them) on buft / dev;
    // throws (the state unchanged) when the memory is not there.
    void add_state_checkpoints(const qwen35_hparams & hp, ggml_backend_buffer_type_t buft, ggml_backend_dev_t dev);

    // `layers` (optional, one flag per layer): allocate only these layers' state and the rings of
    // the capture layers they compute (capture n_layer belongs to the last layer); the rest stay null.
    // `fused` (optional, one flag per layer, qwen35_fused_layers): the DeltaNet layers that get
    // inputs_ckpt; with keep_states false, not ssm_ckpt (memory_request::keep_states).
    static qwen35_state allocate(const qwen35_hparams & hp, uint32_t kv_size, ggml_type type_k, ggml_type type_v,
                                 const std::vector<int32_t> & capture_layers, uint32_t ring_size,
                                 uint32_t n_checkpoints, ggml_backend_buffer_type_t buft, ggml_backend_dev_t dev,
                                 const std::vector<bool> * layers = nullptr, const std::vector<bool> * fused = nullptr,
                                 bool keep_states = true);
};

// Per layer: whether it is a DeltaNet layer whose steps run the fused ops of kernels/delta_net_step.h
// (head 128, F32 conv / gate / norm weights, weights where the backend runs the ops). Layers of w
// that are null (another device's range) are false.
std::vector<bool> qwen35_fused_layers(const qwen35_hparams & hp, const qwen35_weights & w);

// Input tensors of one forward graph, filled by the caller before compute.
struct qwen35_inputs {
    ggml_tensor * tokens = nullptr;    // [T] I32
    ggml_tensor * pos = nullptr;       // [T] I32 positions (NEOX), or [4*T] IMRoPE streams (t, h, w = position;
                                       // extra = 0): hparams.rope_reads_positions_only; null without attention layers
    ggml_tensor * kq_mask = nullptr;   // [n_kv, T] F16: 0 where visible, -inf elsewhere: an input, or built
                                       // from kq_ranges in the graph (kernels/range_mask.h)
    ggml_tensor * kq_ranges = nullptr; // [2, T] I32: each row's visible keys [first, end) (a mask built in
                                       // the graph, a tree's with its parents; null where kq_mask is an input)
    ggml_tensor * kv_rows = nullptr;   // [T] I64: cache rows written by this batch (= positions)
    ggml_tensor * ring_rows = nullptr; // [T] I64: feature ring rows (positions mod ring size), if capturing
    ggml_tensor * out_rows = nullptr;  // [n_out] I32: batch rows whose logits are produced (null: all rows)
    // tree verify only (null otherwise; conv_rows/parents only with DeltaNet layers):
    ggml_tensor * parents = nullptr;   // [T] I32: parent node of each batch row, -1 for the root (row 0)
    ggml_tensor * conv_rows = nullptr; // [d_conv*T] I32: per node, its conv window (oldest first) as rows of
                                       // [carried conv state (d_conv-1 rows) | batch rows]; see qwen35_tree_conv_rows
    ggml_tensor * hidden = nullptr;    // [E, T] F32: input hidden state of a layer range not starting at 0
};

// A contiguous range of layers [begin, end) computed by one graph (a layer split runs one per
// device). end == 0 means all layers. The range starting at layer 0 embeds the tokens; a later one
// reads the previous range's output from in.hidden. The range ending at n_layer produces the
// logits; an earlier one returns its output hidden state in qwen35_graph::hidden.
struct qwen35_layer_range {
    uint32_t begin = 0;
    uint32_t end = 0;
};

// The conv-window gather table of a tree verify: for node i (batch row i, parents[i] < i) the
// d_conv inputs ending at node i along its root path, oldest first, as indices into the sequence
// [carried conv state rows 0..d_conv-2 (oldest first) | batch rows at d_conv-1+row]. Shallow nodes
// reach into the carried state. For a chain (parents[i] = i-1) row i's window is [i, i+d_conv).
std::vector<int32_t> qwen35_tree_conv_rows(const std::vector<int32_t> & parents, uint32_t d_conv);

struct qwen35_graph {
    ggml_cgraph * gf = nullptr;
    qwen35_inputs in;
    ggml_tensor * logits = nullptr;  // [V, n_out] F32
    ggml_tensor * argmax = nullptr;  // [n_out] I32 (when requested)
    ggml_tensor * hidden = nullptr;  // [E, T] F32: output of a range that does not end at n_layer
};

// Builds the forward graph of T tokens appended at positions [n_past, n_past+T) whose attention
// sees the first n_kv cache rows. The graph writes KV rows and the feature ring, and either
// updates the DeltaNet conv/ssm state in place (verify = false), or leaves it untouched and writes
// the per-token states into the checkpoints (verify = true, T <= n_checkpoints) so that any prefix
// can be committed afterwards with build_qwen35_commit_graph. `ctx` must be a no_alloc context
// large enough for the graph's tensors.
// tree = true (implies verify): the batch is a draft tree (spec/tree.h) in node order, root first.
// Each node's DeltaNet state and conv window follow its parent (in.parents, in.conv_rows) instead of
// the previous row; checkpoint slot T-1-i holds the state after node i. Attention needs nothing
// new: the caller's positions (n_past + depth) and ancestor-only mask carry the tree. The LM head
// runs once over every node's final hidden row (n_out = T), so no logits are computed twice.
qwen35_graph build_qwen35_graph(ggml_context * ctx, const qwen35_hparams & hp, const qwen35_weights & w,
                                const qwen35_state & st, uint32_t n_tokens, uint32_t n_kv, uint32_t n_out,
                                bool want_argmax, bool verify = false, bool tree = false,
                                qwen35_layer_range range = {});

// A gated attention layer of build_qwen35_graph. x: the layer input [E, T] and its norm (each projection
// normalizes it) -> [E, T]. Writes this batch's K and V rows (in.kv_rows) into k_cache and v_cache
// ([hd * Hkv, n_ctx]) through gf; attends to their first n_kv rows under in.kq_mask; in.pos as
// set_qwen35_inputs writes it. Where hp.rope_reads_positions_only(), q's and k's RMS norm, norm weight
// and rope are consecutive nodes, and k's then its cache write (a VIEW and SET_ROWS): the forms ggml's
// CUDA backend runs as one kernel each (tests/cpp/test_rope.cpp).
ggml_tensor * build_gated_attention(ggml_context * ctx, ggml_cgraph * gf, const qwen35_hparams & hp,
                                    const qwen35_layer_weights & l, ggml_tensor * k_cache, ggml_tensor * v_cache,
                                    const qwen35_inputs & in, uint32_t n_kv, const graph::rms_normed & x, int il);

// (The commit and backup graphs skip layers whose state is null: a layer split builds one per device.)
// Copies every DeltaNet layer's conv and ssm state into checkpoint slot 0 (backup = true), or back
// from it (backup = false): the restore-and-replay rollback, which needs one slot instead of B.
ggml_cgraph * build_qwen35_backup_graph(ggml_context * ctx, const qwen35_hparams & hp, const qwen35_state & st,
                                        bool backup);

// After a verify of n_verified tokens: sets every DeltaNet layer's conv and ssm state to the state
// after verified token `last_kept` (0-based), i.e. commits tokens [0, last_kept] (fast rollback).
// Fills the inputs `g` has (layer-range graphs have a subset) for a batch of T tokens appended at
// n_past: tokens, positions (n_past + i; a tree node: n_past + its depth; in.pos's form), KV rows n_past + i,
// the attention mask over n_kv rows (causal; a tree: the committed context plus the node's
// ancestors and itself; as each row's key range, in.kq_ranges, where the graph builds it),
// feature-ring rows (mod ring_size), the last output row, and for a tree its parents and conv-window
// table. parents: null for a chain, else a tree in batch order (parents[0] = -1, parents[i] < i).
// staging: host memory a host-written mask is written in before its upload, kept by the caller from step to
// step, so that a step writes into pages already mapped, in one pass (bench/probes/mask_staging.cpp,
// [32768, 16] on the 2-core CI machine: 0.2-0.4 ms fresh, 0.03 kept); let go of once far larger than
// a step needs (after a long prefill). sched: the scheduler that allocated g (graph::set: inputs in device
// memory are written by copies queued on the device's stream).
void set_qwen35_inputs(ggml_backend_sched_t sched, const qwen35_graph & g, const qwen35_hparams & hp,
                       const int32_t * tokens, uint32_t n_past, uint32_t T, uint32_t n_kv, uint32_t ring_size,
                       const std::vector<int32_t> * parents, std::vector<ggml_fp16_t> & staging);

// Reads what a computed target graph returns, from `g`'s output tensors (n_out rows of logits
// and argmaxes, n_out = g.logits->ne[1]): all rows' logits ([T, V] row-major) when all_logits;
// else the last row's logits when last_logits and no argmax is asked; argmax_rows (T ids) and
// argmax_last (the last row's id) when given.
std::vector<float> read_qwen35_outputs(const qwen35_graph & g, uint32_t T, bool all_logits, bool last_logits,
                                       int32_t * argmax_last, std::vector<int32_t> * argmax_rows);

ggml_cgraph * build_qwen35_commit_graph(ggml_context * ctx, const qwen35_hparams & hp, const qwen35_state & st,
                                        uint32_t n_verified, uint32_t last_kept);

// The tree commit: after a tree verify of n_verified nodes written at cache rows n_past + node,
// commits the root path `path` (node indices, path[0] = 0 the root, increasing): DeltaNet ssm state =
// node path.back()'s checkpoint; conv state = the last d_conv-1 inputs of [carried conv state | path
// nodes]; the KV rows and feature-ring rows of path node i move from n_past + path[i] to n_past + i.
// The graph is built once per state and reused: what varies per commit (path, n_past, n_verified) is
// in one I32 input, `moves`, filled by set_qwen35_tree_commit_inputs. Rows move as raw 4-byte words
// (each cache is aliased as an F32 tensor of its row bytes), so every KV type is kept bit-exact; all
// rows are read (get_rows) before any is written (set_rows), so the order of the moves is free.
struct qwen35_tree_commit {
    ggml_cgraph * gf = nullptr;  // null: some KV row is not a whole number of 4-byte words (see below)
    // moves [4*n_slots + d_conv] I32 (4*n_slots + 1 without DeltaNet layers):
    //   [0, n_slots)            KV source rows (n_past + path[i]; i >= path length: the root row n_past)
    //   [n_slots, 2*n_slots)    KV destination rows (n_past + i; i >= path length: n_past)
    //   [2*n_slots, 4*n_slots)  the same for the feature ring, mod its size
    //   4*n_slots               the ssm checkpoint slot of path.back()
    //   4*n_slots + 1 + w       the tree conv checkpoint's column (row of [conv_dim, d_conv-1+T]) that
    //                           becomes conv state column w, w < d_conv-1
    ggml_tensor * moves = nullptr;
    uint32_t n_slots = 0;  // = the state's n_checkpoints: the longest path
};

// Builds the tree commit graph of `st` into the no_alloc context `ctx` (the caller allocates it once).
// Returns gf = null when a KV cache row is not a multiple of 4 bytes (q8_0/q4_0/q5_0 with an odd
// number of blocks per row: no Qwen3.5/3.6 shape); build_qwen35_tree_commit_copy_graph then serves.
qwen35_tree_commit build_qwen35_tree_commit_graph(ggml_context * ctx, const qwen35_hparams & hp,
                                                  const qwen35_state & st);

// The values of `g.moves` for one commit (layout above); checks the path.
std::vector<int32_t> qwen35_tree_commit_moves(const qwen35_tree_commit & g, const qwen35_hparams & hp,
                                              const qwen35_state & st, uint32_t n_verified, uint32_t n_past,
                                              const std::vector<int32_t> & path);

// The same commit as a graph of one byte copy per moved row and conv column, built for one commit:
// the fallback where build_qwen35_tree_commit_graph cannot alias the KV rows.
ggml_cgraph * build_qwen35_tree_commit_copy_graph(ggml_context * ctx, const qwen35_hparams & hp,
                                                  const qwen35_state & st, uint32_t n_verified, uint32_t n_past,
                                                  const std::vector<int32_t> & path);

}  // namespace lucebox
