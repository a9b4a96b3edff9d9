// The tensor-core attention kernel's layout (cpp/kernels/attention_mma_layout.h) on the CPU: the
// m16n8k16 fragment mappings against the PTX ISA's documented ones (written out here on their
// own) and bijections, the (token, head) <-> row mapping, and one warp's pass over a few key tiles
// emulated with the same mappings (ldmatrix and mma.sync emulated by the ISA's definitions: the
// kernel's ldmatrix addresses, its P packing, its softmax and its output columns) against a plain
// softmax(scale q.K + mask) V, tail keys and a row that sees no key included.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "attention_mma_layout.h"
#include "check.h"
#include "ggml.h"

namespace ml = lucebox::kernels::attention::mma_layout;

namespace {

// The PTX ISA's m16n8k16 .f16 fragments ("Matrix Fragments for mma.m16n8k16"), groupID = lane >> 2,
// threadID_in_group = lane % 4.
ml::rc isa_a(int lane, int i) {  // a0..a7
    const int gid = lane >> 2, tig = lane % 4;
    const int row = (i < 2 || (i >= 4 && i < 6)) ? gid : gid + 8;
    const int col = i < 4 ? tig * 2 + (i & 1) : tig * 2 + (i & 1) + 8;
    return {row, col};
}
ml::rc isa_b(int lane, int i) {  // b0..b3 as (row k, col n)
    const int gid = lane >> 2, tig = lane % 4;
    return {i < 2 ? tig * 2 + (i & 1) : tig * 2 + (i & 1) + 8, gid};
}
ml::rc isa_c(int lane, int i) {  // c0..c3
    const int gid = lane >> 2, tig = lane % 4;
    return {i < 2 ? gid : gid + 8, tig * 2 + (i & 1)};
}

float f16(float x) { return ggml_fp16_to_fp32(ggml_fp32_to_fp16(x)); }

// A warp's registers as values: a register of two halves is float[2].
using a_frag = float[4][2];  // A: 4 registers
using b_frag = float[2][2];  // B: 2 registers
using c_frag = float[4];     // C: 4 floats

// ldmatrix.x4 over a row-major tile of `stride` halves a row: lane 8 m + r gives the (row, col) of
// row r of matrix m; lane l receives in register m (l / 4, 2 (l % 4) + e) of matrix m, or with trans
// (2 (l % 4) + e, l / 4).
void ldmatrix_x4(const std::vector<float> & tile, int stride, const ml::rc (&src)[32], bool trans, float (&out)[32][4][2]) {
    for (int l = 0; l < 32; ++l)
        for (int m = 0; m < 4; ++m)
            for (int e = 0; e < 2; ++e) {
                const int r = trans ? 2 * (l % 4) + e : l / 4, c = trans ? l / 4 : 2 * (l % 4) + e;
                const ml::rc s = src[8 * m + r];
                out[l][m][e] = tile[size_t(s.row) * stride + s.col + c];
            }
}

// d += a b over a warp, each fragment read and written through the ISA's layouts.
void mma(c_frag (&d)[32], const a_frag (&a)[32], const b_frag (&b)[32]) {
    double A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
        for (int i = 0; i < 8; ++i) A[isa_a(l, i).row][isa_a(l, i).col] = a[l][i / 2][i % 2];
        for (int i = 0; i < 4; ++i) B[isa_b(l, i).row][isa_b(l, i).col] = b[l][i / 2][i % 2];
    }
    for (int l = 0; l < 32; ++l)
        for (int i = 0; i < 4; ++i) {
            const ml::rc c = isa_c(l, i);
            double s = 0.0;
            for (int k = 0; k < 16; ++k) s += A[c.row][k] * B[k][c.col];
            d[l][i] = float(d[l][i] + s);
        }
}

// The max (or sum) of v over the 4 lanes of each lane's group, as __shfl_xor 1, 2 computes it.
void quad_max(float (&v)[32]) {
    float o[32];
    for (int l = 0; l < 32; ++l) o[l] = std::fmax(v[l], v[l ^ 1]);
    for (int l = 0; l < 32; ++l) v[l] = std::fmax(o[l], o[l ^ 2]);
}
void quad_sum(float (&v)[32]) {
    float o[32];
    for (int l = 0; l < 32; ++l) o[l] = v[l] + v[l ^ 1];
    for (int l = 0; l < 32; ++l) v[l] = o[l] + o[l ^ 2];
}

