// dflash runtime pieces: draft weights, the draft's KV cache of committed context, and the
// draft graph (context injection from captured target features + the proposal block).
// Internal to the core; hparams and tensor layout are in lucebox/models.h.
#pragma once

#include <cstdint>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "lucebox/backend_buffers.h"
#include "lucebox/models.h"

namespace lucebox {

struct qwen35_weights;

struct dflash_layer_weights {
    ggml_tensor * attn_norm = nullptr;  // [E]
    ggml_tensor * wq = nullptr;         // [E, H*hd]
    ggml_tensor * wk = nullptr;         // [E, Hkv*hd]
    ggml_tensor * wv = nullptr;         // [E, Hkv*hd]
    ggml_tensor * wo = nullptr;         // [H*hd, E]
    ggml_tensor * q_norm = nullptr;     // [hd]
    ggml_tensor * k_norm = nullptr;     // [hd]
    ggml_tensor * ffn_norm = nullptr;   // [E]
    ggml_tensor * ffn_gate = nullptr;   // [E, n_ff]
    ggml_tensor * ffn_up = nullptr;     // [E, n_ff]
    ggml_tensor * ffn_down = nullptr;   // [n_ff, E]
};

struct dflash_weights {
    ggml_tensor * fc = nullptr;           // [n_target_layers*E, E]
    ggml_tensor * enc_norm = nullptr;     // [E] hidden norm after fc
    ggml_tensor * output_norm = nullptr;  // [E]
    ggml_tensor * token_embd = nullptr;   // [E, V] the draft's own or the target's
    ggml_tensor * output = nullptr;       // [E, V] the draft's own head or the target's
    std::vector<dflash_layer_weights> layers;
};

dflash_weights bind_dflash_weights(const dflash_hparams & hp, const tensor_store & store, const qwen35_weights & target);

// The draft's KV cache: per layer K/V rows for every committed position (from target features),
// plus the rows of the current proposal block.
struct dflash_state {
    uint32_t kv_size = 0;
    std::vector<ggml_tensor *> k;  // [Hkv*hd, kv_size]
    std::vector<ggml_tensor *> v;  // [Hkv*hd, kv_size]
    tensor_store store;

    static dflash_state allocate(const dflash_hparams & hp, uint32_t kv_size, ggml_type type_k, ggml_type type_v,
                                 ggml_backend_buffer_type_t buft, ggml_backend_dev_t dev);
};

struct dflash_inputs {
    ggml_tensor * ctx_ring_rows = nullptr;  // [n_inject] I32: feature ring rows of the new context positions
    ggml_tensor * ctx_pos = nullptr;        // [n_inject] I32: their positions
    ggml_tensor * ctx_kv_rows = nullptr;    // [n_inject] I64: their draft cache rows (= positions)
    ggml_tensor * block_tokens = nullptr;   // [B] I32: last token, then MASK x (B-1)
    ggml_tensor * block_pos = nullptr;      // [B] I32
    ggml_tensor * block_kv_rows = nullptr;  // [B] I64
    ggml_tensor * kq_mask = nullptr;        // [n_kv, B] F16: dflash_block_mask(hp, false, ...)
    ggml_tensor * kq_mask_swa = nullptr;    // [n_kv, B] F16: dflash_block_mask(hp, true, ...) (SWA layers)
    // where the masks are built in the graph (kernels/range_mask.h; else they are inputs and these null):
    ggml_tensor * kq_ranges = nullptr;      // [2, B] I32: dflash_block_ranges(hp, false, ...)
    ggml_tensor * kq_ranges_swa = nullptr;  // [2, B] I32: dflash_block_ranges(hp, true, ...)
};

// The proposal block's attention mask for the full layers (swa = false) or the SWA layers
// (swa = true; needs hp.n_swa > 0): [n_kv, block] F16, row i (block position n_past + i) 0 where the
// key is visible and -inf elsewhere. Keys [0, n_past) are context, [n_past, n_past + block) the
// block, the rest padding. Full layers see the whole context; SWA layers the window of hp.swa_kind
// (per_query: key k visible to the row at q when q - k < n_swa, the block's keys too; last_context:
// the last n_swa context keys).
// The block is bidirectional unless hp.causal, or unless the layer is SWA of kind last_context.
// Written into `mask` (resized): a vector the caller keeps from step to step, so that a step writes
// into pages already mapped (bench/probes/mask_staging.cpp); whatever it held before is overwritten.
void dflash_block_mask(const dflash_hparams & hp, bool swa, uint32_t n_past, uint32_t block, uint32_t n_kv,
                       std::vector<ggml_fp16_t> & mask);
// The same mask as one visible key range a row, [2, block] I32 (row i: first visible key, one past
// the last), the input of a mask built in the graph (kernels/range_mask.h); dflash_block_mask is its
// range_mask::fill.
std::vector<int32_t> dflash_block_ranges(const dflash_hparams & hp, bool swa, uint32_t n_past, uint32_t block);

struct dflash_graph {
    ggml_cgraph * gf = nullptr;
    dflash_inputs in;
    ggml_tensor * argmax = nullptr;  // [B-1] I32: proposals for block positions 1..B-1
    ggml_tensor * logits = nullptr;  // [V, B-1] F32
    // with top_k > 0 (tree speculation): per proposal position the top_k token ids (in no particular
    // order) and their softmax probabilities; only these 2 * top_k * (B-1) numbers reach the host
    ggml_tensor * topk_ids = nullptr;    // [top_k, B-1] I32
    ggml_tensor * topk_probs = nullptr;  // [1, top_k, B-1] F32
};

// Injects K/V for `n_inject` newly committed positions (features gathered from the target's
// feature rings, one per draft target layer, in target_layers order), then, if block_size > 0,
// runs the proposal block attending to cache rows [0, n_kv). Either part may be empty.
dflash_graph build_dflash_graph(ggml_context * ctx, const dflash_hparams & hp, const dflash_weights & w,
                                const dflash_state & st, const std::vector<ggml_tensor *> & feature_rings,
                                uint32_t n_inject, uint32_t block_size, uint32_t n_kv, uint32_t n_ctx_orig,
                                uint32_t top_k = 0);

}  // namespace lucebox
