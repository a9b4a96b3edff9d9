// The tensor split's plan (cpp/src/tensor_parallel.h): how heads and FFN blocks are dealt over the
// devices, the split state of every weight and state tensor by name, and the refusals.
#include <string>

#include "check.h"
#include "lucebox/errors.h"
#include "tensor_parallel.h"

using namespace lucebox;

namespace {

// Qwen3.6-27B-like: 16 K heads of 128 (48 V heads: 3 V blocks), 24 query / 4 KV heads of 256.
qwen35_hparams big() {
    qwen35_hparams hp;
    hp.n_vocab = 1000;
    hp.n_embd = 5120;
    hp.n_layer = 4;
    hp.n_ff = 17408;
    hp.n_head = 24;
    hp.n_head_kv = 4;
    hp.head_dim = 256;
    hp.ssm_d_conv = 4;
    hp.ssm_d_state = 128;
    hp.ssm_n_k_heads = 16;
    hp.ssm_n_v_heads = 48;
    hp.is_recurrent = {true, true, true, false};
    return hp;
}

std::function<ggml_type(const std::string &)> all(ggml_type t) {
    return [t](const std::string &) { return t; };
}

int64_t total(const ggml_backend_meta_split_state & s, size_t n) {
    int64_t sum = 0;
    for (size_t j = 0; j < n; ++j) sum += s.ne[j];
    return sum * s.nr[0];
}

}  // namespace

TEST_CASE(two_devices_deal_heads_evenly) {
    const qwen35_hparams hp = big();
    const tensor_split_plan p = tensor_split_plan::make(hp, 2, all(GGML_TYPE_Q8_0), GGML_TYPE_F16, GGML_TYPE_F16);
    CHECK(p.k_heads == std::vector<int64_t>({8, 8}));
    CHECK(p.kv_heads == std::vector<int64_t>({2, 2}));
    CHECK(p.ff_block == 32);
    CHECK(p.ff_blocks == std::vector<int64_t>({272, 272}));

    auto qkv = p.state_of("blk.0.attn_qkv.weight");  // [E, conv_dim]: q, k, 3 V blocks
    CHECK(qkv.axis == GGML_BACKEND_SPLIT_AXIS_1 && qkv.n_segments == 1 && qkv.nr[0] == 5);
    CHECK(qkv.ne[0] == 8 * 128 && qkv.ne[1] == 8 * 128);
    CHECK(total(qkv, 2) == int64_t(hp.conv_dim()));
    CHECK(total(p.state_of("cache_conv-0"), 2) == int64_t(hp.conv_dim()));
    CHECK(p.state_of("ckpt_conv-2").axis == GGML_BACKEND_SPLIT_AXIS_1);

    auto out = p.state_of("blk.1.ssm_out.weight");  // [value_dim, E]: the input axis
    CHECK(out.axis == GGML_BACKEND_SPLIT_AXIS_0 && out.nr[0] == 3 && total(out, 2) == int64_t(hp.value_dim()));
    auto ssm = p.state_of("cache_ssm-1");  // [dk*dk, Hv]
    CHECK(ssm.axis == GGML_BACKEND_SPLIT_AXIS_1 && ssm.ne[0] == 8 && ssm.nr[0] == 3 && total(ssm, 2) == 48);
    CHECK(total(p.state_of("ckpt_ssm-1"), 2) == 128 * 128 * 48);
    CHECK(p.state_of("blk.0.ssm_a").axis == GGML_BACKEND_SPLIT_AXIS_0);
    CHECK(total(p.state_of("blk.0.ssm_dt.bias"), 2) == 48);
    CHECK(total(p.state_of("blk.0.ssm_beta.weight"), 2) == 48);

    auto q = p.state_of("blk.3.attn_q.weight");  // [E, 2*H*hd]
    CHECK(q.axis == GGML_BACKEND_SPLIT_AXIS_1 && total(q, 2) == 2 * 24 * 256 && q.ne[0] == 2 * 6 * 256 * 2);
    CHECK(total(p.state_of("blk.3.attn_k.weight"), 2) == 4 * 256);
    CHECK(p.state_of("cache_k-3").axis == GGML_BACKEND_SPLIT_AXIS_0 && total(p.state_of("cache_v-3"), 2) == 4 * 256);
    auto o = p.state_of("blk.3.attn_output.weight");
    CHECK(o.axis == GGML_BACKEND_SPLIT_AXIS_0 && total(o, 2) == 24 * 256);
    CHECK(p.state_of("blk.2.ffn_up.weight").axis == GGML_BACKEND_SPLIT_AXIS_1);
    CHECK(total(p.state_of("blk.2.ffn_down.weight"), 2) == 17408);

    for (const char * m : {"token_embd.weight", "output.weight", "output_norm.weight", "blk.0.attn_norm.weight",
                           "blk.0.ssm_norm.weight", "blk.3.attn_q_norm.weight", "feature_ring-2"}) {
        CHECK(p.state_of(m).axis == GGML_BACKEND_SPLIT_AXIS_MIRRORED);
    }
}

TEST_CASE(three_devices_deal_unevenly) {
    const tensor_split_plan p = tensor_split_plan::make(big(), 3, all(GGML_TYPE_Q8_0), GGML_TYPE_F16, GGML_TYPE_F16);
    CHECK(p.k_heads == std::vector<int64_t>({6, 5, 5}));
    CHECK(p.kv_heads == std::vector<int64_t>({2, 1, 1}));
    CHECK(p.ff_blocks == std::vector<int64_t>({182, 181, 181}));
}

TEST_CASE(refusals_name_the_tensor_and_sizes) {
    // K-quant blocks of 256: 5 K heads of 128 on a device cut ssm_out's blocks
    CHECK_THROWS(tensor_split_plan::make(big(), 3, all(GGML_TYPE_Q4_K), GGML_TYPE_F16, GGML_TYPE_F16), config_error,
                 "blk.0.ssm_out.weight (q4_K, blocks of 256) would be cut into slices of 768, 640, 640");
    // 4 KV heads cannot give each of 5 devices one
    CHECK_THROWS(tensor_split_plan::make(big(), 5, all(GGML_TYPE_Q8_0), GGML_TYPE_F16, GGML_TYPE_F16), config_error,
                 "attention KV heads (head_count_kv = 4) cannot be divided over 5 devices");
    qwen35_hparams hp = big();
    hp.ssm_n_k_heads = 2;
    hp.ssm_n_v_heads = 6;
    CHECK_THROWS(tensor_split_plan::make(hp, 4, all(GGML_TYPE_Q8_0), GGML_TYPE_F16, GGML_TYPE_F16), config_error,
                 "DeltaNet K heads (ssm.group_count = 2) cannot be divided over 4 devices");
    // a quantized KV cache row slice must hold whole blocks: 1 KV head of 16 dims per device
    hp = big();
    hp.head_dim = 16;
    CHECK_THROWS(tensor_split_plan::make(hp, 4, all(GGML_TYPE_F16), GGML_TYPE_Q8_0, GGML_TYPE_F16), config_error,
                 "KV cache K rows (q8_0, blocks of 32)");
}

TEST_MAIN()