// One warp's 16 rows over n_keys keys (tiles of 16, keys >= n_keys as the kernel's zero-filled
// rows with -inf scores) the way attend_mma_kernel computes them; returns [16][hd] outputs
// (sums / sum, 0 for a row that sees no key) and each row's max.
void emulate_warp(int hd, int n_keys, float scale, const std::vector<float> & q, const std::vector<float> & k,
                  const std::vector<float> & v, const std::vector<float> & mask, std::vector<float> & out,
                  std::vector<float> & row_max) {
    const float NEG_INF = -std::numeric_limits<float>::infinity();
    const int KS = hd / 16, NT = hd / 8, tiles = (n_keys + 15) / 16;
    // q's A fragments (f16)
    std::vector<a_frag> qa(size_t(KS) * 32);
    for (int ks = 0; ks < KS; ++ks)
        for (int l = 0; l < 32; ++l)
            for (int reg = 0; reg < 4; ++reg) {
                const ml::rc e = ml::a_elem(l, 2 * reg);
                for (int b = 0; b < 2; ++b) qa[size_t(ks) * 32 + l][reg][b] = f16(q[size_t(e.row) * hd + 16 * ks + e.col + b]);
            }
    std::vector<c_frag> o(size_t(NT) * 32);
    for (auto & f : o)
        for (float & x : f) x = 0.0f;
    float m_run[32][2], l_run[32][2];
    for (int l = 0; l < 32; ++l) m_run[l][0] = m_run[l][1] = NEG_INF, l_run[l][0] = l_run[l][1] = 0.0f;
    ml::rc ksrc[32], vsrc[32];
    for (int tile = 0; tile < tiles; ++tile) {
        // the staged tile: keys past n_keys zero
        std::vector<float> kt(size_t(16) * hd, 0.0f), vt(size_t(16) * hd, 0.0f);
        for (int r = 0; r < 16; ++r)
            if (tile * 16 + r < n_keys)
                for (int d = 0; d < hd; ++d) {
                    kt[size_t(r) * hd + d] = k[size_t(tile * 16 + r) * hd + d];
                    vt[size_t(r) * hd + d] = v[size_t(tile * 16 + r) * hd + d];
                }
        c_frag s[2][32] = {};
        for (int ks = 0; ks < KS; ++ks) {
            for (int l = 0; l < 32; ++l) ksrc[l] = {ml::k_ldsm_src(l).row, ml::k_ldsm_src(l).col + 16 * ks};
            float b[32][4][2];
            ldmatrix_x4(kt, hd, ksrc, false, b);
            a_frag a[32];
            b_frag b0[32], b1[32];
            for (int l = 0; l < 32; ++l) {
                std::copy(&qa[size_t(ks) * 32 + l][0][0], &qa[size_t(ks) * 32 + l][0][0] + 8, &a[l][0][0]);
                for (int e = 0; e < 2; ++e) b0[l][0][e] = b[l][0][e], b0[l][1][e] = b[l][1][e], b1[l][0][e] = b[l][2][e],
                                             b1[l][1][e] = b[l][3][e];
            }
            mma(s[0], a, b0);
            mma(s[1], a, b1);
        }
        // scores, mask (element e of s[n]: row group + 8 c_half(e), key 8 n + c_elem col)
        for (int n = 0; n < 2; ++n)
            for (int l = 0; l < 32; ++l)
                for (int e = 0; e < 4; ++e) {
                    const ml::rc c = ml::c_elem(l, e);
                    const int j = tile * 16 + 8 * n + c.col;
                    const float mk = j < n_keys ? mask[size_t(c.row) * n_keys + j] : NEG_INF;
                    s[n][l][e] = std::fma(scale, s[n][l][e], mk);
                }
        float factor[32][2];
        for (int x = 0; x < 2; ++x) {
            float mx[32];
            for (int l = 0; l < 32; ++l)
                mx[l] = std::fmax(std::fmax(s[0][l][2 * x], s[0][l][2 * x + 1]), std::fmax(s[1][l][2 * x], s[1][l][2 * x + 1]));
            quad_max(mx);
            for (int l = 0; l < 32; ++l) {
                const float m_new = std::fmax(m_run[l][x], mx[l]);
                factor[l][x] = m_new == NEG_INF ? 1.0f : std::exp(m_run[l][x] - m_new);
                m_run[l][x] = m_new;
                for (int n = 0; n < 2; ++n)
                    for (int b = 0; b < 2; ++b)
                        s[n][l][2 * x + b] = m_new == NEG_INF ? 0.0f : std::exp(s[n][l][2 * x + b] - m_new);
            }
        }
        a_frag pa[32];
        for (int l = 0; l < 32; ++l)
            for (int reg = 0; reg < 4; ++reg) {
                const ml::p_src ps = ml::p_source(reg);
                const float h0 = f16(s[ps.tile][l][2 * ps.pair]), h1 = f16(s[ps.tile][l][2 * ps.pair + 1]);
                pa[l][reg][0] = h0, pa[l][reg][1] = h1;
                l_run[l][ps.pair] = reg < 2 ? l_run[l][ps.pair] * factor[l][ps.pair] + (h0 + h1) : l_run[l][ps.pair] + (h0 + h1);
            }
        for (int n = 0; n < NT; ++n)
            for (int l = 0; l < 32; ++l)
                for (int e = 0; e < 4; ++e) o[size_t(n) * 32 + l][e] *= factor[l][ml::c_half(e)];
        for (int n2 = 0; n2 < NT / 2; ++n2) {
            for (int l = 0; l < 32; ++l) vsrc[l] = {ml::v_ldsm_src(l).row, ml::v_ldsm_src(l).col + 16 * n2};
            float b[32][4][2];
            ldmatrix_x4(vt, hd, vsrc, true, b);
            b_frag b0[32], b1[32];
            c_frag d0[32], d1[32];
            for (int l = 0; l < 32; ++l) {
                for (int e = 0; e < 2; ++e) b0[l][0][e] = b[l][0][e], b0[l][1][e] = b[l][1][e], b1[l][0][e] = b[l][2][e],
                                             b1[l][1][e] = b[l][3][e];
                std::copy(o[size_t(2 * n2) * 32 + l], o[size_t(2 * n2) * 32 + l] + 4, d0[l]);
                std::copy(o[size_t(2 * n2 + 1) * 32 + l], o[size_t(2 * n2 + 1) * 32 + l] + 4, d1[l]);
            }
            mma(d0, pa, b0);
            mma(d1, pa, b1);
            for (int l = 0; l < 32; ++l) {
                std::copy(d0[l], d0[l] + 4, o[size_t(2 * n2) * 32 + l]);
                std::copy(d1[l], d1[l] + 4, o[size_t(2 * n2 + 1) * 32 + l]);
            }
        }
    }
    out.assign(size_t(16) * hd, NAN);
    row_max.assign(16, NAN);
    for (int x = 0; x < 2; ++x) {
        float lsum[32];
        for (int l = 0; l < 32; ++l) lsum[l] = l_run[l][x];
        quad_sum(lsum);
        for (int l = 0; l < 32; ++l) {
            const int row = ml::group_of(l) + 8 * x;
            row_max[row] = m_run[l][x];
            for (int n = 0; n < NT; ++n)
                for (int b = 0; b < 2; ++b) {
                    const int d = 8 * n + ml::c_elem(l, 2 * x + b).col;
                    out[size_t(row) * hd + d] = lsum[l] > 0.0f ? o[size_t(n) * 32 + l][2 * x + b] / lsum[l] : 0.0f;
                }
        }
    }
}

}  // namespace

