// cpp/kernels/bf16_dequant.cuh against ggml's CPU dequantization: random rows quantized by ggml to
// Q8_0, Q4_K, Q5_K and Q6_K, dequantized on the GPU to BF16 and by ggml's to_float on the CPU. Every value
// must be the CPU value rounded to BF16 (round to nearest even), and equal to it bit for bit
// wherever the kernel's float arithmetic is ggml's (all of Q8_0 and Q6_K; Q4_K's and Q5_K's d * q - m where
// ggml's compiler did not contract it into an FMA: at most 1 BF16 ulp apart then). Sizes from one
// block to a few hundred thousand values, odd block counts included; a size that is not whole
// blocks is refused; row-tiled weights (Q6_K too) give their untiled values. Without a GPU at run time it says so and checks nothing (exit 0).
#include "bf16_dequant.cuh"
#include "cuda_check.h"
#include "ggml.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace dq = lucebox::kernels::bf16_dequant;

namespace {

int failures = 0;

uint16_t bf16_bits_of(float v) {  // round to nearest even, as __float2bfloat16_rn (no NaNs here)
    uint32_t u;
    std::memcpy(&u, &v, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

void check(std::mt19937 & rng, ggml_type type, dq::format f, int64_t n, bool exact) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = nd(rng) * (i % 97 == 0 ? 20.0f : 1.0f);  // some outliers
    const int64_t per_row = dq::values_per_block(f);  // one block per row: any n of whole blocks
    std::vector<uint8_t> q(size_t(n / per_row) * dq::block_bytes(f));
    ggml_quantize_chunk(type, x.data(), q.data(), 0, n / per_row, per_row, nullptr);
    std::vector<float> ref(n);
    ggml_get_type_traits(type)->to_float(q.data(), ref.data(), n);

    void * dq_src = nullptr;
    __nv_bfloat16 * dst = nullptr;
    CHECK_CUDA(cudaMalloc(&dq_src, q.size()));
    CHECK_CUDA(cudaMalloc(&dst, size_t(n) * 2));
    CHECK_CUDA(cudaMemcpy(dq_src, q.data(), q.size(), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(dst, 0xFF, size_t(n) * 2));
    CHECK_CUDA(dq::dequantize(f, dq_src, n, dst, nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<uint16_t> got(n);
    CHECK_CUDA(cudaMemcpy(got.data(), dst, size_t(n) * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaFree(dq_src));
    CHECK_CUDA(cudaFree(dst));

    int64_t off = 0, worst_at = -1;
    int worst = 0;
    for (int64_t i = 0; i < n; ++i) {
        const int d = std::abs(int(got[i]) - int(bf16_bits_of(ref[i])));  // same sign: ulps
        if (d != 0) ++off;
        if (d > worst) worst = d, worst_at = i;
    }
    const bool ok = worst <= 1 && (!exact || off == 0);
    if (!ok) ++failures;
    std::printf("%s %-5s n=%-7lld %lld values off by 1 BF16 ulp, worst %d ulp%s\n", ok ? "ok  " : "FAIL",
                ggml_type_name(type), (long long) n, (long long) off, worst,
                worst_at >= 0 && !ok ? " (first worst below)" : "");
    if (!ok) std::printf("     at %lld: cpu %.9g, gpu bits %04x, expected %04x\n", (long long) worst_at, ref[worst_at],
                         got[worst_at], bf16_bits_of(ref[worst_at]));
}

// A row-tiled weight (weight_tiles.h) of M rows of K values dequantizes to the same BF16 values, in
// row-major order, as its untiled blocks (M = 37: a partial last tile).
void check_tiled(std::mt19937 & rng, ggml_type type, dq::format f, int64_t K, int64_t M) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t n = K * M;
    std::vector<float> x(n);
    for (auto & v : x) v = nd(rng);
    const int64_t row_bytes = K / dq::values_per_block(f) * dq::block_bytes(f);
    std::vector<uint8_t> q(size_t(M * row_bytes)), t(q.size());
    ggml_quantize_chunk(type, x.data(), q.data(), 0, M, K, nullptr);
    lucebox::kernels::tiles::to_tiles(q.data(), t.data(), M, row_bytes, dq::detail::chunk_bytes(f));
    void * src = nullptr;
    __nv_bfloat16 * dst = nullptr;
    CHECK_CUDA(cudaMalloc(&src, q.size()));
    CHECK_CUDA(cudaMalloc(&dst, size_t(n) * 2));
    std::vector<uint16_t> plain(n), tiled(n);
    CHECK_CUDA(cudaMemcpy(src, q.data(), q.size(), cudaMemcpyHostToDevice));
    CHECK_CUDA(dq::dequantize(f, src, n, dst, nullptr));
    CHECK_CUDA(cudaMemcpy(plain.data(), dst, size_t(n) * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(src, t.data(), t.size(), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(dst, 0xFF, size_t(n) * 2));
    CHECK_CUDA(dq::dequantize(f, src, n, dst, nullptr, M, row_bytes));
    CHECK_CUDA(cudaMemcpy(tiled.data(), dst, size_t(n) * 2, cudaMemcpyDeviceToHost));
    const cudaError_t refused = dq::dequantize(f, src, n - K, dst, nullptr, M, row_bytes);  // not M rows
    CHECK_CUDA(cudaFree(src));
    CHECK_CUDA(cudaFree(dst));
    const bool ok = plain == tiled && refused == cudaErrorInvalidValue;
    if (!ok) ++failures;
    std::printf("%s %-5s row-tiled K=%lld M=%lld: the untiled values bit for bit, a wrong size refused\n",
                ok ? "ok  " : "FAIL", ggml_type_name(type), (long long) K, (long long) M);
}

}  // namespace

int main() {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        std::printf("  (no CUDA device at run time: test_bf16_dequant checks nothing)\n");
        return 0;
    }
    std::mt19937 rng(11);
    const struct { ggml_type type; dq::format f; bool exact; } formats[] = {
        {GGML_TYPE_Q8_0, dq::format::q8_0, true},
        {GGML_TYPE_Q4_K, dq::format::q4_k, false},
        {GGML_TYPE_Q5_K, dq::format::q5_k, false},
        {GGML_TYPE_Q6_K, dq::format::q6_k, true},
    };
    for (const auto & fm : formats) {
        const int64_t b = dq::values_per_block(fm.f);
        for (int64_t blocks : {int64_t(1), int64_t(3), int64_t(8), int64_t(257), int64_t(1031)}) check(rng, fm.type, fm.f, b * blocks, fm.exact);
        check(rng, fm.type, fm.f, b * (int64_t(300000) / b), fm.exact);
        // not whole blocks, or nothing: refused before any launch
        const cudaError_t e1 = dq::dequantize(fm.f, nullptr, b + 16, nullptr, nullptr);
        const cudaError_t e2 = dq::dequantize(fm.f, nullptr, 0, nullptr, nullptr);
        const bool refused = e1 == cudaErrorInvalidValue && e2 == cudaErrorInvalidValue;
        if (!refused) ++failures;
        std::printf("%s %-5s refuses %lld and 0 values\n", refused ? "ok  " : "FAIL", ggml_type_name(fm.type),
                    (long long) (b + 16));
    }
    for (int64_t M : {int64_t(1), int64_t(16), int64_t(37)}) {
        check_tiled(rng, GGML_TYPE_Q8_0, dq::format::q8_0, 768, M);
        check_tiled(rng, GGML_TYPE_Q4_K, dq::format::q4_k, 768, M);
        check_tiled(rng, GGML_TYPE_Q5_K, dq::format::q5_k, 768, M);
        check_tiled(rng, GGML_TYPE_Q6_K, dq::format::q6_k, 768, M);
    }
    std::printf(failures == 0 ? "all passed\n" : "%d FAILED\n", failures);
    return failures == 0 ? 0 : 1;
}
