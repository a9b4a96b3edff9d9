// dflash: the DFlash block-diffusion draft, read from either GGUF schema (see models.h):
//   upstream - llama.cpp's `dflash` arch (what upstream's converter writes)
//   lucebox  - the original lucebox `qwen35-dflash-draft` / `dflash-draft` arch
// A Qwen3-style stack whose K/V for committed context come from fc(concat of target hidden
// states at `target_layers`) + hidden norm, and whose queries are the block
// [last token, MASK x (block_size-1)], attending non-causally. Embedding and LM head are the
// target's unless the draft carries its own. Both schemas map onto the same hparams and weights;
// the graph does not know which one a draft came from (only the SWA mask semantics differ).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>
#include <utility>

#include "gguf.h"
#include "lucebox/errors.h"
#include "lucebox/gguf_file.h"
#include "lucebox/models.h"
#include "../graph/builders.h"
#include "cuda_kernels.h"
#include "dflash_model.h"
#include "qwen35_model.h"
#include "range_mask.h"

namespace lucebox {

namespace {

const char * ARCH = "dflash";
// Architecture strings of the original lucebox schema (the loader there also took
// gemma4-dflash-draft, a Gemma target's draft, which lucebox does not serve).
const char * const LUCEBOX_ARCHS[] = {"qwen35-dflash-draft", "dflash-draft"};
constexpr uint32_t MAX_LAYER_ID = 1u << 20;

std::string key(const char * suffix) { return std::string(ARCH) + "." + suffix; }

void require(bool cond, const std::string & what) {
    if (!cond) {
        throw config_error("dflash hyperparameters: " + what);
    }
}

bool starts_with(const std::string & s, const char * prefix) { return s.rfind(prefix, 0) == 0; }

bool ends_with(const std::string & s, const char * suffix) {
    const size_t n = std::strlen(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// A feature flag stored as a bool or as an integer (converters differ); false when absent.
bool flag_set(const gguf_file & f, const std::string & k) {
    if (!f.has_key(k)) {
        return false;
    }
    if (gguf_get_kv_type(f.raw(), gguf_find_key(f.raw(), k.c_str())) == GGUF_TYPE_BOOL) {
        return f.get_bool(k);
    }
    return f.get_u32(k) != 0;  // throws gguf_error naming the key for any other type
}

// Features of the original lucebox runtime that change the draft's math and that lucebox does not
// implement: refused by name, never ignored.
void refuse_unsupported_lucebox_features(const gguf_file & f, const std::string & arch) {
    for (const gguf_tensor_entry & t : f.tensors()) {
        const std::string & n = t.name;
        const char * what = nullptr;
        if (starts_with(n, "dflash.aux_hidden_norm.")) {
            what = "per-captured-layer hidden norms before fc (aux_hidden_norm, Laguna drafts)";
        } else if (starts_with(n, "dflash.domino.")) {
            what = "the Domino GRU correction head";
        } else if (starts_with(n, "dflash.dspark.")) {
            what = "the DSpark Markov head";
        } else if (starts_with(n, "blk.") && ends_with(n, ".attn_gate.weight")) {
            what = "the softplus attention output gate (attn_gate)";
        }
        if (what != nullptr) {
            throw unsupported_error(f.where() + "tensor '" + n + "': " + what + " is not supported");
        }
    }
    const std::pair<const char *, const char *> flags[] = {
        {"dflash.context_kv_layer_norm", "normalising the injected context with each layer's attn_norm"},
        {"dflash.domino.enabled", "the Domino GRU correction head"},
        {"dflash.dspark.enabled", "the DSpark Markov head"},
    };
    for (const auto & [suffix, what] : flags) {
        const std::string k = arch + "." + suffix;
        if (flag_set(f, k)) {
            throw unsupported_error(f.where() + "key '" + k + "' is set: " + what + " is not supported");
        }
    }
}

// The original lucebox schema (scripts/convert_dflash_to_gguf.py there). Keys are prefixed by the
// arch; target_layer_ids are the 0-based ids of the layers whose OUTPUT is captured (ours + 1);
// no embedding or LM head (always the target's); SWA layers see the last `sliding_window` context
// positions and are causal inside the block (dflash_swa_kind::last_context).
dflash_hparams read_lucebox_draft(const gguf_file & f, const std::string & arch) {
    auto k = [&](const char * suffix) { return arch + "." + suffix; };
    refuse_unsupported_lucebox_features(f, arch);

    dflash_hparams hp;
    hp.set_schema(dflash_schema::lucebox);
    // the aliases the original loader accepts (the primary spelling wins when both are present;
    // the other one is then an unknown tensor and refused below)
    if (f.find_tensor(hp.names.fc) == nullptr && f.find_tensor("dflash_fc.weight") != nullptr) {
        hp.names.fc = "dflash_fc.weight";
    }
    if (f.find_tensor(hp.names.enc_norm) == nullptr && f.find_tensor("dflash_hidden_norm.weight") != nullptr) {
        hp.names.enc_norm = "dflash_hidden_norm.weight";
    }
    if (f.find_tensor("blk.0.ffn_norm.weight") == nullptr && f.find_tensor("blk.0.post_attention_norm.weight") != nullptr) {
        hp.names.ffn_norm = "post_attention_norm.weight";
    }

    hp.n_embd = f.get_u32(k("embedding_length"));
    hp.n_layer = f.get_u32(k("block_count"));
    if (hp.n_layer > f.tensors().size()) {  // bounds per-layer work on corrupt files
        throw gguf_error(f.where() + "key '" + k("block_count") + "' = " + std::to_string(hp.n_layer) +
                         " exceeds the " + std::to_string(f.tensors().size()) + " tensors in the file");
    }
    hp.n_ff = f.get_u32(k("feed_forward_length"));
    hp.n_head = f.get_u32(k("attention.head_count"));
    hp.n_head_kv = f.get_u32(k("attention.head_count_kv"));
    hp.head_dim = f.get_u32(k("attention.key_length"));
    const uint32_t v_dim = f.find_u32(k("attention.value_length")).value_or(hp.head_dim);
    if (v_dim != hp.head_dim) {
        throw unsupported_error(f.where() + "draft key_length " + std::to_string(hp.head_dim) +
                                " != value_length " + std::to_string(v_dim) + " is not supported");
    }
    hp.n_rot = hp.head_dim;  // the original ropes whole heads (NeoX)
    hp.rope_freq_base = f.get_f32(k("rope.freq_base"));
    hp.rms_eps = f.find_f32(k("attention.layer_norm_rms_epsilon")).value_or(1e-6f);  // the original's constant
    hp.block_size = f.get_u32(k("dflash.block_size"));
    hp.mask_token_id = f.get_u32(k("dflash.mask_token_id"));

    const std::string swa_key = k("attention.sliding_window"), pattern_key = k("attention.sliding_window_pattern");
    const uint32_t window = f.find_u32(swa_key).value_or(0);
    std::vector<bool> pattern;
    if (f.has_key(pattern_key)) {
        pattern = f.get_bool_array(pattern_key);
        if (pattern.size() != hp.n_layer) {
            throw gguf_error(f.where() + "key '" + pattern_key + "' has " + std::to_string(pattern.size()) +
                             " entries, expected block_count = " + std::to_string(hp.n_layer));
        }
    }
    const bool any_swa = std::find(pattern.begin(), pattern.end(), true) != pattern.end();
    if (any_swa && window == 0) {
        // the original runs such layers causal over the whole context; nothing writes such files
        throw unsupported_error(f.where() + "key '" + pattern_key + "' marks sliding-window layers but '" + swa_key +
                                "' is missing or 0");
    }
    if (any_swa) {  // a window without SWA layers changes nothing (as in the original)
        hp.n_swa = window;
        hp.is_swa = pattern;
    }

    // The number of captured target layers is fc's input width / hidden size (the original loader
    // also prefers the weights to dflash.n_target_layers, which some converters fill with the
    // target's layer count).
    const gguf_tensor_entry * fc = f.find_tensor(hp.names.fc);
    if (fc == nullptr) {
        throw gguf_error(f.where() + "missing tensor '" + hp.names.fc + "' (or its alias 'dflash_fc.weight')");
    }
    if (hp.n_embd == 0 || fc->ne[0] <= 0 || fc->ne[0] % hp.n_embd != 0 || fc->ne[0] / hp.n_embd > MAX_LAYER_ID) {
        throw gguf_error(f.where() + "tensor '" + hp.names.fc + "' has shape " + fc->shape_string() +
                         ": its input width " + std::to_string(fc->ne[0]) +
                         " is not a multiple of the hidden size " + std::to_string(hp.n_embd) +
                         " (one hidden state per captured target layer)");
    }
    const auto n_captured = static_cast<uint32_t>(fc->ne[0] / hp.n_embd);
    const std::string ids_key = k("dflash.target_layer_ids");
    if (f.has_key(ids_key)) {
        const std::vector<int64_t> ids = f.get_int_array(ids_key);
        if (ids.size() != n_captured) {
            throw gguf_error(f.where() + "key '" + ids_key + "' has " + std::to_string(ids.size()) + " ids but '" +
                             hp.names.fc + "' takes " + std::to_string(n_captured) + " captured layers (input width " +
                             std::to_string(fc->ne[0]) + " = " + std::to_string(n_captured) + " x hidden " +
                             std::to_string(hp.n_embd) + ")");
        }
        for (int64_t id : ids) {
            if (id < 0 || id >= MAX_LAYER_ID) {
                throw gguf_error(f.where() + "key '" + ids_key + "' holds an invalid layer id " + std::to_string(id));
            }
            hp.target_layers.push_back(static_cast<int32_t>(id + 1));  // output of layer id = input of id + 1
        }
    } else {
        hp.n_deferred_target_layers = n_captured;  // validate_draft_for_target derives them from the target
    }

    try {
        hp.validate();
    } catch (const config_error & e) {
        throw gguf_error(f.where() + e.what());
    }
    const std::vector<tensor_spec> specs = dflash_tensor_specs(hp);
    check_tensors(f, specs);
    std::unordered_set<std::string> known;
    for (const tensor_spec & s : specs) {
        known.insert(s.name);
    }
    for (const gguf_tensor_entry & t : f.tensors()) {
        if (known.count(t.name) == 0) {  // a tensor the graph would not read may change the math
            throw unsupported_error(f.where() + "tensor '" + t.name + "' is not part of the lucebox DFlash draft "
                                    "schema (refusing to load a draft whose tensors would be ignored)");
        }
    }
    return hp;
}

}  // namespace

const char * dflash_schema_name(dflash_schema s) { return s == dflash_schema::lucebox ? "lucebox" : "upstream"; }

const char * dflash_swa_kind_name(dflash_swa_kind k) {
    return k == dflash_swa_kind::last_context ? "last_context" : "per_query";
}

void dflash_hparams::set_schema(dflash_schema s) {
    schema = s;
    names = dflash_tensor_names{};
    swa_kind = dflash_swa_kind::per_query;
    if (s == dflash_schema::lucebox) {
        names.fc = "dflash.fc.weight";
        names.enc_norm = "dflash.hidden_norm.weight";
        swa_kind = dflash_swa_kind::last_context;
    }
}

std::vector<int32_t> dflash_default_target_layers(uint32_t n, uint32_t n_layer_target) {
    if (n == 0) {
        throw config_error("dflash_default_target_layers: no layers asked for");
    }
    const std::string rule = "ids 1 + k * step with step = (n_layer - 2) / (" + std::to_string(n) + " - 1)";
    if (n_layer_target < 2 || (n > 1 && (n_layer_target - 2) / (n - 1) == 0)) {
        throw draft_mismatch_error("cannot derive " + std::to_string(n) + " distinct captured layers from a target with " +
                                   std::to_string(n_layer_target) + " layers (the original lucebox " + rule + ")");
    }
    const uint32_t step = n > 1 ? (n_layer_target - 2) / (n - 1) : 0;
    std::vector<int32_t> ids;
    for (uint32_t i = 0; i < n; ++i) {
        ids.push_back(static_cast<int32_t>(2 + i * step));  // output of layer 1 + i*step = input of the next
    }
    return ids;
}

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
    require(!target_layers.empty() || n_deferred_target_layers > 0, "target_layers must not be empty");
    require(target_layers.empty() || n_deferred_target_layers == 0,
            "target_layers and n_deferred_target_layers are exclusive");
    for (int32_t l : target_layers) {
        require(l >= 0, "target layer ids must be >= 0");
    }
    require(n_swa == 0 || is_swa.size() == n_layer, "the sliding-window pattern needs one entry per layer");
    require(schema == dflash_schema::upstream || (!has_token_embd && !has_output && n_vocab == 0),
            "a lucebox-schema draft has no embedding or LM head of its own");
}

dflash_hparams read_dflash(const gguf_file & f) {
    const std::string arch = f.get_string("general.architecture");
    for (const char * a : LUCEBOX_ARCHS) {
        if (arch == a) {
            return read_lucebox_draft(f, arch);
        }
    }
    if (arch != ARCH) {
        throw gguf_error(f.where() + "architecture is '" + arch + "', expected 'dflash' (a DFlash draft; the "
                         "original lucebox schema's 'qwen35-dflash-draft' and 'dflash-draft' are also read)");
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

    dflash_hparams hp;
    hp.n_embd = f.get_u32(key("embedding_length"));
    hp.n_layer = f.get_u32(key("block_count"));
    if (hp.n_layer > f.tensors().size()) {  // each layer has 11 tensors: bounds per-layer work on corrupt files
        throw gguf_error(f.where() + "key '" + key("block_count") + "' = " + std::to_string(hp.n_layer) +
                         " exceeds the " + std::to_string(f.tensors().size()) + " tensors in the file");
    }
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
    hp.n_swa = f.find_u32(key("attention.sliding_window")).value_or(0);
    if (hp.n_swa > 0) {
        hp.is_swa = f.get_bool_array(key("attention.sliding_window_pattern"));
        if (hp.is_swa.size() != hp.n_layer) {
            throw gguf_error(f.where() + "key '" + key("attention.sliding_window_pattern") + "' has " +
                             std::to_string(hp.is_swa.size()) + " entries, expected block_count = " +
                             std::to_string(hp.n_layer));
        }
    }
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
    s.push_back({hp.names.fc, {static_cast<int64_t>(hp.n_target_layers()) * E, E}, R::matrix});
    s.push_back({hp.names.enc_norm, {E}, R::norm});
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
        s.push_back({p + hp.names.ffn_norm, {E}, R::norm});
        s.push_back({p + "ffn_gate.weight", {E, hp.n_ff}, R::matrix});
        s.push_back({p + "ffn_up.weight", {E, hp.n_ff}, R::matrix});
        s.push_back({p + "ffn_down.weight", {hp.n_ff, E}, R::matrix});
    }
    return s;
}

void validate_draft_for_target(const gguf_file & tf, const qwen35_hparams & target, const gguf_file & df,
                               dflash_hparams & draft) {
    const std::string pair = "draft '" + df.path() + "' does not match target '" + tf.path() + "': ";
    if (draft.n_embd != target.n_embd) {
        throw draft_mismatch_error(pair + "draft hidden size " + std::to_string(draft.n_embd) +
                                   " != target hidden size " + std::to_string(target.n_embd));
    }
    if (draft.n_deferred_target_layers > 0) {
        try {
            draft.target_layers = dflash_default_target_layers(draft.n_deferred_target_layers, target.n_layer);
        } catch (const draft_mismatch_error & e) {
            throw draft_mismatch_error(pair + "the draft has no target_layer_ids and " + e.what());
        }
        draft.n_deferred_target_layers = 0;
    }
    if (draft.schema == dflash_schema::lucebox) {
        const std::string vocab_key = df.get_string("general.architecture") + ".vocab_size";
        if (const auto nv = df.find_u32(vocab_key); nv && *nv != target.n_vocab) {
            throw draft_mismatch_error(pair + "draft '" + vocab_key + "' = " + std::to_string(*nv) + " but the target has " +
                                       std::to_string(target.n_vocab) + " tokens");
        }
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
        for (const gguf_file * f : {&tf, &df}) {
            const int64_t id = gguf_find_key(f->raw(), tokens_key);
            if (gguf_get_kv_type(f->raw(), id) != GGUF_TYPE_ARRAY || gguf_get_arr_type(f->raw(), id) != GGUF_TYPE_STRING) {
                throw gguf_error(f->where() + "key '" + std::string(tokens_key) + "' must be an array of strings");
            }
        }
        {
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

// ---------------------------------------------------------------------------------------------
// Runtime: weights, state, graph
// ---------------------------------------------------------------------------------------------

dflash_weights bind_dflash_weights(const dflash_hparams & hp, const tensor_store & st, const qwen35_weights & target) {
    dflash_weights w;
    w.fc = st.get(hp.names.fc);
    w.enc_norm = st.get(hp.names.enc_norm);
    w.output_norm = st.get("output_norm.weight");
    w.token_embd = hp.has_token_embd ? st.get("token_embd.weight") : target.token_embd;
    w.output = hp.has_output ? st.get("output.weight") : (hp.has_token_embd ? w.token_embd : target.output);
    w.layers.resize(hp.n_layer);
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        dflash_layer_weights & l = w.layers[il];
        l.attn_norm = st.get(p + "attn_norm.weight");
        l.wq = st.get(p + "attn_q.weight");
        l.wk = st.get(p + "attn_k.weight");
        l.wv = st.get(p + "attn_v.weight");
        l.wo = st.get(p + "attn_output.weight");
        l.q_norm = st.get(p + "attn_q_norm.weight");
        l.k_norm = st.get(p + "attn_k_norm.weight");
        l.ffn_norm = st.get(p + hp.names.ffn_norm);
        l.ffn_gate = st.get(p + "ffn_gate.weight");
        l.ffn_up = st.get(p + "ffn_up.weight");
        l.ffn_down = st.get(p + "ffn_down.weight");
    }
    return w;
}

dflash_state dflash_state::allocate(const dflash_hparams & hp, uint32_t kv_size, ggml_type type_k, ggml_type type_v,
                                    ggml_backend_buffer_type_t buft, ggml_backend_dev_t dev) {
    dflash_state s;
    s.kv_size = kv_size;
    s.k.assign(hp.n_layer, nullptr);
    s.v.assign(hp.n_layer, nullptr);
    s.store = tensor_store::allocate(buft, dev, 2 * size_t(hp.n_layer), [&](ggml_context * ctx) {
        const int64_t row = int64_t(hp.n_head_kv) * hp.head_dim;
        for (uint32_t il = 0; il < hp.n_layer; ++il) {
            s.k[il] = ggml_new_tensor_2d(ctx, type_k, row, kv_size);
            ggml_format_name(s.k[il], "draft_cache_k-%u", il);
            s.v[il] = ggml_new_tensor_2d(ctx, type_v, row, kv_size);
            ggml_format_name(s.v[il], "draft_cache_v-%u", il);
        }
    }, "the draft KV cache");
    s.store.clear();
    return s;
}

std::vector<int32_t> dflash_block_ranges(const dflash_hparams & hp, bool swa, uint32_t n_past, uint32_t block) {
    const uint32_t window = swa ? hp.n_swa : 0;
    const bool last_context = window > 0 && hp.swa_kind == dflash_swa_kind::last_context;
    const bool causal = hp.causal || last_context;
    std::vector<int32_t> ranges(2 * size_t(block));
    for (uint32_t i = 0; i < block; ++i) {
        const uint32_t q_pos = n_past + i;
        uint32_t ctx_from = 0;  // first visible row
        if (last_context) {
            ctx_from = n_past > window ? n_past - window : 0;
        } else if (window > 0) {
            ctx_from = q_pos >= window ? q_pos - window + 1 : 0;
        }
        // one range: the visible context rows [ctx_from, n_past) and the block's rows up to its end;
        // a per-query window that starts inside the block hides the block's rows before it too
        // (upstream's standard SWA: key k is visible to the row at q_pos when q_pos - k < window)
        ranges[2 * i] = int32_t(ctx_from);
        ranges[2 * i + 1] = int32_t(causal ? q_pos + 1 : n_past + block);
    }
    return ranges;
}

void dflash_block_mask(const dflash_hparams & hp, bool swa, uint32_t n_past, uint32_t block, uint32_t n_kv,
                       std::vector<ggml_fp16_t> & mask) {
    const std::vector<int32_t> ranges = dflash_block_ranges(hp, swa, n_past, block);
    mask.resize(size_t(n_kv) * block);
    kernels::range_mask::fill(ranges.data(), n_kv, 0, block, mask.data());
}

dflash_graph build_dflash_graph(ggml_context * ctx, const dflash_hparams & hp, const dflash_weights & w,
                                const dflash_state & st, const std::vector<ggml_tensor *> & feature_rings,
                                uint32_t n_inject, uint32_t block_size, uint32_t n_kv, uint32_t n_ctx_orig,
                                uint32_t top_k) {
    using graph::named;
    dflash_graph g;
    g.gf = ggml_new_graph_custom(ctx, 8192, false);
    const int64_t hd = hp.head_dim, H = hp.n_head, Hkv = hp.n_head_kv;
    dflash_inputs & in = g.in;

    auto rope = [&](ggml_tensor * x, ggml_tensor * pos) {
        return ggml_rope_ext(ctx, x, pos, nullptr, int(hp.n_rot), GGML_ROPE_TYPE_NEOX, int(n_ctx_orig),
                             hp.rope_freq_base, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    };

    // A. context injection: g = RMSNorm(fc . concat(features)) * enc_norm; per layer K/V into the cache
    if (n_inject > 0) {
        const int64_t N = n_inject;
        in.ctx_ring_rows = named(ggml_new_tensor_1d(ctx, GGML_TYPE_I32, N), "draft_inp_ring_rows");
        in.ctx_pos = named(ggml_new_tensor_1d(ctx, GGML_TYPE_I32, N), "draft_inp_ctx_pos");
        in.ctx_kv_rows = named(ggml_new_tensor_1d(ctx, GGML_TYPE_I64, N), "draft_inp_ctx_kv_rows");
        for (ggml_tensor * t : {in.ctx_ring_rows, in.ctx_pos, in.ctx_kv_rows}) {
            ggml_set_input(t);
        }
        ggml_tensor * feat = nullptr;  // [n_target_layers*E, N]
        for (ggml_tensor * ring : feature_rings) {
            ggml_tensor * f = ggml_get_rows(ctx, ring, in.ctx_ring_rows);
            feat = feat == nullptr ? f : ggml_concat(ctx, feat, f, 0);
        }
        named(feat, "draft_target_features");
        ggml_tensor * gx = graph::rms_norm(ctx, ggml_mul_mat(ctx, w.fc, feat), w.enc_norm, hp.rms_eps);
        named(gx, "draft_ctx_hidden");
        for (uint32_t il = 0; il < hp.n_layer; ++il) {
            const dflash_layer_weights & l = w.layers[il];
            ggml_tensor * k = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, l.wk, gx), hd, Hkv, N);
            k = rope(graph::rms_norm(ctx, k, l.k_norm, hp.rms_eps), in.ctx_pos);
            ggml_tensor * v = ggml_mul_mat(ctx, l.wv, gx);  // [Hkv*hd, N]
            named(k, "draft_ctx_k", int(il));
            ggml_build_forward_expand(g.gf, ggml_set_rows(ctx, st.k[il], graph::cache_rows(ctx, k), in.ctx_kv_rows));
            ggml_build_forward_expand(g.gf, ggml_set_rows(ctx, st.v[il], v, in.ctx_kv_rows));
        }
    }
    if (block_size == 0) {
        return g;
    }

    // B. proposal block [last, MASK x (B-1)], non-causal over context + block
    const int64_t B = block_size;
    in.block_tokens = named(ggml_new_tensor_1d(ctx, GGML_TYPE_I32, B), "draft_inp_tokens");
    in.block_pos = named(ggml_new_tensor_1d(ctx, GGML_TYPE_I32, B), "draft_inp_pos");
    in.block_kv_rows = named(ggml_new_tensor_1d(ctx, GGML_TYPE_I64, B), "draft_inp_kv_rows");
    // an unused input gets no buffer: create each mask only if some layer uses it
    const bool any_swa = hp.n_swa > 0 && std::find(hp.is_swa.begin(), hp.is_swa.end(), true) != hp.is_swa.end();
    const bool any_full = hp.n_swa == 0 || std::find(hp.is_swa.begin(), hp.is_swa.end(), false) != hp.is_swa.end();
    // each mask built in the graph from its rows' key ranges where the draft's weights are on a backend
    // that runs lucebox's custom ops (kernels/range_mask.h), else written on the host
    const bool in_graph = kernels::range_mask::enabled() && kernels::fused_ops_in(w.layers[0].q_norm->buffer);
    auto mask_input = [&](ggml_tensor *& ranges, const char * ranges_name, const char * name) {
        if (!in_graph) return named(ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_kv, B), name);
        ranges = named(ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 2, B), ranges_name);
        return named(kernels::range_mask::build(ctx, ranges, n_kv), name);
    };
    if (any_full) {
        in.kq_mask = mask_input(in.kq_ranges, "draft_inp_kq_ranges", "draft_kq_mask");
    }
    if (any_swa) {
        in.kq_mask_swa = mask_input(in.kq_ranges_swa, "draft_inp_kq_ranges_swa", "draft_kq_mask_swa");
    }
    for (ggml_tensor * t : {in.block_tokens, in.block_pos, in.block_kv_rows, in.kq_ranges, in.kq_ranges_swa,
                            in_graph ? nullptr : in.kq_mask, in_graph ? nullptr : in.kq_mask_swa}) {
        if (t != nullptr) {
            ggml_set_input(t);
        }
    }
    const float scale = 1.0f / std::sqrt(float(hd));
    ggml_tensor * h = named(ggml_get_rows(ctx, w.token_embd, in.block_tokens), "draft_embd");  // [E, B]
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        const dflash_layer_weights & l = w.layers[il];
        const int li = int(il);
        ggml_tensor * x = named(graph::rms_norm(ctx, h, l.attn_norm, hp.rms_eps), "draft_attn_norm", li);
        ggml_tensor * q = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, l.wq, x), hd, H, B);
        ggml_tensor * k = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, l.wk, x), hd, Hkv, B);
        ggml_tensor * v = ggml_mul_mat(ctx, l.wv, x);  // [Hkv*hd, B]
        q = named(rope(graph::rms_norm(ctx, q, l.q_norm, hp.rms_eps), in.block_pos), "draft_q", li);
        k = named(rope(graph::rms_norm(ctx, k, l.k_norm, hp.rms_eps), in.block_pos), "draft_k", li);
        ggml_build_forward_expand(g.gf, ggml_set_rows(ctx, st.k[il], graph::cache_rows(ctx, k), in.block_kv_rows));
        ggml_build_forward_expand(g.gf, ggml_set_rows(ctx, st.v[il], v, in.block_kv_rows));
        ggml_tensor * kk = ggml_permute(ctx, ggml_view_3d(ctx, st.k[il], hd, Hkv, n_kv, ggml_row_size(st.k[il]->type, hd),
                                                          st.k[il]->nb[1], 0), 0, 2, 1, 3);
        ggml_tensor * vv = ggml_permute(ctx, ggml_view_3d(ctx, st.v[il], hd, Hkv, n_kv, ggml_row_size(st.v[il]->type, hd),
                                                          st.v[il]->nb[1], 0), 0, 2, 1, 3);
        ggml_tensor * mask = hp.n_swa > 0 && hp.is_swa[il] ? in.kq_mask_swa : in.kq_mask;
        ggml_tensor * att = ggml_flash_attn_ext(ctx, ggml_permute(ctx, q, 0, 2, 1, 3), kk, vv, mask, scale, 0.0f, 0.0f);
        att = named(ggml_mul_mat(ctx, l.wo, ggml_reshape_2d(ctx, att, hd * H, B)), "draft_attn_out", li);
        h = named(ggml_add(ctx, att, h), "draft_attn_residual", li);
        ggml_tensor * f = graph::rms_norm(ctx, h, l.ffn_norm, hp.rms_eps);
        h = named(ggml_add(ctx, graph::swiglu_ffn(ctx, f, l.ffn_gate, l.ffn_up, l.ffn_down, li), h), "draft_l_out", li);
    }
    // positions 1..B-1 predict the tokens after the last one
    ggml_tensor * rows = ggml_view_2d(ctx, h, h->ne[0], B - 1, h->nb[1], h->nb[1]);
    rows = graph::rms_norm(ctx, ggml_cont(ctx, rows), w.output_norm, hp.rms_eps);
    g.logits = named(ggml_mul_mat(ctx, w.output, rows), "draft_logits");  // [V, B-1]
    g.argmax = named(ggml_argmax(ctx, g.logits), "draft_proposals");
    ggml_set_output(g.argmax);
    ggml_build_forward_expand(g.gf, g.argmax);
    if (top_k > 0) {
        const int64_t V = g.logits->ne[0];
        g.topk_ids = named(ggml_top_k(ctx, g.logits, int(top_k)), "draft_topk_ids");     // [K, B-1]
        ggml_tensor * probs = ggml_reshape_3d(ctx, ggml_soft_max(ctx, g.logits), 1, V, B - 1);
        g.topk_probs = named(ggml_get_rows(ctx, probs, g.topk_ids), "draft_topk_probs");  // [1, K, B-1]
        for (ggml_tensor * t : {g.topk_ids, g.topk_probs}) {
            ggml_set_output(t);
            ggml_build_forward_expand(g.gf, t);
        }
    }
    return g;
}

}  // namespace lucebox