TEST_CASE(fragments_match_the_ptx_isa) {
    int a_seen[16][16] = {}, b_seen[16][8] = {}, c_seen[16][8] = {};
    bool same = true;
    for (int l = 0; l < 32; ++l) {
        for (int i = 0; i < 8; ++i) {
            const ml::rc e = ml::a_elem(l, i), r = isa_a(l, i);
            same = same && e.row == r.row && e.col == r.col && e.row == ml::group_of(l) + 8 * ml::a_half(i);
            ++a_seen[e.row][e.col];
        }
        for (int i = 0; i < 4; ++i) {
            const ml::rc e = ml::b_elem(l, i), r = isa_b(l, i);
            same = same && e.row == r.row && e.col == r.col;
            ++b_seen[e.row][e.col];
            const ml::rc c = ml::c_elem(l, i), rc = isa_c(l, i);
            same = same && c.row == rc.row && c.col == rc.col && c.row == ml::group_of(l) + 8 * ml::c_half(i);
            ++c_seen[c.row][c.col];
        }
    }
    CHECK(same);
    bool once = true;
    for (int r = 0; r < 16; ++r) {
        for (int c = 0; c < 16; ++c) once = once && a_seen[r][c] == 1;
        for (int c = 0; c < 8; ++c) once = once && b_seen[r][c] == 1 && c_seen[r][c] == 1;
    }
    CHECK(once);  // every element of each fragment held by exactly one (lane, element)
    // P's A fragment from the scores' C fragments: the same (row, key) element
    bool p_ok = true;
    for (int l = 0; l < 32; ++l)
        for (int reg = 0; reg < 4; ++reg)
            for (int b = 0; b < 2; ++b) {
                const ml::p_src ps = ml::p_source(reg);
                const ml::rc a = ml::a_elem(l, 2 * reg + b), c = ml::c_elem(l, 2 * ps.pair + b);
                p_ok = p_ok && a.row == c.row && a.col == 8 * ps.tile + c.col;
            }
    CHECK(p_ok);
    // ldmatrix sources: each (row, 8-column block) of a 16 x 16 tile given by one lane
    int k_seen[16][2] = {}, v_seen[16][2] = {};
    for (int l = 0; l < 32; ++l) {
        ++k_seen[ml::k_ldsm_src(l).row][ml::k_ldsm_src(l).col / 8];
        ++v_seen[ml::v_ldsm_src(l).row][ml::v_ldsm_src(l).col / 8];
    }
    bool src_once = true;
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 2; ++c) src_once = src_once && k_seen[r][c] == 1 && v_seen[r][c] == 1;
    CHECK(src_once);
}

