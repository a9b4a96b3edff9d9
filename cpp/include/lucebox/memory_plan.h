// Memory needed to run a target (and optionally a DFlash draft) at a context length, computed
// from hyperparameters alone, so it can be printed before anything is allocated.
// Compute buffers (graph intermediates) are not included; they depend on the backend.
#pragma once

#include <cstdint>
#include <string>

#include "ggml.h"

namespace lucebox {

struct qwen35_hparams;
struct dflash_hparams;

struct memory_request {
    uint32_t n_ctx = 4096;       // tokens of context per sequence
    uint32_t n_seq = 1;          // sequences held at once
    ggml_type kv_type_k = GGML_TYPE_F16;
    ggml_type kv_type_v = GGML_TYPE_F16;
    uint32_t verify_tokens = 16;  // tokens per verify forward (checkpoint slots per sequence)
    // Whether verifies keep every token's whole DeltaNet state: tree verifies, the replay rollback's
    // one backup (and always verifies of more than the fused step's 64 tokens). False: chain
    // verifies, where DeltaNet layers of the fused step's shape (fused_delta_net_shape) keep a
    // token's fused inputs instead, which the commit re-runs.
    bool keep_states = true;
    uint32_t ubatch = 512;        // prefill micro-batch (feature ring must hold one)
};

struct memory_plan {
    uint64_t target_weight_bytes = 0;
    uint64_t draft_weight_bytes = 0;
    uint64_t kv_bytes_per_token = 0;          // target attention layers, K + V
    uint64_t kv_bytes = 0;                    // n_ctx * n_seq tokens
    uint64_t conv_state_bytes_per_seq = 0;    // DeltaNet conv windows, F32
    uint64_t ssm_state_bytes_per_seq = 0;     // DeltaNet recurrent state, F32
    uint64_t recurrent_bytes = 0;             // (conv + ssm) * n_seq
    uint64_t checkpoint_bytes_per_token = 0;  // per verified token: its conv input, and its state or fused inputs
    uint64_t checkpoint_bytes = 0;            // verify_tokens * n_seq snapshots
    uint64_t draft_kv_bytes_per_token = 0;
    uint64_t draft_kv_bytes = 0;
    uint64_t feature_ring_bytes = 0;          // captured target features awaiting the draft, F32
    uint32_t feature_ring_tokens = 0;

    uint64_t total() const {
        return target_weight_bytes + draft_weight_bytes + kv_bytes + recurrent_bytes + checkpoint_bytes +
               draft_kv_bytes + feature_ring_bytes;
    }
};

// `draft` may be null. Weight byte counts are filled in by the caller (they come from the file).
// Throws config_error for a zero context, an unsupported KV type, or a KV row size that the
// type's block does not divide.
memory_plan plan_memory(const qwen35_hparams & target, const dflash_hparams * draft, const memory_request & req);

// Whether the verifies of `req` keep whole DeltaNet states (keep_states, or more verify tokens than
// the fused step takes): what a session allocates the state checkpoints for.
bool keeps_states(const memory_request & req);

// KV cache types lucebox accepts: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1.
ggml_type parse_kv_type(const std::string & name);
bool is_supported_kv_type(ggml_type type);

}  // namespace lucebox
