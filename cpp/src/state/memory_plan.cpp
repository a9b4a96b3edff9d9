#include "lucebox/memory_plan.h"

#include <algorithm>

#include "lucebox/errors.h"
#include "lucebox/models.h"
#include "delta_net_step.h"

namespace lucebox {

bool is_supported_kv_type(ggml_type type) {
    switch (type) {
        case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16: case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1:
            return true;
        default:
            return false;
    }
}

ggml_type parse_kv_type(const std::string & name) {
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const auto type = static_cast<ggml_type>(t);
        const char * tn = ggml_type_name(type);
        if (tn != nullptr && name == tn && is_supported_kv_type(type)) {
            return type;
        }
    }
    throw config_error("KV cache type '" + name + "' is not supported (expected one of f32, f16, bf16, q8_0, q4_0, "
                       "q4_1, q5_0, q5_1)");
}

namespace {

uint64_t row_bytes(ggml_type type, int64_t n, const char * what) {
    if (n % ggml_blck_size(type) != 0) {
        throw config_error(std::string(what) + " row of " + std::to_string(n) + " values is not a multiple of the " +
                           ggml_type_name(type) + " block size " + std::to_string(ggml_blck_size(type)));
    }
    return ggml_row_size(type, n);
}

}  // namespace

bool keeps_states(const memory_request & req) {
    return req.keep_states || req.verify_tokens > kernels::delta_net::MAX_TOKENS;
}

memory_plan plan_memory(const qwen35_hparams & t, const dflash_hparams * d, const memory_request & req) {
    if (req.n_ctx == 0 || req.n_seq == 0 || req.verify_tokens == 0 || req.ubatch == 0) {
        throw config_error("memory plan: context, sequences, verify tokens and micro-batch must all be > 0");
    }
    if (!is_supported_kv_type(req.kv_type_k) || !is_supported_kv_type(req.kv_type_v)) {
        throw config_error("memory plan: unsupported KV cache type");
    }
    memory_plan p;
    const uint64_t tokens = uint64_t(req.n_ctx) * req.n_seq;

    const int64_t kv_row = int64_t(t.n_head_kv) * t.head_dim;
    if (t.n_attention_layers() > 0) {
        p.kv_bytes_per_token = t.n_attention_layers() *
                               (row_bytes(req.kv_type_k, kv_row, "K cache") + row_bytes(req.kv_type_v, kv_row, "V cache"));
    }
    p.kv_bytes = p.kv_bytes_per_token * tokens;

    const uint64_t n_gdn = t.n_recurrent_layers();
    p.conv_state_bytes_per_seq = n_gdn * uint64_t(t.ssm_d_conv > 0 ? t.ssm_d_conv - 1 : 0) * t.conv_dim() * sizeof(float);
    p.ssm_state_bytes_per_seq = n_gdn * uint64_t(t.ssm_d_state) * t.value_dim() * sizeof(float);
    p.recurrent_bytes = (p.conv_state_bytes_per_seq + p.ssm_state_bytes_per_seq) * req.n_seq;
    // per verified token: its conv input; with fused DeltaNet steps its fused inputs, and its whole
    // state where it is kept (req.keep_states), else the state (the commit copies it)
    const bool fused = n_gdn > 0 && t.fused_delta_net_shape();
    const uint64_t inputs_per_token = fused ? n_gdn * uint64_t(t.fused_inputs_dim()) * sizeof(float) : 0;
    const uint64_t state_per_token = !fused || keeps_states(req) ? p.ssm_state_bytes_per_seq : 0;
    p.checkpoint_bytes_per_token = p.conv_state_bytes_per_seq + state_per_token + inputs_per_token;
    p.checkpoint_bytes = p.checkpoint_bytes_per_token * req.verify_tokens * req.n_seq;

    if (d != nullptr) {
        const int64_t dkv_row = int64_t(d->n_head_kv) * d->head_dim;
        p.draft_kv_bytes_per_token =
            d->n_layer * (row_bytes(req.kv_type_k, dkv_row, "draft K cache") + row_bytes(req.kv_type_v, dkv_row, "draft V cache"));
        p.draft_kv_bytes = p.draft_kv_bytes_per_token * tokens;
        p.feature_ring_tokens = std::max(req.ubatch, req.verify_tokens);
        p.feature_ring_bytes = uint64_t(d->n_target_layers()) * t.n_embd * sizeof(float) * p.feature_ring_tokens * req.n_seq;
    }
    return p;
}

}  // namespace lucebox