TEST_CASE(rows_are_token_head_pairs) {
    for (int G : {1, 2, 6, 8})
        for (int T : {1, 2, 3, 16, 17, 64}) {
            std::vector<int> seen(size_t(T) * G, 0);
            for (int t = 0; t < T; ++t)
                for (int g = 0; g < G; ++g) {
                    const int r = ml::row_of(t, g, G);
                    CHECK(r >= 0 && r < T * G);
                    if (r < 0 || r >= T * G) continue;
                    ++seen[size_t(r)];
                    CHECK(ml::token_of_row(r, G) == t && ml::head_of_row(r, G) == g);
                }
            CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
            CHECK(ml::row_blocks(T, G) * ml::ROWS >= T * G && (ml::row_blocks(T, G) - 1) * ml::ROWS < T * G);
        }
}

TEST_CASE(one_warp_tile_pass_matches_attention) {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::bernoulli_distribution seen(0.7);
    for (int hd : {128, 256})
        for (int n_keys : {16, 37, 48}) {
            const float scale = 1.0f / std::sqrt(float(hd));
            std::vector<float> q(size_t(16) * hd), k(size_t(n_keys) * hd), v(size_t(n_keys) * hd), mask(size_t(16) * n_keys);
            for (float & x : q) x = nd(rng);
            for (float & x : k) x = f16(nd(rng));
            for (float & x : v) x = f16(nd(rng));
            for (int r = 0; r < 16; ++r)
                for (int j = 0; j < n_keys; ++j)
                    mask[size_t(r) * n_keys + j] = r == 5 ? -INFINITY : (j == 0 || seen(rng) ? 0.0f : -INFINITY);
            std::vector<float> out, row_max;
            emulate_warp(hd, n_keys, scale, q, k, v, mask, out, row_max);
            double diff = 0.0, max_diff = 0.0;
            bool nan = false;
            for (int r = 0; r < 16; ++r) {
                std::vector<double> sc(static_cast<size_t>(n_keys));
                double m = -INFINITY;
                for (int j = 0; j < n_keys; ++j) {
                    double dot = 0.0;
                    for (int d = 0; d < hd; ++d) dot += double(q[size_t(r) * hd + d]) * k[size_t(j) * hd + d];
                    sc[size_t(j)] = scale * dot + mask[size_t(r) * n_keys + j];
                    m = std::max(m, sc[size_t(j)]);
                }
                max_diff = std::max(max_diff, std::fabs(m == -INFINITY ? (row_max[size_t(r)] == -INFINITY ? 0.0 : 1.0)
                                                                        : row_max[size_t(r)] - m));
                double l = 0.0;
                std::vector<double> acc(size_t(hd), 0.0);
                for (int j = 0; j < n_keys && m != -INFINITY; ++j) {
                    const double p = std::exp(sc[size_t(j)] - m);
                    l += p;
                    for (int d = 0; d < hd; ++d) acc[size_t(d)] += p * v[size_t(j) * hd + d];
                }
                for (int d = 0; d < hd; ++d) {
                    const float got = out[size_t(r) * hd + d];
                    nan = nan || std::isnan(got);
                    diff = std::max(diff, std::fabs(double(got) - (l > 0.0 ? acc[size_t(d)] / l : 0.0)));
                }
            }
            std::printf("  hd %d keys %d: emulated warp vs attention max abs diff %.3g (row max %.3g)\n", hd, n_keys,
                        diff, max_diff);
            CHECK(!nan);
            CHECK(diff < 1e-2);  // q and P in f16
            CHECK(max_diff < 1e-2);
        }
}

TEST_MAIN()
