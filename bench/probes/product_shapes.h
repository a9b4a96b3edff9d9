// The Qwen3.6-27B product shapes the product probes time (q8_0_matmul_bench.cu, q4k_bf16x_probe.cu): K -> M,
// gated (the fused gate/up pair: two weights of M rows), and the name ab_sums.py keys a shape's times by.
#pragma once

namespace lucebox::probes {

struct product_shape {
    int K, M;
    bool gated;
    const char * what;
};

inline constexpr product_shape qwen36_27b_shapes[] = {{5120, 17408, true, "ffn gate+up fused (5120 -> 2x17408)"},
                                                      {5120, 17408, false, "ffn_up alone (5120 -> 17408)"},
                                                      {17408, 5120, false, "ffn_down (17408 -> 5120)"},
                                                      {5120, 16480, false, "DeltaNet stack qkv+z+b+a (5120 -> 16480)"},
                                                      {5120, 14336, false, "attention stack q+k+v (5120 -> 14336)"},
                                                      {5120, 10240, false, "DeltaNet attn_qkv (5120 -> 10240)"},
                                                      {5120, 6144, false, "DeltaNet attn_gate (5120 -> 6144)"},
                                                      {6144, 5120, false, "ssm_out / attn_output (6144 -> 5120)"},
                                                      {5120, 1024, false, "attn_k / attn_v (5120 -> 1024)"}};

}  // namespace lucebox::probes
