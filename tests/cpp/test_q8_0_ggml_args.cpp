// Which ggml MUL_MAT products the Q8_0 few-column CUDA kernel takes (cpp/kernels/q8_0_ggml_args.h):
// every refusal leaves the product to ggml's own kernels, so a wrong "yes" is a wrong result and a
// wrong "no" only a slower one. Plain C++: runs in every build (CI has no GPU).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "check.h"
#include "ggml.h"
#include "q8_0_ggml_args.h"

using lucebox::kernels::q8_0::args_from_ggml;
using lucebox::kernels::q8_0::check_args;
using lucebox::kernels::q8_0::matmul_args;
using lucebox::kernels::q8_0::weight_type;

namespace {

// Tensors of a product, metadata only, with 16-byte aligned fake data pointers.
struct operands {
    ggml_context * ctx = nullptr;
    alignas(64) static inline uint8_t arena[64];
    operands() {
        ggml_init_params p = {64 * ggml_tensor_overhead(), nullptr, true};
        ctx = ggml_init(p);
    }
    ~operands() { ggml_free(ctx); }
    ggml_tensor * t(ggml_type type, int64_t ne0, int64_t ne1, int64_t ne2 = 1) {
        ggml_tensor * r = ggml_new_tensor_3d(ctx, type, ne0, ne1, ne2);
        r->data = arena;
        return r;
    }
};

bool takes(const ggml_tensor * w, const ggml_tensor * gate, int glu, const ggml_tensor * bias, const ggml_tensor * x,
           const ggml_tensor * dst, matmul_args * out = nullptr, const ggml_tensor * norm_w = nullptr,
           float norm_eps = 0.0f) {
    matmul_args a;
    const bool ok = args_from_ggml(w, gate, glu, bias, x, dst, a, norm_w, norm_eps);
    if (out) *out = a;
    return ok;
}

}  // namespace

// q4k_scales4 (the product's four-at-a-time unpacking) gives q4k_scale_min's scales, for every
// sub-block of pseudo-random packed bytes (all bits exercised).
TEST_CASE(q4k_scales4_matches_q4k_scale_min) {
    uint32_t x = 12345u;
    for (int trial = 0; trial < 2000; ++trial) {
        uint32_t w[3];
        for (uint32_t & v : w) v = x = x * 1664525u + 1013904223u;
        for (int sb = 0; sb < 8; ++sb) {
            int scale = 0, min = 0;
            lucebox::kernels::q8_0::q4k_scale_min(sb, w, scale, min);
            CHECK(int((lucebox::kernels::q8_0::q4k_scales4(w, sb / 4) >> (8 * (sb % 4))) & 0xFFu) == scale);
        }
    }
}

// q5k_quant_bytes (the product's Q5_K quants, merged with their fifth bits) against ggml's own Q5_K
// dequantization: for pseudo-random blocks, every value v of sub-block s is d * scale * q - dmin * min
// with q = the byte for even s, byte / 8 for odd s, and byte * q5k_scale_factor(s) = 16 q.
TEST_CASE(q5k_quant_bytes_match_ggmls_q5_k) {
    namespace q8 = lucebox::kernels::q8_0;
    uint32_t x = 777u;
    auto next = [&] { return x = x * 1664525u + 1013904223u; };
    for (int trial = 0; trial < 200; ++trial) {
        uint8_t blk[q8::Q5K_BLOCK_BYTES];
        for (uint8_t & b : blk) b = uint8_t(next() >> 24);
        const ggml_fp16_t d = ggml_fp32_to_fp16(0.01f + float(next() % 100) / 1000), dmin = ggml_fp32_to_fp16(float(next() % 100) / 2000);
        std::memcpy(blk, &d, 2);
        std::memcpy(blk + 2, &dmin, 2);
        float ref[256];
        ggml_get_type_traits(GGML_TYPE_Q5_K)->to_float(blk, ref, 256);
        uint32_t sc[3];
        std::memcpy(sc, blk + 4, 12);
        for (int s = 0; s < 8; ++s) {
            int scale = 0, min = 0;
            q8::q4k_scale_min(s, sc, scale, min);
            for (int l = 0; l < 32; l += 4) {
                uint32_t qs, qh;
                std::memcpy(&qs, blk + 48 + 32 * (s / 2) + l, 4);
                std::memcpy(&qh, blk + 16 + l, 4);
                const uint32_t bytes = q8::q5k_quant_bytes(qs, qh, s);
                for (int i = 0; i < 4; ++i) {
                    const int byte = int((bytes >> (8 * i)) & 0xFFu), q = s % 2 == 0 ? byte : byte / 8;
                    CHECK(q >= 0 && q < 32 && byte * q8::q5k_scale_factor(s) == 16 * q);
                    // (to rounding: ggml's code may contract the multiply-add; a wrong q is off by d * scale)
                    const float d1 = ggml_fp16_to_fp32(d) * float(scale), m1 = ggml_fp16_to_fp32(dmin) * float(min);
                    CHECK(std::fabs(d1 * float(q) - m1 - ref[32 * s + l + i]) <= 1e-6f * (d1 * float(q) + m1));
                }
            }
        }
    }
}

