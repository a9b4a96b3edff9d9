// Memory plan arithmetic at the Qwen3.6-27B shapes (hand-computed expectations).
#include "check.h"
#include "lucebox/errors.h"
#include "lucebox/memory_plan.h"
#include "lucebox/models.h"

using namespace lucebox;

namespace {
qwen35_hparams qwen36_27b() {
    qwen35_hparams hp;
    hp.n_vocab = 248320; hp.n_ctx_train = 262144; hp.n_embd = 5120; hp.n_layer = 64; hp.n_ff = 17408;
    hp.n_head = 24; hp.n_head_kv = 4; hp.head_dim = 256; hp.n_rot = 64; hp.rope_sections = {11, 11, 10, 0};
    hp.ssm_d_conv = 4; hp.ssm_d_state = 128; hp.ssm_n_k_heads = 16; hp.ssm_n_v_heads = 48;
    hp.is_recurrent.resize(64);
    for (int i = 0; i < 64; ++i) hp.is_recurrent[i] = (i + 1) % 4 != 0;
    return hp;
}
}  // namespace

TEST_CASE(kv_and_recurrent_bytes) {
    const qwen35_hparams hp = qwen36_27b();
    hp.validate();
    memory_request req;
    req.n_ctx = 4096;
    const memory_plan p = plan_memory(hp, nullptr, req);
    // 16 attention layers * (K + V) * 4 kv heads * 256 * 2 bytes (f16)
    CHECK(p.kv_bytes_per_token == 16ull * 2 * 4 * 256 * 2);
    CHECK(p.kv_bytes == p.kv_bytes_per_token * 4096);
    // 48 GDN layers * 3 * conv_dim(10240) * 4 bytes
    CHECK(p.conv_state_bytes_per_seq == 48ull * 3 * 10240 * 4);
    // 48 GDN layers * 128 * 6144 * 4 bytes
    CHECK(p.ssm_state_bytes_per_seq == 48ull * 128 * 6144 * 4);
    CHECK(p.checkpoint_bytes == p.checkpoint_bytes_per_token * 16);
    CHECK(p.draft_kv_bytes == 0 && p.feature_ring_bytes == 0);

    req.kv_type_k = GGML_TYPE_Q8_0;
    req.kv_type_v = GGML_TYPE_Q4_0;
    const memory_plan q = plan_memory(hp, nullptr, req);
    // q8_0: 34 bytes per 32 values, q4_0: 18 bytes per 32 values
    CHECK(q.kv_bytes_per_token == 16ull * (1024 / 32) * (34 + 18));
}

TEST_CASE(checkpoint_bytes_with_and_without_whole_states) {
    const qwen35_hparams hp = qwen36_27b();
    CHECK(hp.fused_delta_net_shape());
    memory_request req;
    req.n_ctx = 4096;
    const uint64_t conv = 48ull * 3 * 10240 * 4, state = 48ull * 128 * 6144 * 4;
    const uint64_t inputs = 48ull * (10240 + 2 * 48) * 4;  // q | k | v, g and beta per value head
    const memory_plan kept = plan_memory(hp, nullptr, req);  // keep_states: trees, the replay backup
    CHECK(keeps_states(req));
    CHECK(kept.checkpoint_bytes_per_token == conv + state + inputs);
    req.keep_states = false;  // chain verifies: the fused inputs, no states
    CHECK(!keeps_states(req));
    const memory_plan chain = plan_memory(hp, nullptr, req);
    CHECK(chain.checkpoint_bytes_per_token == conv + inputs);
    CHECK(chain.checkpoint_bytes == 16 * (conv + inputs));
    req.verify_tokens = 65;  // longer than the fused step takes: states again
    CHECK(keeps_states(req));
    CHECK(plan_memory(hp, nullptr, req).checkpoint_bytes_per_token == conv + state + inputs);
    qwen35_hparams narrow = hp;  // heads of 64: ggml's ops, no fused inputs, always states
    narrow.ssm_d_state = 64;
    req.verify_tokens = 16;
    CHECK(!narrow.fused_delta_net_shape());
    const memory_plan n = plan_memory(narrow, nullptr, req);
    CHECK(n.checkpoint_bytes_per_token == n.conv_state_bytes_per_seq + n.ssm_state_bytes_per_seq);
}

TEST_CASE(draft_bytes) {
    const qwen35_hparams hp = qwen36_27b();
    dflash_hparams d;
    d.n_embd = 5120; d.n_layer = 5; d.n_ff = 17408; d.n_head = 32; d.n_head_kv = 8; d.head_dim = 128; d.n_rot = 128;
    d.target_layers = {2, 17, 32, 47, 62};
    d.validate();
    memory_request req;
    req.n_ctx = 1000;
    const memory_plan p = plan_memory(hp, &d, req);
    CHECK(p.draft_kv_bytes_per_token == 5ull * 2 * 8 * 128 * 2);
    CHECK(p.feature_ring_tokens == 512);
    CHECK(p.feature_ring_bytes == 5ull * 5120 * 4 * 512);
}

TEST_CASE(bad_requests) {
    const qwen35_hparams hp = qwen36_27b();
    memory_request req;
    req.n_ctx = 0;
    CHECK_THROWS(plan_memory(hp, nullptr, req), config_error, "must all be > 0");
    CHECK_THROWS(parse_kv_type("q4_K"), config_error, "KV cache type 'q4_K' is not supported");
    CHECK(parse_kv_type("q8_0") == GGML_TYPE_Q8_0);
}

TEST_MAIN()
