// Hyperparameters and tensor layouts of the supported GGUF architectures:
//   qwen35  - the Qwen3.5/3.6 hybrid target (Gated DeltaNet + gated attention), src/models/qwen35.cpp
//   dflash  - the DFlash block-diffusion draft (upstream llama.cpp schema), src/models/dflash.cpp
// Reading validates every value and every tensor; a file that passes can be loaded and run.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "lucebox/tensor_spec.h"

namespace lucebox {

class gguf_file;

struct qwen35_hparams {
    uint32_t n_vocab = 0;        // rows of token_embd
    uint32_t n_ctx_train = 0;    // qwen35.context_length
    uint32_t n_embd = 0;         // hidden size
    uint32_t n_layer = 0;        // trunk layers (block_count - nextn_predict_layers)
    uint32_t n_nextn = 0;        // appended MTP blocks (present in the file, unused by lucebox)
    uint32_t n_ff = 0;           // SwiGLU intermediate size
    // gated full attention
    uint32_t n_head = 0;
    uint32_t n_head_kv = 0;
    uint32_t head_dim = 0;       // key_length == value_length
    uint32_t n_rot = 0;          // rotary dims per head (partial rotary)
    std::array<int32_t, 4> rope_sections{};  // IMRoPE sections (t, h, w, extra)
    float rope_freq_base = 10000.0f;
    float attn_scale = 0.0f;     // 0: 1/sqrt(head_dim)
    float rms_eps = 1e-6f;       // also the L2-norm eps of the DeltaNet q/k
    // gated DeltaNet
    uint32_t ssm_d_conv = 0;     // conv kernel size
    uint32_t ssm_d_state = 0;    // head dim of K and V heads
    uint32_t ssm_n_k_heads = 0;  // ssm.group_count
    uint32_t ssm_n_v_heads = 0;  // ssm.time_step_rank
    std::vector<bool> is_recurrent;  // per trunk layer: true = Gated DeltaNet, false = attention
    bool has_output = false;     // untied LM head present

    uint32_t key_dim() const { return ssm_d_state * ssm_n_k_heads; }
    uint32_t value_dim() const { return ssm_d_state * ssm_n_v_heads; }  // ssm.inner_size
    uint32_t conv_dim() const { return 2 * key_dim() + value_dim(); }
    uint32_t n_attention_layers() const;
    uint32_t n_recurrent_layers() const { return n_layer - n_attention_layers(); }

    // Throws config_error naming the first inconsistent value.
    void validate() const;
};

struct dflash_hparams {
    uint32_t n_embd = 0;         // must equal the target's hidden size
    uint32_t n_layer = 0;
    uint32_t n_ff = 0;
    uint32_t n_head = 0;
    uint32_t n_head_kv = 0;
    uint32_t head_dim = 0;
    uint32_t n_rot = 0;
    float rope_freq_base = 10000.0f;
    float rms_eps = 1e-6f;
    uint32_t block_size = 16;    // tokens per proposal block (last token + block_size-1 masks)
    uint32_t mask_token_id = 0;
    std::vector<int32_t> target_layers;  // target layer inputs whose hidden states feed the draft
    bool causal = false;         // causal attention inside the proposal block (default: bidirectional)
    uint32_t n_swa = 0;          // sliding window of the SWA layers (0: none)
    std::vector<bool> is_swa;    // per layer, when n_swa > 0: sees only context keys with q_pos - k_pos < n_swa
    uint32_t n_vocab = 0;        // rows of the draft's own embedding/head; 0 when shared with the target
    bool has_token_embd = false;
    bool has_output = false;

    void validate() const;
};

// Read and validate the metadata and tensors of a file. Throw gguf_error (or unsupported_error
// for known-but-unsupported variants such as qwen35moe, DFlash2, DSpark).
qwen35_hparams read_qwen35(const gguf_file & file);
dflash_hparams read_dflash(const gguf_file & file);

// Expected tensors of an architecture at given hyperparameters.
std::vector<tensor_spec> qwen35_tensor_specs(const qwen35_hparams & hp);
std::vector<tensor_spec> dflash_tensor_specs(const dflash_hparams & hp);

// Checks that a draft can serve a target: hidden size, target layer ids in range, vocabulary
// (size, mask token, and token strings when both files carry them). Throws draft_mismatch_error.
void validate_draft_for_target(const gguf_file & target_file, const qwen35_hparams & target,
                               const gguf_file & draft_file, const dflash_hparams & draft);

}  // namespace lucebox
