// The tree variant of ggml_gated_delta_net (ggml/patches/0001-gated-delta-net-tree.patch) on the CPU
// backend: with chain parents it equals the upstream op with K = n_tokens bit for bit, and on trees
// (scalar and per-channel KDA gates, broadcast K heads) every node's output and state equal a plain
// C++ recurrence run along the node's root path. Also the conv-window gather table of a tree verify,
// and the reused tree commit graph against the per-commit byte-copy graph (bit for bit, any KV type).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "check.h"
#include "cuda_kernels.h"
#include "gpu_backend.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "lucebox/errors.h"
#include "models/qwen35_model.h"

using namespace lucebox;

namespace {

constexpr int64_t HK = 2, HV = 4;  // V head h reads K/Q head h % HK (tiled)
int64_t S = 16;                    // head size (the GPU test also runs the model's 128)

struct inputs {
    int64_t T = 0;
    bool kda = false;
    std::vector<float> q, k, v, g, beta, s0;  // ggml layouts, see ggml_gated_delta_net in ggml.h
};

inputs random_inputs(int64_t T, bool kda, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    inputs in;
    in.T = T;
    in.kda = kda;
    auto fill = [&](std::vector<float> & x, size_t n, float lo, float hi) {
        x.resize(n);
        for (float & e : x) e = lo + (hi - lo) * 0.5f * (u(rng) + 1.0f);
    };
    fill(in.q, S * HK * T, -1, 1);
    const float kr = 0.3f * std::sqrt(16.0f / float(S));  // |k|^2 beta < 1: the recurrence stays bounded
    fill(in.k, S * HK * T, -kr, kr);
    fill(in.v, S * HV * T, -1, 1);
    fill(in.g, (kda ? S : 1) * HV * T, -0.5f, 0.0f);
    fill(in.beta, HV * T, 0.1f, 0.9f);
    fill(in.s0, S * S * HV, -0.5f, 0.5f);
    return in;
}

// Runs the op on `backend` (null: the CPU backend): parents empty = upstream
// ggml_gated_delta_net(K snapshots; K 0 = T), else the tree op. Returns the whole output (scores,
// then snapshots).
std::vector<float> run_op(const inputs & in, const std::vector<int32_t> & parents, ggml_backend_t backend = nullptr,
                          int64_t K = 0) {
    const int64_t T = in.T;
    ggml_backend_t cpu = backend == nullptr ? ggml_backend_cpu_init() : nullptr;
    ggml_backend_t be = backend != nullptr ? backend : cpu;
    ggml_init_params ip{ggml_tensor_overhead() * 16 + ggml_graph_overhead(), nullptr, true};
    ggml_context * ctx = ggml_init(ip);
    std::vector<std::pair<ggml_tensor *, const void *>> uploads;
    auto tensor = [&](const std::vector<float> & data, int64_t a, int64_t b, int64_t c) {
        ggml_tensor * t = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, a, b, c, 1);
        uploads.emplace_back(t, data.data());
        return t;
    };
    ggml_tensor * q = tensor(in.q, S, HK, T);
    ggml_tensor * k = tensor(in.k, S, HK, T);
    ggml_tensor * v = tensor(in.v, S, HV, T);
    ggml_tensor * g = tensor(in.g, in.kda ? S : 1, HV, T);
    ggml_tensor * beta = tensor(in.beta, 1, HV, T);
    ggml_tensor * s0 = tensor(in.s0, S, S, HV);
    ggml_tensor * out = nullptr;
    if (parents.empty()) {
        out = ggml_gated_delta_net(ctx, q, k, v, g, beta, s0, K > 0 ? K : T);
    } else {
        ggml_tensor * p = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, T);
        uploads.emplace_back(p, parents.data());
        out = ggml_gated_delta_net_tree(ctx, q, k, v, g, beta, s0, p);
    }
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
    for (const auto & [t, data] : uploads) {
        ggml_backend_tensor_set(t, data, 0, ggml_nbytes(t));
    }
    if (cpu != nullptr) {
        ggml_backend_cpu_set_n_threads(cpu, 2);
    }
    CHECK(ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS);
    std::vector<float> res(ggml_nelements(out));
    ggml_backend_tensor_get(out, res.data(), 0, res.size() * sizeof(float));
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    if (cpu != nullptr) {
        ggml_backend_free(cpu);
    }
    return res;
}