TEST_CASE(plain_q8_0_product_is_taken_and_mapped) {
    operands o;
    ggml_tensor * w = o.t(GGML_TYPE_Q8_0, 5120, 1024);
    ggml_tensor * x = o.t(GGML_TYPE_F32, 5120, 16);
    ggml_tensor * y = o.t(GGML_TYPE_F32, 1024, 16);
    matmul_args a;
    CHECK(takes(w, nullptr, -1, nullptr, x, y, &a));
    CHECK(a.K == 5120 && a.M == 1024 && a.N == 16);
    CHECK(a.row_bytes == 5120 / 32 * 34);
    CHECK(a.x_stride == 5120 && a.y_stride == 1024);
    CHECK(a.gate == nullptr && a.bias == nullptr);
}

TEST_CASE(strided_columns_are_mapped) {
    operands o;
    ggml_tensor * w = o.t(GGML_TYPE_Q8_0, 256, 8);
    ggml_tensor * xbig = o.t(GGML_TYPE_F32, 512, 4);
    ggml_tensor * x = ggml_view_2d(o.ctx, xbig, 256, 4, xbig->nb[1], 0);  // every column 512 floats apart
    x->data = xbig->data;
    ggml_tensor * y = o.t(GGML_TYPE_F32, 8, 4);
    matmul_args a;
    CHECK(takes(w, nullptr, -1, nullptr, x, y, &a));
    CHECK(a.x_stride == 512);
}

TEST_CASE(other_types_and_shapes_stay_with_ggml) {
    operands o;
    ggml_tensor * x = o.t(GGML_TYPE_F32, 512, 4);
    ggml_tensor * y = o.t(GGML_TYPE_F32, 64, 4);
    CHECK(!takes(o.t(GGML_TYPE_F16, 512, 64), nullptr, -1, nullptr, x, y));   // not Q8_0
    CHECK(!takes(o.t(GGML_TYPE_Q4_0, 512, 64), nullptr, -1, nullptr, x, y));
    CHECK(!takes(o.t(GGML_TYPE_Q8_0, 512, 64), nullptr, -1, nullptr, o.t(GGML_TYPE_F16, 512, 4), y));  // x not F32
    ggml_tensor * w = o.t(GGML_TYPE_Q8_0, 512, 64);
    CHECK(takes(w, nullptr, -1, nullptr, x, y));
    // K not a multiple of 256 (rows would not be whole 16-byte vectors)
    CHECK(!takes(o.t(GGML_TYPE_Q8_0, 288, 64), nullptr, -1, nullptr, o.t(GGML_TYPE_F32, 288, 4), y));
    // more than 64 columns (a prefill micro-batch): ggml's mmq
    CHECK(!takes(w, nullptr, -1, nullptr, o.t(GGML_TYPE_F32, 512, 65), o.t(GGML_TYPE_F32, 64, 65)));
    CHECK(takes(w, nullptr, -1, nullptr, o.t(GGML_TYPE_F32, 512, 64), o.t(GGML_TYPE_F32, 64, 64)));
    // batched (3-D) operands
    CHECK(!takes(w, nullptr, -1, nullptr, o.t(GGML_TYPE_F32, 512, 4, 2), o.t(GGML_TYPE_F32, 64, 4, 2)));
    // shapes that do not chain
    CHECK(!takes(w, nullptr, -1, nullptr, o.t(GGML_TYPE_F32, 256, 4), y));
    CHECK(!takes(w, nullptr, -1, nullptr, x, o.t(GGML_TYPE_F32, 32, 4)));
    // a transposed (permuted) activation
    ggml_tensor * xt = ggml_transpose(o.ctx, o.t(GGML_TYPE_F32, 4, 512));
    xt->data = x->data;
    CHECK(!takes(w, nullptr, -1, nullptr, xt, y));
}

