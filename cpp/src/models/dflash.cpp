// dflash: the DFlash block-diffusion draft in upstream llama.cpp's GGUF schema.
// A Qwen3-style stack whose K/V for committed context come from fc(concat of target hidden
// states at `target_layers`) + hidden norm, and whose queries are the block
// [last token, MASK x (block_size-1)], attending non-causally. Embedding and LM head are the
// target's unless the draft carries its own.
#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "gguf.h"
#include "lucebox/errors.h"
#include "lucebox/gguf_file.h"
#include "lucebox/models.h"

namespace lucebox {

namespace {

const char * ARCH = "dflash";

std::string key(const char * suffix) { return std::string(ARCH) + "." + suffix; }

void require(bool cond, const std::string & what) {
    if (!cond) {
        throw config_error("dflash hyperparameters: " + what);
    }
}

}  // namespace

void dflash_hparams::validate() const {
    require(n_embd > 0, "n_embd must be > 0");
    require(n_layer > 0, "n_layer must be > 0");
    require(n_ff > 0, "n_ff must be > 0");
    require(n_head > 0 && n_head_kv > 0, "head counts must be > 0");
    require(n_head % n_head_kv == 0, "head_count (" + std::to_string(n_head) + ") must be a multiple of head_count_kv (" +
                                         std::to_string(n_head_kv) + ")");
    require(head_dim > 0 && head_dim % 2 == 0, "head dim must be even and > 0");
    require(n_rot > 0 && n_rot <= head_dim && n_rot % 2 == 0, "rope dimension count must be even and <= head dim");
    require(rms_eps > 0.0f, "rms eps must be > 0");
    require(block_size >= 2 && block_size <= 64,
            "block_size " + std::to_string(block_size) + " must be in [2, 64]");
    require(!target_layers.empty(), "target_layers must not be empty");
    for (int32_t l : target_layers) {
        require(l >= 0, "target layer ids must be >= 0");
    }
}

dflash_hparams read_dflash(const gguf_file & f) {
    const std::string arch = f.get_string("general.architecture");
    if (arch != ARCH) {
        throw gguf_error(f.where() + "architecture is '" + arch + "', expected 'dflash' (a DFlash draft)");
    }
    if (f.find_tensor("selector_hidden.weight") != nullptr) {
        throw unsupported_error(f.where() + "DFlash2 drafts (selector_hidden.weight) are not supported yet");
    }
    if (f.find_tensor("markov_w1.weight") != nullptr) {
        throw unsupported_error(f.where() + "DSpark drafts (markov_w1.weight) are not supported yet");
    }
    if (f.find_tensor("d2t") != nullptr) {
        throw unsupported_error(f.where() + "drafts with a reduced vocabulary (d2t) are not supported yet");
    }
    if (f.has_key(key("attention.sliding_window"))) {
        throw unsupported_error(f.where() + "sliding-window DFlash drafts are not supported yet");
    }

    dflash_hparams hp;
    hp.n_embd = f.get_u32(key("embedding_length"));
    hp.n_layer = f.get_u32(key("block_count"));
    hp.n_ff = f.get_u32(key("feed_forward_length"));
    hp.n_head = f.get_u32(key("attention.head_count"));
    hp.n_head_kv = f.find_u32(key("attention.head_count_kv")).value_or(hp.n_head);
    hp.head_dim = f.find_u32(key("attention.key_length")).value_or(hp.n_head ? hp.n_embd / hp.n_head : 0);
    const uint32_t v_dim = f.find_u32(key("attention.value_length")).value_or(hp.head_dim);
    if (v_dim != hp.head_dim) {
        throw unsupported_error(f.where() + "draft key_length " + std::to_string(hp.head_dim) +
                                " != value_length " + std::to_string(v_dim) + " is not supported");
    }
    hp.n_rot = f.find_u32(key("rope.dimension_count")).value_or(hp.head_dim);
    hp.rope_freq_base = f.find_f32(key("rope.freq_base")).value_or(10000.0f);
    hp.rms_eps = f.get_f32(key("attention.layer_norm_rms_epsilon"));
    hp.block_size = f.find_u32(key("block_size")).value_or(16);
    hp.causal = f.has_key(key("attention.causal")) ? f.get_bool(key("attention.causal")) : false;
    hp.mask_token_id = f.get_u32("tokenizer.ggml.mask_token_id");
    for (int64_t l : f.get_int_array(key("target_layers"))) {
        if (l < 0 || l > 1 << 20) {
            throw gguf_error(f.where() + "key '" + key("target_layers") + "' holds an invalid layer id " +
                             std::to_string(l));
        }
        hp.target_layers.push_back(static_cast<int32_t>(l));
    }
    if (const gguf_tensor_entry * t = f.find_tensor("token_embd.weight")) {
        hp.has_token_embd = true;
        hp.n_vocab = static_cast<uint32_t>(std::min<int64_t>(t->ne[1], 0x7fffffff));
    }
    if (const gguf_tensor_entry * t = f.find_tensor("output.weight")) {
        hp.has_output = true;
        const auto nv = static_cast<uint32_t>(std::min<int64_t>(t->ne[1], 0x7fffffff));
        if (hp.has_token_embd && nv != hp.n_vocab) {
            throw gguf_error(f.where() + "tensor 'output.weight' has " + std::to_string(nv) +
                             " rows but token_embd.weight has " + std::to_string(hp.n_vocab));
        }
        hp.n_vocab = nv;
    }

    try {
        hp.validate();
    } catch (const config_error & e) {
        throw gguf_error(f.where() + e.what());
    }
    check_tensors(f, dflash_tensor_specs(hp));
    return hp;
}

std::vector<tensor_spec> dflash_tensor_specs(const dflash_hparams & hp) {
    using R = tensor_role;
    const int64_t E = hp.n_embd, hd = hp.head_dim;
    std::vector<tensor_spec> s;
    s.push_back({"fc.weight", {static_cast<int64_t>(hp.target_layers.size()) * E, E}, R::matrix});
    s.push_back({"enc.output_norm.weight", {E}, R::norm});
    s.push_back({"output_norm.weight", {E}, R::norm});
    if (hp.n_vocab > 0) {
        s.push_back({"token_embd.weight", {E, hp.n_vocab}, R::embedding, /*required=*/false});
        s.push_back({"output.weight", {E, hp.n_vocab}, R::matrix, /*required=*/false});
    }
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        s.push_back({p + "attn_norm.weight", {E}, R::norm});
        s.push_back({p + "attn_q.weight", {E, hp.n_head * hd}, R::matrix});
        s.push_back({p + "attn_k.weight", {E, hp.n_head_kv * hd}, R::matrix});
        s.push_back({p + "attn_v.weight", {E, hp.n_head_kv * hd}, R::matrix});
        s.push_back({p + "attn_output.weight", {hp.n_head * hd, E}, R::matrix});
        s.push_back({p + "attn_q_norm.weight", {hd}, R::norm});
        s.push_back({p + "attn_k_norm.weight", {hd}, R::norm});
        s.push_back({p + "ffn_norm.weight", {E}, R::norm});
        s.push_back({p + "ffn_gate.weight", {E, hp.n_ff}, R::matrix});
        s.push_back({p + "ffn_up.weight", {E, hp.n_ff}, R::matrix});
        s.push_back({p + "ffn_down.weight", {hp.n_ff, E}, R::matrix});
    }
    return s;
}