// Plain recurrence per V head along `path` (token indices): S <- decay(g) S; delta = (v - S^T k) beta;
// S += k delta^T; o = S^T q / sqrt(S). Returns the last token's output [S, HV] and state (ggml's
// transposed layout M[h][j][i] = S_h[i][j]).
void reference(const inputs & in, const std::vector<int32_t> & path, std::vector<float> & o, std::vector<float> & st) {
    st = in.s0;
    o.assign(S * HV, 0.0f);
    const float scale = 1.0f / std::sqrt(float(S));
    for (int32_t t : path) {
        for (int64_t h = 0; h < HV; ++h) {
            float * M = st.data() + h * S * S;
            const float * q = in.q.data() + (t * HK + h % HK) * S;
            const float * k = in.k.data() + (t * HK + h % HK) * S;
            const float * v = in.v.data() + (t * HV + h) * S;
            const float b = in.beta[t * HV + h];
            for (int64_t j = 0; j < S; ++j) {
                for (int64_t i = 0; i < S; ++i) {
                    const float gi = in.kda ? in.g[(t * HV + h) * S + i] : in.g[t * HV + h];
                    M[j * S + i] *= std::exp(gi);
                }
            }
            for (int64_t j = 0; j < S; ++j) {
                float kv = 0.0f;
                for (int64_t i = 0; i < S; ++i) kv += M[j * S + i] * k[i];
                const float delta = (v[j] - kv) * b;
                for (int64_t i = 0; i < S; ++i) M[j * S + i] += k[i] * delta;
            }
            for (int64_t j = 0; j < S; ++j) {
                float acc = 0.0f;
                for (int64_t i = 0; i < S; ++i) acc += M[j * S + i] * q[i];
                o[h * S + j] = acc * scale;
            }
        }
    }
}

bool close(float a, float b) { return std::fabs(a - b) <= 1e-4f * (1.0f + std::fabs(b)); }

void check_tree(const std::vector<int32_t> & parents, bool kda, uint32_t seed) {
    const int64_t T = int64_t(parents.size());
    const inputs in = random_inputs(T, kda, seed);
    const std::vector<float> res = run_op(in, parents);
    const int64_t D = S * S * HV;
    for (int64_t node = 0; node < T; ++node) {
        std::vector<int32_t> path;
        for (int32_t j = int32_t(node); j >= 0; j = parents[size_t(j)]) path.insert(path.begin(), j);
        std::vector<float> o, st;
        reference(in, path, o, st);
        int bad = 0;
        for (int64_t e = 0; e < S * HV; ++e) bad += !close(res[node * S * HV + e], o[e]);
        const float * snap = res.data() + T * S * HV + (T - 1 - node) * D;  // slot T-1-node
        for (int64_t e = 0; e < D; ++e) bad += !close(snap[e], st[e]);
        if (bad) std::fprintf(stderr, "  node %lld (kda %d): %d mismatches\n", (long long) node, int(kda), bad);
        CHECK(bad == 0);
    }
}

}  // namespace

TEST_CASE(chain_parents_equal_the_upstream_op_bitwise) {
    for (bool kda : {false, true}) {
        for (int64_t T : {1, 2, 7}) {
            const inputs in = random_inputs(T, kda, 11 + uint32_t(T));
            std::vector<int32_t> chain(static_cast<size_t>(T));
            for (int64_t i = 0; i < T; ++i) chain[size_t(i)] = int32_t(i) - 1;
            const std::vector<float> a = run_op(in, {}), b = run_op(in, chain);
            CHECK(a.size() == b.size());
            CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
        }
    }
}

TEST_CASE(tree_matches_the_per_path_recurrence) {
    // root; two children; grandchildren under both; a node whose parent is the root again; a deep
    // branch off an earlier node (parents never the previous row except where noted)
    const std::vector<int32_t> tree{-1, 0, 0, 1, 2, 1, 0, 3, 5, 2, 7};
    for (bool kda : {false, true}) {
        check_tree(tree, kda, 3);
    }
    check_tree({-1, 0, 1, 2, 3}, false, 4);  // a chain through the tree op
    check_tree({-1, 0, 0, 0, 0}, true, 5);   // a star: every node restarts from the root
}

