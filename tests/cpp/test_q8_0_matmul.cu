// cpp/kernels/q8_0_matmul.cuh against a CPU reference: random Q8_0, Q4_K and Q5_K weights (ggml's block
// layouts, decoded here from the format's description in q8_0_matmul_args.h) and activations, plain
// and gated (SwiGLU) products, 1..64 columns, padded strides, M not a multiple of the row tile. The
// reference quantizes the activations exactly as the kernel does (per 32 values for Q8_0 weights,
// per 256 for Q4_K, scale amax/127, round to nearest) and sums the exact integer block dot products in double (Q4_K: minus dmin *
// min times the block's float sum), so the only difference left is float rounding:
// |gpu - ref| <= 4e-5 * sum |terms|.
// Also checks that column 0 is bit-identical whatever N is (a decode step and a verify agree), and
// runs everything again with the weights in weight_tiles.h's row-tiled layout (the layout lucebox
// loads them in), whose products must be the untiled ones bit for bit. Q6_K (16 values a scale,
// one k16 mma each) runs row-tiled only.
// Without a GPU at run time it says so and checks nothing (exit 0), like the other GPU tests.
#include "cuda_check.h"
#include "q8_0_matmul.cuh"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace q8 = lucebox::kernels::q8_0;

namespace {

int failures = 0;

q8::weight_type g_type = q8::weight_type::q8_0;  // the format random_weights makes
bool g_tiled = false;                            // run() uploads the weights row-tiled

float half_at(const uint8_t * p) {
    __half h;
    std::memcpy(&h, p, 2);
    return __half2float(h);
}

struct weights {
    q8::weight_type type = q8::weight_type::q8_0;
    int K = 0, M = 0;
    int64_t row_bytes = 0;
    std::vector<uint8_t> bytes;  // [M][row_bytes]
    // the Q4_K / Q5_K super-block of block b (their first 16 bytes have the same layout)
    const uint8_t * q4k_block(int m, int b) const { return bytes.data() + m * row_bytes + (b / 8) * q8::chunk_bytes(type); }
    // the six-bit scale (which 0) or min (which 1) of block b (= sub-block b % 8 of super-block b / 8)
    int q4k_six_bit(int m, int b, int which) const {
        const uint8_t * sc = q4k_block(m, b) + 4;
        const int s = b % 8;
        if (s < 4) return sc[s + 4 * which] & 63;
        return which == 0 ? (sc[s + 4] & 0xF) | ((sc[s - 4] >> 6) << 4) : (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
    // value = scale(m, b) * q(m, k) - min(m, b), k in block b
    double scale(int m, int b) const {
        if (type == q8::weight_type::q8_0) return half_at(bytes.data() + m * row_bytes + b * q8::BLOCK_BYTES);
        return double(half_at(q4k_block(m, b))) * q4k_six_bit(m, b, 0);
    }
    double min(int m, int b) const {
        return !q8::has_mins(type) ? 0.0 : double(half_at(q4k_block(m, b) + 2)) * q4k_six_bit(m, b, 1);
    }
    // q6_k: the super-block of value k, and that value's position (half h, quarter p, index l)
    const uint8_t * q6k_block(int m, int k) const { return bytes.data() + m * row_bytes + (k / 256) * q8::Q6K_BLOCK_BYTES; }
    // the weight scale of value k (q6_k: one per 16 values; else per block of 32)
    double scale_at(int m, int k) const {
        if (type != q8::weight_type::q6_k) return scale(m, k / q8::QK);
        const int v = k % 256, h = v / 128, p = (v % 128) / 32, l = v % 32;
        return double(half_at(q6k_block(m, k) + 208)) * int(int8_t(q6k_block(m, k)[192 + 8 * h + 2 * p + l / 16]));
    }
    int q(int m, int k) const {
        if (type == q8::weight_type::q6_k) {
            const uint8_t * b = q6k_block(m, k);
            const int v = k % 256, h = v / 128, p = (v % 128) / 32, l = v % 32;
            const int lo = (b[64 * h + 32 * (p % 2) + l] >> (4 * (p / 2))) & 0xF, hi = (b[128 + 32 * h + l] >> (2 * p)) & 3;
            return (lo | (hi << 4)) - 32;
        }
        if (type == q8::weight_type::q8_0)
            return int(int8_t(bytes[m * row_bytes + (k / q8::QK) * q8::BLOCK_BYTES + 2 + k % q8::QK]));
        const int s = (k / q8::QK) % 8, i = k % q8::QK;  // bytes 32 (s / 2) + i, nibble s % 2
        if (type == q8::weight_type::q5_k) {  // ... after 32 bytes qh, whose byte i has bit s of value i
            const uint8_t * b = q4k_block(m, k / q8::QK);
            return ((b[48 + 32 * (s / 2) + i] >> (4 * (s % 2))) & 0xF) | (((b[16 + i] >> s) & 1) << 4);
        }
        return (q4k_block(m, k / q8::QK)[16 + 32 * (s / 2) + i] >> (4 * (s % 2))) & 0xF;
    }
};

weights random_weights(std::mt19937 & rng, int K, int M, int64_t pad) {
    weights w;
    w.type = g_type;
    w.K = K;
    w.M = M;
    w.row_bytes = int64_t(K) / q8::K_ALIGN * q8::chunk_bytes(g_type) + pad;
    w.bytes.assign(size_t(M) * w.row_bytes, 0xAB);  // padding bytes are garbage the kernel must skip
    std::uniform_int_distribution<int> qd(-127, 127);
    std::uniform_real_distribution<float> sd(1e-3f, 2e-2f);
    for (int m = 0; m < M; ++m) {
        uint8_t * row = w.bytes.data() + m * w.row_bytes;
        if (g_type == q8::weight_type::q6_k) {
            for (int sb = 0; sb < K / q8::K_ALIGN; ++sb) {
                uint8_t * blk = row + sb * q8::Q6K_BLOCK_BYTES;
                for (int i = 0; i < 208; ++i) blk[i] = uint8_t(rng());  // quants and int8 scales: any bytes
                const __half d = __float2half(sd(rng) / 64 * (rng() % 2 ? 1.0f : -1.0f));
                std::memcpy(blk + 208, &d, 2);
            }
            continue;
        }
        if (q8::has_mins(g_type)) {  // Q4_K, Q5_K
            const int cb = q8::chunk_bytes(g_type);
            for (int sb = 0; sb < K / q8::K_ALIGN; ++sb) {
                uint8_t * blk = row + sb * cb;
                const __half d = __float2half(sd(rng) / 8), dmin = __float2half(sd(rng) / 8);
                std::memcpy(blk, &d, 2);
                std::memcpy(blk + 2, &dmin, 2);
                for (int i = 4; i < cb; ++i) blk[i] = uint8_t(rng());  // any bytes are valid
            }
            continue;
        }
        for (int b = 0; b < K / q8::QK; ++b) {
            uint8_t * blk = row + b * q8::BLOCK_BYTES;
            const __half d = __float2half(sd(rng) * (rng() % 2 ? 1.0f : -1.0f));
            std::memcpy(blk, &d, 2);
            for (int i = 0; i < q8::QK; ++i) blk[2 + i] = uint8_t(int8_t(qd(rng)));
        }
    }
    return w;
}

// x quantized as the kernel does (one scale per 32 values for Q8_0 weights, per 256 for Q4_K);
// returns the exact integer block sums in double.
void reference(const weights & w, const std::vector<float> & x, int64_t x_stride, int N, std::vector<double> & y,
               std::vector<double> & mag) {
    const int nb = w.K / q8::QK;
    const int group = q8::chunk_scaled(w.type) ? q8::CHUNK_BLOCKS * q8::QK : q8::QK;
    std::vector<int> xq(size_t(N) * w.K);
    std::vector<float> xd(size_t(N) * nb);
    for (int n = 0; n < N; ++n)
        for (int g0 = 0; g0 < w.K; g0 += group) {
            float amax = 0;
            for (int i = 0; i < group; ++i) amax = std::fmax(amax, std::fabs(x[n * x_stride + g0 + i]));
            const float d = amax / 127;
            for (int b = g0 / q8::QK; b < (g0 + group) / q8::QK; ++b) xd[n * nb + b] = d;
            for (int i = 0; i < group; ++i)
                xq[size_t(n) * w.K + g0 + i] = amax == 0.0f ? 0 : int(std::round(x[n * x_stride + g0 + i] / d));
        }
    std::vector<double> xsum(size_t(N) * nb, 0.0);  // the blocks' float sums (the Q4_K mins)
    for (int n = 0; n < N; ++n)
        for (int b = 0; b < nb; ++b)
            for (int i = 0; i < q8::QK; ++i) xsum[size_t(n) * nb + b] += x[n * x_stride + b * q8::QK + i];
    y.assign(size_t(N) * w.M, 0.0);
    mag.assign(size_t(N) * w.M, 0.0);
    // each weight row decoded once (its quants, a scale per wg values, a min per block), then dotted
    // with every column: the same terms summed in the same order as value by value
    const int wg = w.type == q8::weight_type::q6_k ? 16 : q8::QK;  // values per weight scale
    std::vector<int> q(w.K);
    std::vector<double> scales(w.K / wg), mins(nb);
    for (int m = 0; m < w.M; ++m) {
        for (int k = 0; k < w.K; ++k) q[k] = w.q(m, k);
        for (int g = 0; g < w.K / wg; ++g) scales[g] = w.scale_at(m, g * wg);
        for (int b = 0; b < nb; ++b) mins[b] = w.min(m, b);
        for (int n = 0; n < N; ++n) {
            const int * xn = xq.data() + size_t(n) * w.K;
            double s = 0, a = 0;
            for (int b = 0; b < nb; ++b) {
                for (int k0 = b * q8::QK; k0 < (b + 1) * q8::QK; k0 += wg) {
                    int dot = 0;  // |q| <= 127, |xq| <= 127, 32 terms: fits
                    for (int i = 0; i < wg; ++i) dot += q[k0 + i] * xn[k0 + i];
                    const double term = scales[k0 / wg] * xd[n * nb + b] * double(dot);
                    s += term;
                    a += std::fabs(term);
                }
                const double min_term = mins[b] * xsum[size_t(n) * nb + b];
                s -= min_term;
                a += std::fabs(min_term);
            }
            y[size_t(n) * w.M + m] = s;
            mag[size_t(n) * w.M + m] = a;
        }
    }
}

struct device_buffer {
    void * p = nullptr;
    explicit device_buffer(size_t bytes) { CHECK_CUDA(cudaMalloc(&p, bytes == 0 ? 16 : bytes)); }
    ~device_buffer() { cudaFree(p); }
    template <class T>
    T * as() const { return static_cast<T *>(p); }
};

// Runs one product on the GPU; returns y [N][y_stride] (columns past M hold the sentinel).
// bias: [M] for every column (bias_stride 0), or [N][bias_stride]; in_place: the bias is y's
// initial contents (bias_stride == y_stride), the product adds onto them.
// norm_w: [K] weights of a fused RMS norm of x (eps kNormEps).
constexpr float kNormEps = 1e-6f;
std::vector<float> run(const weights & w, const weights * gate, const std::vector<float> & x, int64_t x_stride, int N,
                       int64_t y_stride, const std::vector<float> * bias = nullptr, int64_t bias_stride = 0,
                       bool in_place = false, const std::vector<float> * norm_w = nullptr) {
    device_buffer dw(w.bytes.size()), dg(gate ? gate->bytes.size() : 0), dx(x.size() * 4),
        dy(size_t(N) * y_stride * 4);
    auto upload = [&](const weights & m, const device_buffer & d) {
        std::vector<uint8_t> b = m.bytes;
        if (g_tiled) lucebox::kernels::tiles::to_tiles(m.bytes.data(), b.data(), m.M, m.row_bytes, q8::chunk_bytes(m.type));
        CHECK_CUDA(cudaMemcpy(d.p, b.data(), b.size(), cudaMemcpyHostToDevice));
    };
    upload(w, dw);
    if (gate) upload(*gate, dg);
    CHECK_CUDA(cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    device_buffer db(bias ? bias->size() * 4 : 0), dn(norm_w ? norm_w->size() * 4 : 0);
    if (bias) CHECK_CUDA(cudaMemcpy(db.p, bias->data(), bias->size() * 4, cudaMemcpyHostToDevice));
    if (norm_w) CHECK_CUDA(cudaMemcpy(dn.p, norm_w->data(), norm_w->size() * 4, cudaMemcpyHostToDevice));
    std::vector<float> y(size_t(N) * y_stride, -12345.0f);
    if (in_place) y = *bias;
    CHECK_CUDA(cudaMemcpy(dy.p, y.data(), y.size() * 4, cudaMemcpyHostToDevice));
    q8::matmul_args a;
    a.type = w.type;
    a.w = dw.as<uint8_t>();
    a.gate = gate ? dg.as<uint8_t>() : nullptr;
    a.row_bytes = w.row_bytes;
    a.K = w.K;
    a.M = w.M;
    a.tiled = g_tiled;
    a.N = N;
    a.x = dx.as<float>();
    a.x_stride = x_stride;
    a.y = dy.as<float>();
    a.y_stride = y_stride;
    a.bias = in_place ? dy.as<float>() : bias ? db.as<float>() : nullptr;
    a.bias_stride = bias_stride;
    a.norm_w = norm_w ? dn.as<float>() : nullptr;
    a.norm_eps = kNormEps;
    if (const char * why = q8::check_args(a)) {
        std::printf("FAIL: check_args refused a valid product: %s\n", why);
        ++failures;
        return y;
    }
    device_buffer ds(q8::scratch_bytes(a));
    // garbage (NaN scales and sums, int8 -1): nothing may rely on zeros, nor read the padding
    // columns' (never written) values into a real column
    CHECK_CUDA(cudaMemset(ds.p, 0xff, q8::scratch_bytes(a)));
    CHECK_CUDA(q8::matmul(a, ds.p, nullptr));
    if (!in_place) CHECK_CUDA(q8::matmul(a, ds.p, nullptr));  // again, on the used scratch
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(y.data(), dy.p, y.size() * 4, cudaMemcpyDeviceToHost));
    return y;
}

double silu(double v) { return v / (1.0 + std::exp(-v)); }

// bias: 0 none, 1 one [M] vector for every column, 2 a per-column residual [N][M + 3], 3 that
// residual added in place (y starts as the residual). norm: the input is RMS-normed with random
// weights first (the reference quantizes x * w, as the kernel, and scales by the exact factor).
void check_case(std::mt19937 & rng, int K, int M, int N, bool gated, int64_t w_pad, int64_t x_pad, int64_t y_pad,
                int bias_mode = 0, bool norm = false) {
    const bool with_bias = bias_mode != 0;
    const weights w = random_weights(rng, K, M, w_pad);
    const weights g = gated ? random_weights(rng, K, M, w_pad) : weights{};
    const int64_t x_stride = K + x_pad, y_stride = M + y_pad;
    std::vector<float> x(size_t(N) * x_stride);
    std::normal_distribution<float> xd(0.0f, 1.0f);
    for (auto & v : x) v = xd(rng);
    if (N > 1)
        for (int k = 0; k < 32; ++k) x[x_stride + k] = 0.0f;  // an all-zero block (scale 0)
    const int64_t bias_stride = bias_mode == 1 ? 0 : bias_mode == 2 ? M + 3 : y_stride;
    std::vector<float> bias(bias_mode <= 1 ? size_t(M) : size_t(N) * bias_stride);
    for (auto & v : bias) v = xd(rng);
    if (bias_mode == 3)
        for (int n = 0; n < N; ++n)
            for (int64_t m = M; m < y_stride; ++m) bias[size_t(n) * y_stride + m] = -12345.0f;  // past M: untouched
    std::vector<float> norm_w(K);
    std::uniform_real_distribution<float> nw(0.5f, 2.0f);
    for (auto & v : norm_w) v = nw(rng) * (rng() % 2 ? 1.0f : -1.0f);
    const std::vector<float> y = run(w, gated ? &g : nullptr, x, x_stride, N, y_stride, with_bias ? &bias : nullptr,
                                     bias_stride, bias_mode == 3, norm ? &norm_w : nullptr);
    std::vector<float> xw = x;  // what the kernel quantizes
    std::vector<double> factor(N, 1.0);
    if (norm)
        for (int n = 0; n < N; ++n) {
            double sq = 0;
            for (int k = 0; k < K; ++k) {
                sq += double(x[size_t(n) * x_stride + k]) * x[size_t(n) * x_stride + k];
                xw[size_t(n) * x_stride + k] = x[size_t(n) * x_stride + k] * norm_w[k];
            }
            factor[n] = 1.0 / std::sqrt(sq / K + kNormEps);
        }
    std::vector<double> ry, rm, gy, gm;
    reference(w, xw, x_stride, N, ry, rm);
    if (gated) reference(g, xw, x_stride, N, gy, gm);
    for (int n = 0; n < N; ++n)
        for (int m = 0; m < M; ++m) {
            const size_t i = size_t(n) * M + m;
            ry[i] *= factor[n];
            rm[i] *= factor[n];
            if (gated) {
                gy[i] *= factor[n];
                gm[i] *= factor[n];
            }
        }
    double worst = 0;
    int bad = 0;
    for (int n = 0; n < N; ++n) {
        for (int m = 0; m < M; ++m) {
            const size_t i = size_t(n) * M + m;
            const double b = !with_bias ? 0.0 : bias[size_t(n) * bias_stride + m];
            // the norm factor is a float sum of K squares and an rsqrtf: a few 1e-6 relative
            const double rel = norm ? 4e-6 : 0.0;
            double want = ry[i] + b, tol = 4e-5 * rm[i] + rel * std::fabs(ry[i]) + 1e-6 * std::fabs(want) + 1e-30;
            if (gated) {
                want = ry[i] * silu(gy[i]);
                // d(u*silu(g)) = silu(g) du + u silu'(g) dg, |silu'| <= 1.1
                tol = std::fabs(silu(gy[i])) * (4e-5 * rm[i] + rel * std::fabs(ry[i])) +
                      std::fabs(ry[i]) * 1.1 * (4e-5 * gm[i] + rel * std::fabs(gy[i])) + 1e-30;
            }
            const double got = y[size_t(n) * y_stride + m];
            const double err = std::fabs(got - want) / tol;
            worst = std::fmax(worst, err);
            if (!(err <= 1.0)) ++bad;
        }
        for (int64_t m = M; m < y_stride; ++m)
            if (y[size_t(n) * y_stride + m] != -12345.0f) ++bad;  // wrote past M
    }
    std::printf("%s K=%d M=%d N=%d %s%s%s pads (w %lld, x %lld, y %lld): worst err/tol %.3f\n", bad ? "FAIL" : "ok  ", K,
                M, N, gated ? "gated" : "plain", bias_mode == 1 ? "+bias" : bias_mode == 2 ? "+residual" : bias_mode == 3 ? "+residual in place" : "", norm ? " rms-normed input" : "", (long long)w_pad, (long long)x_pad,
                (long long)y_pad, worst);
    if (bad) ++failures;
}

// Column 0 of a product is the same bits for every N (no dependence on the other columns, nor on the
// grid, which depends on N's shared memory where a CTA loops over several tiles: M = 12000).
void check_column_independence(std::mt19937 & rng, bool gated, bool norm, int K = 8192, int M = 0) {
    if (M == 0) M = g_type == q8::weight_type::q6_k ? 208 : 200;  // q6_k: whole 16-row tiles
    const weights w = random_weights(rng, K, M, 0);
    const weights g = random_weights(rng, K, M, 0);
    std::vector<float> x(size_t(64) * K), norm_w(K);
    std::normal_distribution<float> xd(0.0f, 1.0f);
    for (auto & v : x) v = xd(rng);
    for (auto & v : norm_w) v = xd(rng);
    const std::vector<float> * nw = norm ? &norm_w : nullptr;
    const std::vector<float> one = run(w, gated ? &g : nullptr, x, K, 1, M, nullptr, 0, false, nw);
    for (int N : {2, 8, 16, 17, 33, 64}) {
        const std::vector<float> many = run(w, gated ? &g : nullptr, x, K, N, M, nullptr, 0, false, nw);
        const bool same = std::memcmp(one.data(), many.data(), size_t(M) * 4) == 0;
        std::printf("%s column 0 of N=%d equals N=1 bit for bit (K=%d M=%d %s%s)\n", same ? "ok  " : "FAIL", N, K, M,
                    gated ? "gated" : "plain", norm ? ", rms-normed input" : "");
        if (!same) ++failures;
    }
}

// The same product with the weights row-tiled and not: the same bits (M = 333: a partial last tile).
void check_tiled_equals_untiled(std::mt19937 & rng, bool gated) {
    const int K = 1280, M = 333;
    const weights w = random_weights(rng, K, M, 0);
    const weights g = random_weights(rng, K, M, 0);
    std::vector<float> x(size_t(64) * K);
    std::normal_distribution<float> xd(0.0f, 1.0f);
    for (auto & v : x) v = xd(rng);
    const bool saved = g_tiled;
    for (int N : {1, 16, 64}) {
        g_tiled = false;
        const std::vector<float> plain = run(w, gated ? &g : nullptr, x, K, N, M);
        g_tiled = true;
        const std::vector<float> tiled = run(w, gated ? &g : nullptr, x, K, N, M);
        const bool same = plain.size() == tiled.size() && std::memcmp(plain.data(), tiled.data(), plain.size() * 4) == 0;
        std::printf("%s row-tiled weights give the untiled product bit for bit (N=%d, %s)\n", same ? "ok  " : "FAIL", N,
                    gated ? "gated" : "plain");
        if (!same) ++failures;
    }
    g_tiled = saved;
}

void check_refusals() {
    q8::matmul_args a;
    alignas(16) static uint8_t buf[64];
    a.w = buf;
    a.row_bytes = 272;
    a.K = 256;
    a.M = 4;
    a.N = 1;
    a.x_stride = 256;
    a.y_stride = 4;
    const bool base_ok = q8::check_args(a) == nullptr;
    q8::matmul_args b = a;
    b.K = 128;
    const bool k_refused = q8::check_args(b) != nullptr;
    b = a;
    b.N = 0;
    const bool n_refused = q8::check_args(b) != nullptr;
    b.N = 1000;  // any count: launches of 64 columns
    const bool many_ok = q8::check_args(b) == nullptr && q8::scratch_bytes(b) == [&] { q8::matmul_args c = a; c.N = 64; return q8::scratch_bytes(c); }();
    b = a;
    b.w = buf + 2;
    const bool align_refused = q8::check_args(b) != nullptr;
    b = a;
    b.row_bytes = 280;
    const bool stride_refused = q8::check_args(b) != nullptr;
    b = a;
    b.gate = buf;
    b.bias = reinterpret_cast<const float *>(buf);
    const bool gated_bias_refused = q8::check_args(b) != nullptr;
    b = a;
    b.bias = reinterpret_cast<const float *>(buf);
    b.bias_stride = 3;  // < M: columns would overlap
    const bool bias_stride_refused = q8::check_args(b) != nullptr;
    b = a;
    b.norm_w = reinterpret_cast<const float *>(buf);
    const bool norm_ok = q8::check_args(b) == nullptr;
    b.norm_eps = -1.0f;
    const bool eps_refused = q8::check_args(b) != nullptr;
    const bool ok = base_ok && k_refused && n_refused && many_ok && align_refused && stride_refused && gated_bias_refused &&
                    bias_stride_refused && norm_ok && eps_refused;
    std::printf("%s check_args accepts a valid product and refuses K %% 256, N = 0 (takes N = 1000 with a 64-column scratch), misalignment, row stride, gated + bias, bias stride, a negative norm eps\n",
                ok ? "ok  " : "FAIL");
    if (!ok) ++failures;
}

}  // namespace

int main() {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        std::printf("  (no CUDA device at run time: test_q8_0_matmul checks nothing)\n");
        return 0;
    }
    cudaDeviceProp prop{};
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    if (prop.major < 8) {
        std::printf("  (compute capability %d.%d < 8.0: the kernel is not used here; nothing checked)\n", prop.major,
                    prop.minor);
        return 0;
    }
    check_refusals();
    for (bool tiled : {false, true})
    for (q8::weight_type type : {q8::weight_type::q8_0, q8::weight_type::q4_k, q8::weight_type::q5_k}) {
    std::mt19937 rng(7);  // the same cases tiled and untiled
    g_type = type;
    g_tiled = tiled;
    std::printf("-- %s weights%s\n", type == q8::weight_type::q8_0 ? "Q8_0" : type == q8::weight_type::q4_k ? "Q4_K" : "Q5_K",
                tiled ? ", row-tiled" : "");
    for (bool gated : {false, true}) {
        check_case(rng, 256, 1, 1, gated, 0, 0, 0);
        check_case(rng, 512, 17, 3, gated, 16, 5, 3);
        check_case(rng, 768, 48, 16, gated, 0, 0, 0);
        check_case(rng, 5120, 100, 1, gated, 0, 0, 0);
        check_case(rng, 5120, 100, 8, gated, 32, 0, 0);
        check_case(rng, 1280, 333, 17, gated, 0, 1, 7);
        check_case(rng, 2048, 64, 40, gated, 0, 0, 0);
        check_case(rng, 4352, 1024, 64, gated, 0, 0, 0);
        check_case(rng, 17408, 64, 16, gated, 0, 0, 0);
        check_case(rng, 17408, 40, 1, gated, 16, 0, 2);
        check_case(rng, 1024, 77, 150, gated, 0, 3, 5);  // more than 64 columns: three launches
        if (tiled) check_tiled_equals_untiled(rng, gated);
        check_column_independence(rng, gated, false);
        check_column_independence(rng, gated, true);
        // more tiles than CTAs fit on a device at once (an H200: 132 multiprocessors x at most 4
        // CTAs x 16 rows = 8448): CTAs loop over tiles (test_q8_0_matmul_persistent; the default
        // build from 3 waves on); K = 256: warps 1..3 take no chunk
        check_case(rng, 256, 20000, 1, gated, 0, 0, 0);
        check_case(rng, 1280, 12000, 16, gated, 16, 0, 3, 0, true);
        check_column_independence(rng, gated, true, 1280, 12000);
        // a fused RMS norm of the input (the layer norm before the DeltaNet / attention / FFN products)
        check_case(rng, 5120, 100, 1, gated, 0, 0, 0, 0, true);
        check_case(rng, 1280, 333, 17, gated, 0, 1, 7, 0, true);
        check_case(rng, 4352, 1024, 64, gated, 0, 8, 0, 0, true);
    }
    check_case(rng, 5120, 300, 16, false, 0, 0, 0, 3, true);  // a norm and an in-place residual together
    check_case(rng, 5120, 333, 1, false, 0, 0, 0, 1);  // the fused residual add of a decode step
    check_case(rng, 5120, 333, 1, false, 0, 0, 0, 3);  // ... in place
    check_case(rng, 1024, 40, 16, false, 16, 0, 3, 1);  // one [M] vector for every column
    check_case(rng, 1024, 40, 16, false, 16, 0, 3, 2);  // a verify's residual [16][M]
    check_case(rng, 6144, 5120, 16, false, 0, 0, 0, 3);  // ... in place (ssm_out / attn_output shape)
    check_case(rng, 2048, 200, 64, false, 0, 4, 9, 3);
    check_case(rng, 512, 17, 33, false, 0, 0, 5, 2);
    check_case(rng, 1024, 200, 150, false, 0, 0, 3, 3, true);  // 150 columns: a norm, a residual in place
    check_case(rng, 1024, 40, 130, false, 16, 0, 3, 2);         // ... a per-column residual
    }
    // Q6_K: row-tiled weights only, whole 16-row tiles, no row padding
    {
        std::mt19937 rng(11);
        g_type = q8::weight_type::q6_k;
        g_tiled = true;
        std::printf("-- Q6_K weights, row-tiled\n");
        for (bool gated : {false, true}) {
            check_case(rng, 256, 16, 1, gated, 0, 0, 0);
            check_case(rng, 512, 48, 3, gated, 0, 5, 3);
            check_case(rng, 5120, 96, 1, gated, 0, 0, 0);
            check_case(rng, 5120, 112, 8, gated, 0, 0, 0);
            check_case(rng, 1280, 336, 17, gated, 0, 1, 7);
            check_case(rng, 17408, 64, 16, gated, 0, 0, 0);
            check_case(rng, 2048, 64, 40, gated, 0, 0, 0);
            check_case(rng, 1024, 80, 150, gated, 0, 3, 5);
            check_column_independence(rng, gated, false);
            check_column_independence(rng, gated, true);
            check_case(rng, 256, 20000, 1, gated, 0, 0, 0);  // CTAs looping over tiles (above)
            check_column_independence(rng, gated, false, 1280, 12000);
            check_case(rng, 5120, 96, 1, gated, 0, 0, 0, 0, true);
            check_case(rng, 4352, 1024, 64, gated, 0, 8, 0, 0, true);
        }
        check_case(rng, 5120, 336, 1, false, 0, 0, 0, 3);  // a fused residual add in place (ffn_down's)
        check_case(rng, 17408, 5120, 1, false, 0, 0, 0, 3);  // the 27B's ffn_down shape
        check_case(rng, 5120, 1024, 16, false, 0, 0, 0, 0);  // attn_v's
        q8::matmul_args a;
        alignas(16) static uint8_t buf[16];
        a.type = q8::weight_type::q6_k;
        a.w = buf;
        a.K = 256;
        a.M = 16;
        a.N = 1;
        a.row_bytes = 210;
        a.x_stride = 256;
        a.y_stride = 16;
        a.tiled = true;
        const bool ok_tiled = q8::check_args(a) == nullptr;
        a.tiled = false;
        const bool untiled_refused = q8::check_args(a) != nullptr;
        a.tiled = true;
        a.M = 20;
        a.y_stride = 20;
        const bool partial_refused = q8::check_args(a) != nullptr;
        const bool ok = ok_tiled && untiled_refused && partial_refused;
        std::printf("%s check_args takes row-tiled Q6_K of whole tiles, refuses it untiled or with a partial tile\n",
                    ok ? "ok  " : "FAIL");
        if (!ok) ++failures;
    }
    std::printf(failures ? "%d FAILED\n" : "all passed\n", failures);
    return failures ? 1 : 0;
}