TEST_CASE(misaligned_weights_stay_with_ggml) {
    operands o;
    ggml_tensor * w = o.t(GGML_TYPE_Q8_0, 512, 64);
    w->data = static_cast<uint8_t *>(w->data) + 2;
    CHECK(!takes(w, nullptr, -1, nullptr, o.t(GGML_TYPE_F32, 512, 1), o.t(GGML_TYPE_F32, 64, 1)));
}

TEST_CASE(gated_products_need_swiglu_and_matching_gate) {
    operands o;
    ggml_tensor * up = o.t(GGML_TYPE_Q8_0, 512, 64);
    ggml_tensor * gate = o.t(GGML_TYPE_Q8_0, 512, 64);
    ggml_tensor * x = o.t(GGML_TYPE_F32, 512, 1);
    ggml_tensor * y = o.t(GGML_TYPE_F32, 64, 1);
    matmul_args a;
    CHECK(takes(up, gate, GGML_GLU_OP_SWIGLU, nullptr, x, y, &a));
    CHECK(a.gate != nullptr);
    CHECK(!takes(up, gate, GGML_GLU_OP_GEGLU, nullptr, x, y));
    CHECK(!takes(up, gate, GGML_GLU_OP_SWIGLU_OAI, nullptr, x, y));
    CHECK(!takes(up, o.t(GGML_TYPE_Q8_0, 512, 32), GGML_GLU_OP_SWIGLU, nullptr, x, y));  // other shape
    CHECK(!takes(up, o.t(GGML_TYPE_Q4_0, 512, 64), GGML_GLU_OP_SWIGLU, nullptr, x, y));  // other type
    CHECK(!takes(up, gate, GGML_GLU_OP_SWIGLU, o.t(GGML_TYPE_F32, 64, 1), x, y));  // bias with a GLU
}

TEST_CASE(a_fused_residual_add_is_f32_per_column_or_shared) {
    operands o;
    ggml_tensor * w = o.t(GGML_TYPE_Q8_0, 512, 64);
    ggml_tensor * x = o.t(GGML_TYPE_F32, 512, 1);
    ggml_tensor * y = o.t(GGML_TYPE_F32, 64, 1);
    matmul_args a;
    CHECK(takes(w, nullptr, -1, o.t(GGML_TYPE_F32, 64, 1), x, y, &a));
    CHECK(a.bias != nullptr && a.bias_stride == 0);
    CHECK(!takes(w, nullptr, -1, o.t(GGML_TYPE_F16, 64, 1), x, y));  // not F32
    CHECK(!takes(w, nullptr, -1, o.t(GGML_TYPE_F32, 32, 1), x, y));  // not [M]
    CHECK(!takes(w, nullptr, -1, o.t(GGML_TYPE_F32, 64, 2), o.t(GGML_TYPE_F32, 512, 1), y));  // 2 columns for 1
    // 16 columns: a [M, 16] residual (its own column stride), or one [M] for all of them
    ggml_tensor * x16 = o.t(GGML_TYPE_F32, 512, 16);
    ggml_tensor * y16 = o.t(GGML_TYPE_F32, 64, 16);
    ggml_tensor * r16 = o.t(GGML_TYPE_F32, 64, 16);
    CHECK(takes(w, nullptr, -1, r16, x16, y16, &a));
    CHECK(a.bias == static_cast<const float *>(r16->data) && a.bias_stride == 64);
    CHECK(takes(w, nullptr, -1, y16, x16, y16));  // in place: the residual is the result itself
    ggml_tensor * wide = o.t(GGML_TYPE_F32, 100, 16);
    ggml_tensor * rv = ggml_view_2d(o.ctx, wide, 64, 16, wide->nb[1], 0);  // rows of a wider tensor
    CHECK(takes(w, nullptr, -1, rv, x16, y16, &a));
    CHECK(a.bias_stride == 100);
    CHECK(takes(w, nullptr, -1, o.t(GGML_TYPE_F32, 64, 1), x16, y16, &a));
    CHECK(a.bias_stride == 0);
    CHECK(!takes(w, nullptr, -1, o.t(GGML_TYPE_F32, 64, 8), x16, y16));  // neither 1 nor N columns
    CHECK(!takes(w, nullptr, -1, ggml_transpose(o.ctx, o.t(GGML_TYPE_F32, 16, 64)), x16, y16));  // strided rows
    CHECK(!takes(w, nullptr, -1, o.t(GGML_TYPE_F32, 64, 16, 2), x16, y16));  // 3-D
}