TEST_CASE(conv_rows_chain_and_tree) {
    // chain: row i's window is [i, i + d_conv) of [carried (3) | batch]
    const std::vector<int32_t> chain{-1, 0, 1, 2};
    const std::vector<int32_t> rows = qwen35_tree_conv_rows(chain, 4);
    for (int32_t i = 0; i < 4; ++i) {
        for (int32_t w = 0; w < 4; ++w) CHECK(rows[size_t(i * 4 + w)] == i + w);
    }
    // tree: node 3's parent is 1 (root 0): window = carried[2], node 0, node 1, node 3 -> 2, 3, 4, 6
    const std::vector<int32_t> t = qwen35_tree_conv_rows({-1, 0, 0, 1}, 4);
    const std::vector<int32_t> node3(t.begin() + 12, t.begin() + 16);
    CHECK((node3 == std::vector<int32_t>{2, 3, 4, 6}));
    const std::vector<int32_t> node2(t.begin() + 8, t.begin() + 12);  // parent root: carried 1, 2, root, self
    CHECK((node2 == std::vector<int32_t>{1, 2, 3, 5}));
}

// The GPU kernel against the CPU op (a CUDA build on a machine with a GPU; passes with a note
// elsewhere): chain parents, trees, a star, scalar and KDA gates, T up to 40, head sizes 16 and
// the model's 128, and the upstream op with K = T snapshots and with K = 1 (decode and prefill:
// only the final state).
TEST_CASE(gpu_matches_cpu) {
    ggml_backend_t be = lucebox_test::first_gpu_backend("gpu_matches_cpu");
    if (be == nullptr) {
        return;
    }
    std::vector<std::vector<int32_t>> trees{{-1, 0, 1, 2, 3, 4}, {-1, 0, 0, 1, 2, 1, 0, 3, 5, 2, 7}, {-1, 0, 0, 0}};
    std::vector<int32_t> big{-1};
    std::mt19937 rng(9);
    for (int32_t i = 1; i < 40; ++i) big.push_back(int32_t(rng() % uint32_t(i)));
    trees.push_back(big);
    for (int64_t head : {16, 128}) {
        S = head;
        for (bool kda : {false, true}) {
            auto compare = [&](const inputs & in, const std::vector<int32_t> & p, int64_t K, const char * what) {
                const std::vector<float> c = run_op(in, p, nullptr, K), gres = run_op(in, p, be, K);
                CHECK(c.size() == gres.size());
                int bad = 0;
                for (size_t e = 0; e < c.size(); ++e) bad += !close(gres[e], c[e]);
                if (bad) {
                    std::fprintf(stderr, "  S %lld T %lld kda %d %s K %lld: %d mismatches\n", (long long) S,
                                 (long long) in.T, int(kda), what, (long long) K, bad);
                }
                CHECK(bad == 0);
            };
            for (const auto & parents : trees) {
                compare(random_inputs(int64_t(parents.size()), kda, 21), parents, 0, "tree");
            }
            for (int64_t T : {1, 6, 8, 17, 40}) {  // the upstream op: chain only
                const inputs in = random_inputs(T, kda, 22 + uint32_t(T));
                compare(in, {}, 0, "chain");
                compare(in, {}, 1, "chain");
            }
        }
    }
    S = 16;
    ggml_backend_free(be);
}

// lucebox's prefill gated delta net (cpp/kernels/gdn_prefill.cuh, ggml patch 0005) against ggml's
// CUDA kernel (which gpu_matches_cpu checks against the CPU op): bit for bit (same float operations in the same order), for batches of 64 tokens and
// more (partial last chunks included), head size 128, tiled K heads; it must have run (its run
// counter), and it must leave the verify's per-token states (K = T) to ggml's kernel.
TEST_CASE(gpu_prefill_kernel_equals_ggml) {
    ggml_backend_t be = lucebox_test::first_gpu_backend("gpu_prefill_kernel_equals_ggml");
    if (be == nullptr) {
        return;
    }
    kernels::install_cuda_kernels();
    S = 128;
    for (int64_t T : {64, 77, 300, 1000}) {
        const inputs in = random_inputs(T, false, 40 + uint32_t(T));
        kernels::set_cuda_kernels_enabled(true);
        const uint64_t before = kernels::gdn_prefill_runs();
        const std::vector<float> ours = run_op(in, {}, be, 1);
        const bool ran = kernels::gdn_prefill_runs() == before + 1;
        const std::vector<float> snaps = run_op(in, {}, be, T);  // K = T: not ours
        const bool left_alone = kernels::gdn_prefill_runs() == before + 1;
        kernels::set_cuda_kernels_enabled(false);
        const std::vector<float> theirs = run_op(in, {}, be, 1);  // (checked against the CPU op above)
        kernels::set_cuda_kernels_enabled(true);
        CHECK(ran);
        CHECK(left_alone);
        CHECK(ours.size() == theirs.size());
        size_t differ = 0;
        double max_abs = 0.0;
        for (size_t e = 0; e < ours.size() && e < theirs.size(); ++e) {
            differ += std::memcmp(&ours[e], &theirs[e], sizeof(float)) != 0;
            max_abs = std::max(max_abs, std::fabs(double(ours[e]) - double(theirs[e])));
        }
        std::printf("  T %lld: %zu of %zu values differ from ggml's CUDA kernel (max abs %.3g)\n", (long long) T,
                    differ, ours.size(), max_abs);
        CHECK(differ == 0);
        (void) snaps;
    }
    S = 16;
    ggml_backend_free(be);
}