void validate_draft_for_target(const gguf_file & tf, const qwen35_hparams & target, const gguf_file & df,
                               const dflash_hparams & draft) {
    const std::string pair = "draft '" + df.path() + "' does not match target '" + tf.path() + "': ";
    if (draft.n_embd != target.n_embd) {
        throw draft_mismatch_error(pair + "draft hidden size " + std::to_string(draft.n_embd) +
                                   " != target hidden size " + std::to_string(target.n_embd));
    }
    std::unordered_set<int32_t> seen;
    for (int32_t l : draft.target_layers) {
        if (l < 0 || static_cast<uint32_t>(l) > target.n_layer) {
            throw draft_mismatch_error(pair + "target layer id " + std::to_string(l) +
                                       " is out of range [0, " + std::to_string(target.n_layer) +
                                       "] for a target with " + std::to_string(target.n_layer) + " layers");
        }
        if (!seen.insert(l).second) {
            throw draft_mismatch_error(pair + "target layer id " + std::to_string(l) + " is listed twice");
        }
    }
    if (draft.n_vocab != 0 && draft.n_vocab != target.n_vocab) {
        throw draft_mismatch_error(pair + "draft vocabulary has " + std::to_string(draft.n_vocab) +
                                   " tokens, target has " + std::to_string(target.n_vocab));
    }
    if (draft.mask_token_id >= target.n_vocab) {
        throw draft_mismatch_error(pair + "mask token id " + std::to_string(draft.mask_token_id) +
                                   " is outside the target vocabulary of " + std::to_string(target.n_vocab));
    }
    const char * tokens_key = "tokenizer.ggml.tokens";
    if (tf.has_key(tokens_key) && df.has_key(tokens_key)) {
        const int64_t ti = gguf_find_key(tf.raw(), tokens_key), di = gguf_find_key(df.raw(), tokens_key);
        if (gguf_get_arr_type(tf.raw(), ti) == GGUF_TYPE_STRING && gguf_get_arr_type(df.raw(), di) == GGUF_TYPE_STRING) {
            const size_t n = gguf_get_arr_n(tf.raw(), ti), m = gguf_get_arr_n(df.raw(), di);
            if (n != m) {
                throw draft_mismatch_error(pair + "tokenizers differ: " + std::to_string(m) + " draft tokens vs " +
                                           std::to_string(n) + " target tokens");
            }
            for (size_t i = 0; i < n; ++i) {
                if (std::strcmp(gguf_get_arr_str(tf.raw(), ti, i), gguf_get_arr_str(df.raw(), di, i)) != 0) {
                    throw draft_mismatch_error(pair + "tokenizers differ at token id " + std::to_string(i));
                }
            }
        }
    }
}

}  // namespace lucebox