TEST_CASE(q4_k_and_q5_k_weights_are_taken_with_their_type) {
    operands o;
    ggml_tensor * x = o.t(GGML_TYPE_F32, 5120, 16);
    ggml_tensor * y = o.t(GGML_TYPE_F32, 1024, 16);
    matmul_args a;
    CHECK(takes(o.t(GGML_TYPE_Q4_K, 5120, 1024), nullptr, -1, nullptr, x, y, &a));
    CHECK(a.type == lucebox::kernels::q8_0::weight_type::q4_k && a.row_bytes == 5120 / 256 * 144);
    CHECK(takes(o.t(GGML_TYPE_Q8_0, 5120, 1024), nullptr, -1, nullptr, x, y, &a));
    CHECK(a.type == lucebox::kernels::q8_0::weight_type::q8_0);
    CHECK(!takes(o.t(GGML_TYPE_Q6_K, 5120, 1024), nullptr, -1, nullptr, x, y));
    CHECK(!takes(o.t(GGML_TYPE_Q5_0, 5120, 1024), nullptr, -1, nullptr, x, y));
    // Q5_K (176-byte row chunks), in ggml's layout or row-tiled
    CHECK(takes(o.t(GGML_TYPE_Q5_K, 5120, 1024), nullptr, -1, nullptr, x, y, &a));
    CHECK(a.type == lucebox::kernels::q8_0::weight_type::q5_k && a.row_bytes == 5120 / 256 * 176 && check_args(a) == nullptr);
    CHECK(args_from_ggml(o.t(GGML_TYPE_Q5_K, 5120, 1024), nullptr, -1, nullptr, x, y, a, nullptr, 0.0f, /*tiled =*/true));
    CHECK(a.tiled && check_args(a) == nullptr);
    // a Q4_K gate with Q8_0 up (or the reverse) is no fused product
    ggml_tensor * up = o.t(GGML_TYPE_Q4_K, 5120, 1024);
    CHECK(takes(up, o.t(GGML_TYPE_Q4_K, 5120, 1024), GGML_GLU_OP_SWIGLU, nullptr, x, y));
    CHECK(!takes(up, o.t(GGML_TYPE_Q8_0, 5120, 1024), GGML_GLU_OP_SWIGLU, nullptr, x, y));
}