namespace {

// A state of a small hybrid model (DeltaNet, attention, DeltaNet, attention) whose every byte is
// random (NaN and other odd patterns included), on `dev`.
struct commit_state {
    qwen35_hparams hp;
    qwen35_state st;
};

qwen35_hparams commit_hparams() {
    qwen35_hparams hp;
    hp.n_embd = 64;
    hp.n_layer = 4;
    hp.n_head = 2;
    hp.n_head_kv = 1;
    hp.head_dim = 64;  // KV row: 64 values (q8_0: 68 bytes, q4_0: 36 bytes)
    hp.ssm_d_conv = 4;
    hp.ssm_d_state = 16;
    hp.ssm_n_k_heads = 2;
    hp.ssm_n_v_heads = 4;
    hp.is_recurrent = {true, false, true, false};
    return hp;
}

std::vector<ggml_tensor *> state_tensors(const qwen35_state & st) {
    std::vector<ggml_tensor *> all;
    for (const auto * v : {&st.k, &st.v, &st.conv, &st.ssm, &st.ring, &st.ssm_ckpt, &st.conv_ckpt}) {
        for (ggml_tensor * t : *v) {
            if (t != nullptr) all.push_back(t);
        }
    }
    return all;
}

std::vector<uint8_t> read_all(const qwen35_state & st) {
    std::vector<uint8_t> bytes;
    for (ggml_tensor * t : state_tensors(st)) {
        std::vector<uint8_t> b(ggml_nbytes(t));
        ggml_backend_tensor_get(t, b.data(), 0, b.size());
        bytes.insert(bytes.end(), b.begin(), b.end());
    }
    return bytes;
}

void compute(ggml_backend_t be, ggml_cgraph * gf) {
    ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(be));
    CHECK(ggml_gallocr_alloc_graph(galloc, gf));
    CHECK(ggml_backend_graph_compute(be, gf) == GGML_STATUS_SUCCESS);
    ggml_gallocr_free(galloc);
}

