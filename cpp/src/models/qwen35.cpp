// qwen35: the Qwen3.5 / Qwen3.6 dense hybrid target.
// Layer pattern: Gated DeltaNet layers with a gated full-attention layer every
// `full_attention_interval` layers (or as listed in attention.recurrent_layers).
// GGUF conventions (from the upstream converter): norm gains are stored as 1+w, ssm_a = -exp(A_log),
// V heads are in tiled order (V head h uses K head h % n_k_heads).
#include <algorithm>
#include <sstream>

#include "lucebox/errors.h"
#include "lucebox/gguf_file.h"
#include "lucebox/models.h"

namespace lucebox {

namespace {

const char * ARCH = "qwen35";

std::string key(const char * suffix) { return std::string(ARCH) + "." + suffix; }

// A per-layer hyperparameter stored either as a scalar or as an array over all layers. For an
// array, the entries of the layers selected by `used` must agree (and be non-zero).
uint32_t read_uniform_u32(const gguf_file & f, const std::string & k, const std::vector<bool> & used) {
    const int64_t id = f.has_key(k) ? 0 : -1;
    if (id < 0) {
        return f.get_u32(k);  // throws "missing required key"
    }
    bool is_array = true;
    try {
        f.get_array_size(k);
    } catch (const gguf_error &) {
        is_array = false;
    }
    if (!is_array) {
        return f.get_u32(k);
    }
    const std::vector<int64_t> vals = f.get_int_array(k);
    if (vals.size() < used.size()) {
        throw gguf_error(f.where() + "key '" + k + "' has " + std::to_string(vals.size()) +
                         " entries, expected one per layer (" + std::to_string(used.size()) + ")");
    }
    int64_t value = -1;
    for (size_t i = 0; i < used.size(); ++i) {
        if (!used[i]) {
            continue;
        }
        if (value < 0) {
            value = vals[i];
        } else if (vals[i] != value) {
            throw unsupported_error(f.where() + "key '" + k + "' varies across layers (" + std::to_string(value) +
                                    " vs " + std::to_string(vals[i]) + " at layer " + std::to_string(i) +
                                    "); per-layer sizes are not supported");
        }
    }
    if (value <= 0 || value > 0xffffffffLL) {
        throw gguf_error(f.where() + "key '" + k + "' must be positive, found " + std::to_string(value));
    }
    return static_cast<uint32_t>(value);
}

void require(bool cond, const std::string & what) {
    if (!cond) {
        throw config_error("qwen35 hyperparameters: " + what);
    }
}

}  // namespace

uint32_t qwen35_hparams::n_attention_layers() const {
    return static_cast<uint32_t>(std::count(is_recurrent.begin(), is_recurrent.end(), false));
}

void qwen35_hparams::validate() const {
    require(n_vocab > 0, "n_vocab must be > 0");
    require(n_embd > 0, "n_embd must be > 0");
    require(n_layer > 0, "n_layer must be > 0");
    require(n_ff > 0, "n_ff must be > 0");
    require(is_recurrent.size() == n_layer,
            "the layer pattern has " + std::to_string(is_recurrent.size()) + " entries, expected n_layer = " +
                std::to_string(n_layer));
    require(n_ctx_train > 0, "context_length must be > 0");
    require(rms_eps > 0.0f, "layer_norm_rms_epsilon must be > 0");
    if (n_attention_layers() > 0) {
        require(n_head > 0 && n_head_kv > 0, "attention head counts must be > 0");
        require(n_head % n_head_kv == 0, "head_count (" + std::to_string(n_head) +
                                             ") must be a multiple of head_count_kv (" +
                                             std::to_string(n_head_kv) + ")");
        require(head_dim > 0 && head_dim % 2 == 0, "attention head dim must be even and > 0");
        require(n_rot > 0 && n_rot <= head_dim && n_rot % 2 == 0,
                "rope.dimension_count (" + std::to_string(n_rot) + ") must be even and in (0, head_dim=" +
                    std::to_string(head_dim) + "]");
        int32_t sum = 0;
        for (int32_t s : rope_sections) {
            require(s >= 0, "rope.dimension_sections must be non-negative");
            sum += s;
        }
        require(sum > 0, "rope.dimension_sections must not all be zero");
        require(rope_freq_base > 0.0f, "rope.freq_base must be > 0");
    }
    if (n_recurrent_layers() > 0) {
        require(ssm_d_conv >= 2, "ssm.conv_kernel must be >= 2");
        require(ssm_d_state > 0, "ssm.state_size must be > 0");
        require(ssm_n_k_heads > 0 && ssm_n_v_heads > 0, "ssm head counts must be > 0");
        require(ssm_n_v_heads % ssm_n_k_heads == 0,
                "ssm.time_step_rank (V heads, " + std::to_string(ssm_n_v_heads) +
                    ") must be a multiple of ssm.group_count (K heads, " + std::to_string(ssm_n_k_heads) + ")");
    }
}

qwen35_hparams read_qwen35(const gguf_file & f) {
    const std::string arch = f.get_string("general.architecture");
    if (arch == "qwen35moe") {
        throw unsupported_error(f.where() + "architecture 'qwen35moe' (Qwen3.5 MoE) is not supported yet; "
                                            "expected the dense 'qwen35'");
    }
    if (arch != ARCH) {
        throw gguf_error(f.where() + "architecture is '" + arch + "', expected 'qwen35'");
    }

    qwen35_hparams hp;
    hp.n_ctx_train = f.get_u32(key("context_length"));
    hp.n_embd = f.get_u32(key("embedding_length"));
    const uint32_t n_layer_all = f.get_u32(key("block_count"));
    hp.n_nextn = f.find_u32(key("nextn_predict_layers")).value_or(0);
    if (n_layer_all == 0 || hp.n_nextn >= n_layer_all) {
        throw gguf_error(f.where() + "key '" + key("block_count") + "' = " + std::to_string(n_layer_all) +
                         " must exceed nextn_predict_layers = " + std::to_string(hp.n_nextn));
    }
    hp.n_layer = n_layer_all - hp.n_nextn;

    // Layer pattern: explicit list, else every interval-th layer is attention.
    if (f.has_key(key("attention.recurrent_layers"))) {
        std::vector<bool> all = f.get_bool_array(key("attention.recurrent_layers"));
        if (all.size() != n_layer_all) {
            throw gguf_error(f.where() + "key '" + key("attention.recurrent_layers") + "' has " +
                             std::to_string(all.size()) + " entries, expected block_count = " +
                             std::to_string(n_layer_all));
        }
        hp.is_recurrent.assign(all.begin(), all.begin() + hp.n_layer);
    } else {
        const uint32_t interval = f.find_u32(key("full_attention_interval")).value_or(4);
        if (interval == 0) {
            throw gguf_error(f.where() + "key '" + key("full_attention_interval") + "' must be > 0");
        }
        hp.is_recurrent.resize(hp.n_layer);
        for (uint32_t i = 0; i < hp.n_layer; ++i) {
            hp.is_recurrent[i] = (i + 1) % interval != 0;
        }
    }

    std::vector<bool> all_layers(n_layer_all, false);
    std::fill(all_layers.begin(), all_layers.begin() + hp.n_layer, true);
    std::vector<bool> attn_layers(n_layer_all, false);
    for (uint32_t i = 0; i < hp.n_layer; ++i) {
        attn_layers[i] = !hp.is_recurrent[i];
    }
    const bool any_attn = std::find(attn_layers.begin(), attn_layers.end(), true) != attn_layers.end();

    hp.n_ff = read_uniform_u32(f, key("feed_forward_length"), all_layers);
    hp.rms_eps = f.get_f32(key("attention.layer_norm_rms_epsilon"));
    if (any_attn) {
        hp.n_head = read_uniform_u32(f, key("attention.head_count"), attn_layers);
        hp.n_head_kv = f.has_key(key("attention.head_count_kv"))
                           ? read_uniform_u32(f, key("attention.head_count_kv"), attn_layers)
                           : hp.n_head;
        const uint32_t hd_default = hp.n_head ? hp.n_embd / hp.n_head : 0;
        hp.head_dim = f.find_u32(key("attention.key_length")).value_or(hd_default);
        const uint32_t v_dim = f.find_u32(key("attention.value_length")).value_or(hp.head_dim);
        if (v_dim != hp.head_dim) {
            throw unsupported_error(f.where() + "attention key_length " + std::to_string(hp.head_dim) +
                                    " != value_length " + std::to_string(v_dim) + " is not supported");
        }
        hp.n_rot = f.find_u32(key("rope.dimension_count")).value_or(hp.head_dim);
        hp.rope_freq_base = f.find_f32(key("rope.freq_base")).value_or(10000.0f);
        hp.attn_scale = f.find_f32(key("attention.scale")).value_or(0.0f);
        const std::vector<int64_t> sections = f.get_int_array(key("rope.dimension_sections"));
        if (sections.size() != 4 && sections.size() != 3) {
            throw gguf_error(f.where() + "key '" + key("rope.dimension_sections") + "' has " +
                             std::to_string(sections.size()) + " entries, expected 4");
        }
        for (size_t i = 0; i < sections.size(); ++i) {
            if (sections[i] < 0 || sections[i] > 1 << 20) {
                throw gguf_error(f.where() + "key '" + key("rope.dimension_sections") + "' entry " +
                                 std::to_string(i) + " = " + std::to_string(sections[i]) + " is out of range");
            }
            hp.rope_sections[i] = static_cast<int32_t>(sections[i]);
        }
    }
    if (hp.n_recurrent_layers() > 0) {
        hp.ssm_d_conv = f.get_u32(key("ssm.conv_kernel"));
        hp.ssm_d_state = f.get_u32(key("ssm.state_size"));
        hp.ssm_n_v_heads = f.get_u32(key("ssm.time_step_rank"));
        hp.ssm_n_k_heads = f.get_u32(key("ssm.group_count"));
        const uint32_t inner = f.get_u32(key("ssm.inner_size"));
        if (inner != hp.ssm_d_state * hp.ssm_n_v_heads) {
            throw gguf_error(f.where() + "key '" + key("ssm.inner_size") + "' = " + std::to_string(inner) +
                             ", expected state_size * time_step_rank = " +
                             std::to_string(hp.ssm_d_state * hp.ssm_n_v_heads));
        }
    }

    const gguf_tensor_entry * embd = f.find_tensor("token_embd.weight");
    if (embd == nullptr) {
        throw gguf_error(f.where() + "missing tensor 'token_embd.weight'");
    }
    if (embd->ne[1] <= 0 || embd->ne[1] > 0x7fffffff) {
        throw gguf_error(f.where() + "tensor 'token_embd.weight' has an invalid vocabulary dimension " +
                         embd->shape_string());
    }
    hp.n_vocab = static_cast<uint32_t>(embd->ne[1]);
    hp.has_output = f.find_tensor("output.weight") != nullptr;
    if (f.has_key("tokenizer.ggml.tokens")) {
        const size_t n_tokens = f.get_array_size("tokenizer.ggml.tokens");
        if (n_tokens != hp.n_vocab) {
            throw gguf_error(f.where() + "key 'tokenizer.ggml.tokens' has " + std::to_string(n_tokens) +
                             " tokens but token_embd.weight has " + std::to_string(hp.n_vocab) + " rows");
        }
    }

    try {
        hp.validate();
    } catch (const config_error & e) {
        throw gguf_error(f.where() + e.what());
    }
    check_tensors(f, qwen35_tensor_specs(hp));
    return hp;
}

std::vector<tensor_spec> qwen35_tensor_specs(const qwen35_hparams & hp) {
    using R = tensor_role;
    const int64_t E = hp.n_embd, V = hp.n_vocab;
    std::vector<tensor_spec> s;
    s.push_back({"token_embd.weight", {E, V}, R::embedding});
    s.push_back({"output_norm.weight", {E}, R::norm});
    s.push_back({"output.weight", {E, V}, R::matrix, /*required=*/false});
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        s.push_back({p + "attn_norm.weight", {E}, R::norm});
        if (hp.is_recurrent[il]) {
            const int64_t conv = hp.conv_dim(), vd = hp.value_dim(), hv = hp.ssm_n_v_heads;
            s.push_back({p + "attn_qkv.weight", {E, conv}, R::matrix});
            s.push_back({p + "attn_gate.weight", {E, vd}, R::matrix});
            s.push_back({p + "ssm_conv1d.weight", {hp.ssm_d_conv, conv}, R::conv});
            s.push_back({p + "ssm_dt.bias", {hv}, R::vector});
            s.push_back({p + "ssm_a", {hv}, R::vector});
            s.push_back({p + "ssm_beta.weight", {E, hv}, R::matrix});
            s.push_back({p + "ssm_alpha.weight", {E, hv}, R::matrix});
            s.push_back({p + "ssm_norm.weight", {hp.ssm_d_state}, R::norm});
            s.push_back({p + "ssm_out.weight", {vd, E}, R::matrix});
        } else {
            const int64_t hd = hp.head_dim, q = 2 * hp.n_head * hd, kv = hp.n_head_kv * hd;
            s.push_back({p + "attn_q.weight", {E, q}, R::matrix});  // per head: hd query then hd gate
            s.push_back({p + "attn_k.weight", {E, kv}, R::matrix});
            s.push_back({p + "attn_v.weight", {E, kv}, R::matrix});
            s.push_back({p + "attn_output.weight", {hp.n_head * hd, E}, R::matrix});
            s.push_back({p + "attn_q_norm.weight", {hd}, R::norm});
            s.push_back({p + "attn_k_norm.weight", {hd}, R::norm});
        }
        s.push_back({p + "post_attention_norm.weight", {E}, R::norm});
        s.push_back({p + "ffn_gate.weight", {E, hp.n_ff}, R::matrix});
        s.push_back({p + "ffn_up.weight", {E, hp.n_ff}, R::matrix});
        s.push_back({p + "ffn_down.weight", {hp.n_ff, E}, R::matrix});
    }
    return s;
}

}  // namespace lucebox
