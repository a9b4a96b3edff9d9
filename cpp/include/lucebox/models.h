// Hyperparameters and tensor layouts of the supported GGUF architectures:
//   qwen35  - the Qwen3.5/3.6 hybrid target (Gated DeltaNet + gated attention), src/models/qwen35.cpp
//   dflash  - the DFlash block-diffusion draft, src/models/dflash.cpp, in either GGUF schema:
//             upstream llama.cpp's `dflash` arch, or the original lucebox `qwen35-dflash-draft`
//             (alias `dflash-draft`) arch; both map onto the same hparams, weights and graph
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
    // Values per token of a DeltaNet layer's fused step inputs (q | k | v, then g and beta per value
    // head; cpp/kernels/delta_net_step.h): what a chain verify keeps for a replayed commit.
    uint32_t fused_inputs_dim() const { return conv_dim() + 2 * ssm_n_v_heads; }
    // Whether the DeltaNet layers have the shape the fused step ops take (heads of 128 keys and
    // values, a conv of at most 8): then they run them where their weights allow (qwen35_fused_layers).
    bool fused_delta_net_shape() const;
    uint32_t n_attention_layers() const;
    uint32_t n_recurrent_layers() const { return n_layer - n_attention_layers(); }
    // Whether every rotated pair's IMRoPE section reads the t, h or w stream, none the extra one. Text
    // positions are the same in t, h and w (and 0 in extra), so the rotation is then ggml's NEOX rope of
    // the positions, bit for bit (the same angles, the same pairs), which ggml's CUDA backend fuses with
    // the q / k norms before it and the K cache write after it (qwen35.cpp's build_gated_attention).
    bool rope_reads_positions_only() const;

    // Throws config_error naming the first inconsistent value.
    void validate() const;
};

// The GGUF schemas a DFlash draft can come in.
enum class dflash_schema : uint8_t {
    upstream,  // llama.cpp `dflash`: fc.weight, enc.output_norm.weight, dflash.target_layers (layer inputs)
    lucebox,   // original lucebox `qwen35-dflash-draft`: dflash.fc.weight, dflash.hidden_norm.weight,
               // dflash.target_layer_ids (layer outputs, optional), no embedding/head of its own
};

// How the sliding-window (SWA) layers of a draft see the context and the proposal block.
enum class dflash_swa_kind : uint8_t {
    per_query,     // upstream: block row at position q sees context keys k with q - k < n_swa; the block
                   // is bidirectional unless `causal`
    last_context,  // lucebox: every block row sees the last n_swa context positions [n_past - n_swa,
                   // n_past), and the block is causal (for the SWA layers only)
};

// File names of the tensors whose spelling depends on the schema (and, in the lucebox schema, on
// which alias the file uses). ffn_norm is the per-layer suffix after "blk.<i>.".
struct dflash_tensor_names {
    std::string fc = "fc.weight";                   // lucebox: dflash.fc.weight | dflash_fc.weight
    std::string enc_norm = "enc.output_norm.weight";  // lucebox: dflash.hidden_norm.weight | dflash_hidden_norm.weight
    std::string ffn_norm = "ffn_norm.weight";       // lucebox alias: post_attention_norm.weight
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
    // lucebox schema without dflash.target_layer_ids: how many ids validate_draft_for_target derives
    // from the target's layer count (target_layers is empty until then); 0 otherwise
    uint32_t n_deferred_target_layers = 0;
    bool causal = false;         // causal attention inside the proposal block (default: bidirectional)
    uint32_t n_swa = 0;          // sliding window of the SWA layers (0: none)
    std::vector<bool> is_swa;    // per layer, when n_swa > 0: sees only the context window of swa_kind
    dflash_swa_kind swa_kind = dflash_swa_kind::per_query;
    uint32_t n_vocab = 0;        // rows of the draft's own embedding/head; 0 when shared with the target
    bool has_token_embd = false;
    bool has_output = false;
    dflash_schema schema = dflash_schema::upstream;
    dflash_tensor_names names;   // as stored in the file (set_schema gives the schema's primary names)

    // Number of captured target layers fc consumes: fc is [n_target_layers() * n_embd, n_embd].
    uint32_t n_target_layers() const {
        return target_layers.empty() ? n_deferred_target_layers : static_cast<uint32_t>(target_layers.size());
    }
    // Sets schema, its primary tensor names and its SWA semantics.
    void set_schema(dflash_schema s);

    void validate() const;
};

const char * dflash_schema_name(dflash_schema s);  // "upstream" | "lucebox"
const char * dflash_swa_kind_name(dflash_swa_kind k);  // "per_query" | "last_context"

// The original lucebox default of the captured target layers (when a draft has no
// target_layer_ids): output ids 1 + k * step, step = (n_layer_target - 2) / (n - 1), returned in
// our convention (layer inputs: output id + 1). Throws draft_mismatch_error when the target has too
// few layers to give n distinct ids.
std::vector<int32_t> dflash_default_target_layers(uint32_t n, uint32_t n_layer_target);

// Read and validate the metadata and tensors of a file. Throw gguf_error (or unsupported_error
// for known-but-unsupported variants such as qwen35moe, DFlash2, DSpark).
qwen35_hparams read_qwen35(const gguf_file & file);
dflash_hparams read_dflash(const gguf_file & file);

// Expected tensors of an architecture at given hyperparameters.
std::vector<tensor_spec> qwen35_tensor_specs(const qwen35_hparams & hp);
// Weights that multiply one input, to store as stacks (tensor_store::load): per DeltaNet layer
// attn_qkv, attn_gate, ssm_beta, ssm_alpha; per attention layer attn_q, attn_k, attn_v.
std::vector<std::vector<std::string>> qwen35_projection_stacks(const qwen35_hparams & hp);
std::vector<tensor_spec> dflash_tensor_specs(const dflash_hparams & hp);

// Checks that a draft can serve a target: hidden size, target layer ids in range, vocabulary
// (size, mask token, and token strings when both files carry them). Throws draft_mismatch_error.
// Completes what depends on the target: a lucebox-schema draft without target_layer_ids gets its
// ids from dflash_default_target_layers (draft.target_layers is filled in, n_deferred cleared).
void validate_draft_for_target(const gguf_file & target_file, const qwen35_hparams & target,
                               const gguf_file & draft_file, dflash_hparams & draft);

}  // namespace lucebox