// Random paths through random trees, n_past moving on: after each commit the state committed by
// the reused graph (on `be`) equals the one committed by the copy graph (on the CPU) byte for byte.
// KV rows of head_dim values that are not whole 4-byte words (q8_0/q4_0 with an odd number of blocks)
// have no reused graph: then the copy graph on `be` is what is checked against the CPU's.
void check_tree_commit(ggml_type type_kv, ggml_backend_t be, int64_t head_dim = 64) {
    qwen35_hparams hp = commit_hparams();
    hp.head_dim = uint32_t(head_dim);
    const bool words = ggml_row_size(type_kv, head_dim * hp.n_head_kv) % 4 == 0;
    const uint32_t kv_size = 256, ring = 32, n_ckpt = 12;
    const std::vector<int32_t> capture{1, 4};
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_dev_t cpu_dev = ggml_backend_get_device(cpu);
    const qwen35_state a = qwen35_state::allocate(hp, kv_size, type_kv, type_kv, capture, ring, n_ckpt,
                                                  ggml_backend_get_default_buffer_type(cpu), cpu_dev);
    const qwen35_state b = qwen35_state::allocate(hp, kv_size, type_kv, type_kv, capture, ring, n_ckpt,
                                                  ggml_backend_get_default_buffer_type(be),
                                                  ggml_backend_get_device(be));
    std::mt19937 rng(uint32_t(type_kv) + 5);
    const auto ta = state_tensors(a), tb = state_tensors(b);
    for (size_t i = 0; i < ta.size(); ++i) {
        std::vector<uint8_t> bytes(ggml_nbytes(ta[i]));
        for (uint8_t & x : bytes) x = uint8_t(rng());
        ggml_backend_tensor_set(ta[i], bytes.data(), 0, bytes.size());
        ggml_backend_tensor_set(tb[i], bytes.data(), 0, bytes.size());
    }
    std::vector<uint8_t> meta(ggml_tensor_overhead() * 4096 + ggml_graph_overhead_custom(4096, false));
    ggml_init_params ip{meta.size(), meta.data(), true};
    ggml_context * cached_ctx = ggml_init(ip);
    const qwen35_tree_commit g = build_qwen35_tree_commit_graph(cached_ctx, hp, b);
    CHECK((g.gf != nullptr) == words);
    ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(be));
    CHECK(!words || (g.n_slots == n_ckpt && ggml_gallocr_alloc_graph(galloc, g.gf)));
    std::vector<uint8_t> copy_meta(meta.size());
    uint32_t n_past = 3;
    for (int step = 0; step < 40; ++step) {
        const uint32_t n_verified = 1 + rng() % n_ckpt;
        std::vector<int32_t> path{0};  // increasing nodes < n_verified
        for (uint32_t node = 1; node < n_verified; ++node) {
            if (rng() % 2) path.push_back(int32_t(node));
        }
        if (step == 0) path = {0};
        if (step == 1 && n_verified >= 3) path = {0, 1, 2};  // the spine: rows stay
        ggml_init_params cp{copy_meta.size(), copy_meta.data(), true};
        ggml_context * copy_ctx = ggml_init(cp);
        ggml_cgraph * copy = build_qwen35_tree_commit_copy_graph(copy_ctx, hp, a, n_verified, n_past, path);
        compute(cpu, copy);
        if (step == 5 && words) {
            std::printf("  %s, path of %zu of %u nodes: copy graph %d nodes, reused graph %d nodes\n",
                        ggml_type_name(type_kv), path.size(), n_verified, ggml_graph_n_nodes(copy),
                        ggml_graph_n_nodes(g.gf));
        }
        ggml_free(copy_ctx);
        if (words) {
            const std::vector<int32_t> moves = qwen35_tree_commit_moves(g, hp, b, n_verified, n_past, path);
            ggml_backend_tensor_set(g.moves, moves.data(), 0, moves.size() * sizeof(int32_t));
            CHECK(ggml_backend_graph_compute(be, g.gf) == GGML_STATUS_SUCCESS);
        } else {
            ggml_init_params bp{copy_meta.size(), copy_meta.data(), true};
            ggml_context * b_ctx = ggml_init(bp);
            compute(be, build_qwen35_tree_commit_copy_graph(b_ctx, hp, b, n_verified, n_past, path));
            ggml_free(b_ctx);
        }
        const bool same = read_all(a) == read_all(b);
        if (!same) std::fprintf(stderr, "  %s: step %d (n_past %u, %u verified, path of %zu) differs\n",
                                ggml_type_name(type_kv), step, n_past, n_verified, path.size());
        CHECK(same);
        n_past = (n_past + uint32_t(path.size()) + 7) % (kv_size - n_ckpt);  // wraps the ring too
    }
    if (words) {
        const std::vector<int32_t> unordered{0, 2, 1}, rootless{1};
        CHECK_THROWS(qwen35_tree_commit_moves(g, hp, b, 4, 0, unordered), lucebox::error, "not increasing");
        CHECK_THROWS(qwen35_tree_commit_moves(g, hp, b, 4, 0, rootless), lucebox::error, "root");
    }
    ggml_gallocr_free(galloc);
    ggml_free(cached_ctx);
    ggml_backend_free(cpu);
}

}  // namespace