TEST_CASE(a_fused_rms_norm_takes_one_f32_weight_per_input_row) {
    operands o;
    ggml_tensor * w = o.t(GGML_TYPE_Q8_0, 5120, 1024);
    ggml_tensor * x = o.t(GGML_TYPE_F32, 5120, 16);
    ggml_tensor * y = o.t(GGML_TYPE_F32, 1024, 16);
    matmul_args a;
    CHECK(takes(w, nullptr, -1, nullptr, x, y, &a, o.t(GGML_TYPE_F32, 5120, 1), 1e-6f));
    CHECK(a.norm_w != nullptr && a.norm_eps == 1e-6f);
    CHECK(takes(w, nullptr, -1, nullptr, x, y, &a));
    CHECK(a.norm_w == nullptr);
    CHECK(!takes(w, nullptr, -1, nullptr, x, y, nullptr, o.t(GGML_TYPE_F32, 4096, 1), 1e-6f));   // not K long
    CHECK(!takes(w, nullptr, -1, nullptr, x, y, nullptr, o.t(GGML_TYPE_F32, 5120, 16), 1e-6f));  // not a vector
    CHECK(!takes(w, nullptr, -1, nullptr, x, y, nullptr, o.t(GGML_TYPE_F16, 5120, 1), 1e-6f));
    CHECK(!takes(w, nullptr, -1, nullptr, x, y, nullptr, o.t(GGML_TYPE_F32, 5120, 1), -1.0f));   // eps < 0
    // the kernel reads the norm weight before its dependent-launch wait: a weight (or a view of one), not a
    // tensor the graph computes
    ggml_tensor * leaf = o.t(GGML_TYPE_F32, 5120, 2);
    CHECK(takes(w, nullptr, -1, nullptr, x, y, nullptr, ggml_view_1d(o.ctx, leaf, 5120, 5120 * sizeof(float)), 1e-6f));
    CHECK(!takes(w, nullptr, -1, nullptr, x, y, nullptr, ggml_scale(o.ctx, o.t(GGML_TYPE_F32, 5120, 1), 2.0f), 1e-6f));
    CHECK(!takes(w, nullptr, -1, nullptr, x, y, nullptr, ggml_view_1d(o.ctx, ggml_scale(o.ctx, leaf, 2.0f), 5120, 0), 1e-6f));
}

TEST_MAIN()

TEST_CASE(more_than_64_columns_only_for_row_tiled_weights) {
    operands o;
    ggml_tensor * w = o.t(GGML_TYPE_Q8_0, 512, 64);
    ggml_tensor * x = o.t(GGML_TYPE_F32, 512, 300);
    ggml_tensor * y = o.t(GGML_TYPE_F32, 64, 300);
    matmul_args a;
    CHECK(!args_from_ggml(w, nullptr, -1, nullptr, x, y, a));  // ggml's (MMQ or the BF16 route)
    CHECK(args_from_ggml(w, nullptr, -1, nullptr, x, y, a, nullptr, 0.0f, /*tiled =*/true));
    CHECK(a.N == 300);  // the full count: the hook runs it in groups of 64
    CHECK(!args_from_ggml(o.t(GGML_TYPE_Q8_0, 288, 64), nullptr, -1, nullptr, o.t(GGML_TYPE_F32, 288, 300), y, a,
                          nullptr, 0.0f, true));  // other refusals stay
}

TEST_CASE(q6_k_only_for_row_tiled_weights_of_whole_tiles) {
    operands o;
    ggml_tensor * x = o.t(GGML_TYPE_F32, 512, 1);
    matmul_args a;
    ggml_tensor * w = o.t(GGML_TYPE_Q6_K, 512, 64);
    ggml_tensor * y = o.t(GGML_TYPE_F32, 64, 1);
    CHECK(!args_from_ggml(w, nullptr, -1, nullptr, x, y, a));  // ggml's layout: ggml's kernels
    CHECK(args_from_ggml(w, nullptr, -1, nullptr, x, y, a, nullptr, 0.0f, /*tiled =*/true));
    CHECK(a.type == weight_type::q6_k && a.tiled && a.row_bytes == 2 * 210);
    ggml_tensor * w40 = o.t(GGML_TYPE_Q6_K, 512, 40);  // a partial last tile
    CHECK(!args_from_ggml(w40, nullptr, -1, nullptr, x, o.t(GGML_TYPE_F32, 40, 1), a, nullptr, 0.0f, true));
    CHECK(check_args(a) != nullptr);
}