// The chain commit and the backup/restore graphs of a deep model (the graph sizes must count every
// node: 48 DeltaNet layers of the 27B once overflowed a commit graph) move the right bytes: the
// kept token's state checkpoint and its conv window (columns last_kept+1.. of each channel).
TEST_CASE(commit_and_backup_graphs_of_a_deep_model) {
    qwen35_hparams hp = commit_hparams();
    hp.n_layer = 96;
    hp.is_recurrent.assign(hp.n_layer, true);
    for (uint32_t il = 3; il < hp.n_layer; il += 4) hp.is_recurrent[il] = false;
    const uint32_t n_ckpt = 6;
    ggml_backend_t cpu = ggml_backend_cpu_init();
    const qwen35_state st = qwen35_state::allocate(hp, 32, GGML_TYPE_F16, GGML_TYPE_F16, {}, 0, n_ckpt,
                                                   ggml_backend_get_default_buffer_type(cpu),
                                                   ggml_backend_get_device(cpu));
    std::mt19937 rng(11);
    for (ggml_tensor * t : state_tensors(st)) {
        std::vector<float> v(ggml_nelements(t));
        for (float & x : v) x = float(rng() % 1000) - 500.0f;
        if (t->type == GGML_TYPE_F32) ggml_backend_tensor_set(t, v.data(), 0, ggml_nbytes(t));
    }
    auto floats = [](ggml_tensor * t) {
        std::vector<float> v(ggml_nbytes(t) / sizeof(float));
        ggml_backend_tensor_get(t, v.data(), 0, v.size() * sizeof(float));
        return v;
    };
    std::vector<uint8_t> meta(ggml_tensor_overhead() * 2048 + ggml_graph_overhead_custom(2048, false));
    const uint32_t n_verified = 5, last_kept = 1, d1 = hp.ssm_d_conv - 1;
    const int64_t D = int64_t(hp.ssm_d_state) * hp.ssm_d_state * hp.ssm_n_v_heads;
    {
        ggml_init_params ip{meta.size(), meta.data(), true};
        ggml_context * ctx = ggml_init(ip);
        compute(cpu, build_qwen35_commit_graph(ctx, hp, st, n_verified, last_kept));
        ggml_free(ctx);
    }
    int wrong = 0;
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        if (!hp.is_recurrent[il]) continue;
        const std::vector<float> ssm = floats(st.ssm[il]), ck = floats(st.ssm_ckpt[il]);
        const size_t slot = n_verified - 1 - last_kept, row = st.ssm_ckpt[il]->nb[1] / sizeof(float);
        for (int64_t i = 0; i < D; ++i) wrong += ssm[i] != ck[slot * row + i];
        const std::vector<float> conv = floats(st.conv[il]), cc = floats(st.conv_ckpt[il]);
        const size_t cc_row = st.conv_ckpt[il]->nb[1] / sizeof(float);
        for (int64_t c = 0; c < int64_t(hp.conv_dim()); ++c)
            for (uint32_t w = 0; w < d1; ++w) wrong += conv[c * d1 + w] != cc[c * cc_row + last_kept + 1 + w];
    }
    CHECK(wrong == 0);
    for (bool backup : {true, false}) {  // backup into slot 0, then restore from it: the state is unchanged
        const std::vector<float> before = floats(st.conv[0]);
        ggml_init_params ip{meta.size(), meta.data(), true};
        ggml_context * ctx = ggml_init(ip);
        compute(cpu, build_qwen35_backup_graph(ctx, hp, st, backup));
        ggml_free(ctx);
        CHECK(floats(st.conv[0]) == before);
    }
    const std::vector<float> cc0 = floats(st.conv_ckpt[0]), conv0 = floats(st.conv[0]);
    int slot_wrong = 0;  // after the backup, slot 0 of the conv checkpoint holds the conv state
    for (int64_t c = 0; c < int64_t(hp.conv_dim()); ++c)
        for (uint32_t w = 0; w < d1; ++w) slot_wrong += conv0[c * d1 + w] != cc0[c * (st.conv_ckpt[0]->nb[1] / 4) + w];
    CHECK(slot_wrong == 0);
    ggml_backend_free(cpu);
}

TEST_CASE(tree_commit_reused_graph_equals_copies_bitwise) {
    ggml_backend_t cpu = ggml_backend_cpu_init();
    for (ggml_type t : {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,
                        GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1}) {
        check_tree_commit(t, cpu);
    }
    check_tree_commit(GGML_TYPE_Q8_0, cpu, 32);  // no reused graph: the copy graph on both sides
    ggml_backend_free(cpu);
}

// The same with the reused graph on a GPU (a CUDA build on a machine with a GPU; a note elsewhere).
TEST_CASE(tree_commit_gpu_equals_cpu_copies) {
    ggml_backend_t be = lucebox_test::first_gpu_backend("tree_commit_gpu_equals_cpu_copies");
    if (be == nullptr) {
        return;
    }
    for (ggml_type t : {GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0}) {
        check_tree_commit(t, be);
    }
    // rows of one q8_0/q4_0 block (34/18 bytes): the copy graph runs on the GPU; its conv columns go
    // to a strided destination, which CUDA's transpose copy kernel once wrote as if contiguous (found
    // reading this fallback for fuzz_cuda's cases 46, 52, 156, 207; see graph::copy_by_kernel)
    for (ggml_type t : {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0}) {
        check_tree_commit(t, be, 32);
    }
    ggml_backend_free(be);
}

int main(int argc, char ** argv) { return lucebox_test::run_all(argc > 1 ? argv[1] : nullptr); }
