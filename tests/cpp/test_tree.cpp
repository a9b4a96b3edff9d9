// DDTree draft trees: best-first construction against brute force, chain seeding, masks, greedy
// path acceptance, and one CTest per malformed geometry (tests/cpp/CMakeLists.txt).
#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "check.h"
#include "lucebox/errors.h"
#include "spec/tree.h"

using namespace lucebox::spec;
using lucebox::config_error;

namespace {

draft_topk random_topk(uint32_t depth, uint32_t k, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    draft_topk t;
    t.depth = depth;
    t.k = k;
    for (uint32_t d = 0; d < depth; ++d) {
        std::vector<float> row(k);
        float sum = 0.0f;
        for (float & x : row) sum += (x = u(rng) + 1e-3f);
        for (float & x : row) x = std::log(x / (sum * 1.25f));  // k of the mass; 20 % elsewhere
        std::sort(row.begin(), row.end(), std::greater<float>());
        for (uint32_t r = 0; r < k; ++r) {
            t.tokens.push_back(int32_t(1000 * (d + 1) + r));  // unique per depth and rank
            t.logp.push_back(row[r]);
        }
    }
    return t;
}

// Every prefix (rank sequence) with its score, by brute force.
void all_prefixes(const draft_topk & t, std::vector<int32_t> & ranks, float score,
                  std::vector<std::pair<float, std::vector<int32_t>>> & out) {
    if (!ranks.empty()) out.push_back({score, ranks});
    if (ranks.size() == t.depth) return;
    const uint32_t d = uint32_t(ranks.size()) + 1;
    for (uint32_t r = 0; r < t.k; ++r) {
        ranks.push_back(int32_t(r));
        all_prefixes(t, ranks, score + t.logp[size_t(d - 1) * t.k + r], out);
        ranks.pop_back();
    }
}

std::vector<int32_t> tokens_of(const draft_tree & t, int32_t node) {
    std::vector<int32_t> out;
    for (int32_t j : t.path_to(node)) {
        if (j != 0) out.push_back(t.tokens[size_t(j)]);
    }
    return out;
}

draft_tree small_tree() {  // root 7; 1:a(d1) 2:b(d1) 3:c(d2 under 1) 4:d(d2 under 2)
    draft_tree t;
    t.tokens = {7, 10, 11, 12, 13};
    t.parents = {-1, 0, 0, 1, 2};
    t.depths = {0, 1, 1, 2, 2};
    t.scores = {0, -0.1f, -0.2f, -0.3f, -0.4f};
    return t;
}

}  // namespace

TEST_CASE(best_first_equals_brute_force) {
    for (uint32_t seed = 0; seed < 20; ++seed) {
        const draft_topk tk = random_topk(4, 3, seed);
        std::vector<std::pair<float, std::vector<int32_t>>> all;
        std::vector<int32_t> ranks;
        all_prefixes(tk, ranks, 0.0f, all);
        std::sort(all.begin(), all.end(), [](const auto & a, const auto & b) { return a.first > b.first; });
        for (uint32_t budget : {1u, 5u, 22u, 60u, 200u}) {
            const draft_tree t = build_tree(5, tk, {budget, false});
            const size_t want = std::min<size_t>(budget, all.size());
            CHECK(t.size() == want + 1);
            validate_tree(t, 1000, tk.depth, 100000);
            // the kept scores are the `want` best (compare as multisets of scores)
            std::vector<float> got(t.scores.begin() + 1, t.scores.end()), best;
            for (size_t i = 0; i < want; ++i) best.push_back(all[i].first);
            std::sort(got.begin(), got.end(), std::greater<float>());
            for (size_t i = 0; i < want; ++i) CHECK(std::fabs(got[i] - best[i]) < 1e-5f);
            // pop order is best first, and every node's score is its path's sum
            for (size_t i = 2; i < t.size(); ++i) CHECK(t.scores[i] <= t.scores[i - 1] + 1e-6f);
            for (size_t i = 1; i < t.size(); ++i) {
                float s = 0.0f;
                const auto path = t.path_to(int32_t(i));
                for (size_t j = 1; j < path.size(); ++j) {
                    const int32_t tok = t.tokens[size_t(path[j])];
                    const uint32_t d = uint32_t(j);
                    const int32_t r = tok - int32_t(1000 * d);
                    CHECK(r >= 0 && r < int32_t(tk.k));
                    s += tk.logp[size_t(d - 1) * tk.k + size_t(r)];
                }
                CHECK(std::fabs(s - t.scores[i]) < 1e-5f);
            }
            // no two siblings share a token
            std::map<std::pair<int32_t, int32_t>, int> seen;
            for (size_t i = 1; i < t.size(); ++i) CHECK((++seen[std::make_pair(t.parents[i], t.tokens[i])] == 1));
        }
    }
}

TEST_CASE(seeded_chain_comes_first) {
    const draft_topk tk = random_topk(15, 4, 3);
    const draft_tree t = build_tree(5, tk, {22, true});
    CHECK(t.size() == 23);
    validate_tree(t, 64, 15, 100000);
    for (uint32_t d = 1; d <= 15; ++d) {
        CHECK(t.parents[d] == int32_t(d - 1));
        CHECK(t.tokens[d] == tk.tokens[size_t(d - 1) * tk.k]);
    }
    const draft_tree short_budget = build_tree(5, tk, {4, true});
    CHECK(short_budget.size() == 5);
    for (uint32_t d = 1; d <= 4; ++d) CHECK(short_budget.depths[d] == int32_t(d));
}

TEST_CASE(large_budget_is_cheap_and_valid) {
    const draft_topk tk = random_topk(15, 8, 11);
    const draft_tree t = build_tree(1, tk, {4096, false});
    CHECK(t.size() == 4097);
    validate_tree(t, 5000, 15, 100000);
}

TEST_CASE(mask_and_paths) {
    const draft_tree t = small_tree();
    const auto m = t.ancestor_mask();
    const size_t n = t.size();
    CHECK(m[3 * n + 0] && m[3 * n + 1] && m[3 * n + 3] && !m[3 * n + 2] && !m[3 * n + 4]);
    CHECK(m[4 * n + 0] && m[4 * n + 2] && m[4 * n + 4] && !m[4 * n + 1]);
    CHECK(m[0] == 1 && m[1] == 0);
    CHECK((t.path_to(4) == std::vector<int32_t>{0, 2, 4}));
    CHECK((tokens_of(t, 3) == std::vector<int32_t>{10, 12}));
}

TEST_CASE(greedy_acceptance_leaves_the_spine) {
    const draft_tree t = small_tree();
    // target after root picks 11 (node 2, not the top-1 node 1), after node 2 picks 13 (node 4),
    // after node 4 picks 99 (bonus)
    std::vector<int32_t> target = {11, 0, 13, 0, 99};
    CHECK((accept_tree_greedy(t, target) == std::vector<int32_t>{0, 2, 4}));
    target = {10, 12, 0, 0, 0};
    CHECK((accept_tree_greedy(t, target) == std::vector<int32_t>{0, 1, 3}));
    target = {55, 0, 0, 0, 0};
    CHECK((accept_tree_greedy(t, target) == std::vector<int32_t>{0}));
}

// Sampled acceptance on a tree: the first emitted token follows the root row's distribution, and
// given it, the next follows that child's row (and so on), as plain sampling would; greedy
// parameters give accept_tree_greedy's path.
TEST_CASE(sampled_acceptance_is_distribution_exact) {
    const int32_t V = 40;
    draft_tree t;
    t.tokens = {5, 10, 11, 12, 20, 21, 30};
    t.parents = {-1, 0, 0, 0, 1, 1, 4};
    t.depths = {0, 1, 1, 1, 2, 2, 3};
    t.scores.assign(t.tokens.size(), 0.0f);
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(0.0f, 2.0f);
    std::vector<std::vector<float>> rows(t.tokens.size(), std::vector<float>(size_t(V)));
    for (auto & r : rows) {
        for (float & v : r) v = u(rng);
    }
    rows[0][10] = 4.0f;  // the root's first child likely, its second and third less so
    rows[0][11] = 2.2f;
    rows[1][20] = 4.0f;
    rows[4][30] = 3.0f;
    auto row = [&](size_t i) {
        lucebox::logit_row r;
        r.full = [&rows, i] { return rows[i].data(); };
        return r;
    };
    lucebox::sampling_params p;
    p.temperature = 1.0f;
    p.seed = 11;
    lucebox::sampler smp(p);
    auto dist = [&](size_t node) {
        std::vector<double> d(static_cast<size_t>(V), 0.0);
        for (const auto & [id, pr] : smp.distribution(rows[node].data(), V, {})) d[size_t(id)] = pr;
        return d;
    };
    const std::vector<double> p0 = dist(0), p1 = dist(1), p4 = dist(4);
    const int n = 200000;
    std::vector<double> first(static_cast<size_t>(V), 0.0), second(first), third(first);
    int n1 = 0, n4 = 0;
    for (int i = 0; i < n; ++i) {
        const tree_acceptance a = accept_tree_sampled(t, row, V, smp, {1, 2});
        std::vector<int32_t> emitted;
        for (size_t j = 1; j < a.path.size(); ++j) emitted.push_back(t.tokens[size_t(a.path[j])]);
        emitted.push_back(a.bonus);
        for (size_t j = 1; j < a.path.size(); ++j) CHECK(t.parents[size_t(a.path[j])] == a.path[j - 1]);
        first[size_t(emitted[0])] += 1;
        if (emitted[0] == 10) {
            ++n1;
            second[size_t(emitted[1])] += 1;
            if (emitted[1] == 20) {
                ++n4;
                third[size_t(emitted[2])] += 1;
            }
        }
    }
    double w0 = 0, w1 = 0, w4 = 0;
    for (int32_t id = 0; id < V; ++id) {
        w0 = std::max(w0, std::fabs(first[size_t(id)] / n - p0[size_t(id)]));
        w1 = std::max(w1, std::fabs(second[size_t(id)] / n1 - p1[size_t(id)]));
        w4 = std::max(w4, std::fabs(third[size_t(id)] / n4 - p4[size_t(id)]));
    }
    std::printf("  max |freq - p|: root %.4f, child %.4f (%d), grandchild %.4f (%d)\n", w0, w1, n1, w4, n4);
    CHECK(n1 > n / 10 && n4 > n / 50);
    CHECK(w0 < 0.006);
    CHECK(w1 < 0.01);
    CHECK(w4 < 0.02);

    lucebox::sampling_params g;
    lucebox::sampler greedy(g);
    std::vector<int32_t> target;
    for (const auto & r : rows) target.push_back(int32_t(std::max_element(r.begin(), r.end()) - r.begin()));
    const tree_acceptance a = accept_tree_sampled(t, row, V, greedy, {});
    CHECK(a.path == accept_tree_greedy(t, target));
    CHECK(a.bonus == target[size_t(a.path.back())]);
}

TEST_CASE(bad_topk_input) {
    draft_topk tk = random_topk(3, 2, 0);
    tk.logp[1] = 0.5f;
    CHECK_THROWS(build_tree(1, tk, {4, false}), config_error, "not a finite value <= 0");
    tk = random_topk(3, 2, 0);
    std::swap(tk.logp[0], tk.logp[1]);
    CHECK_THROWS(build_tree(1, tk, {4, false}), config_error, "not sorted");
    tk = random_topk(3, 2, 0);
    tk.tokens[1] = tk.tokens[0];
    CHECK_THROWS(build_tree(1, tk, {4, false}), config_error, "repeats");
    tk = random_topk(3, 2, 0);
    tk.tokens.pop_back();
    CHECK_THROWS(build_tree(1, tk, {4, false}), config_error, "expected 6");
    CHECK_THROWS(build_tree(1, random_topk(3, 2, 0), {0, false}), config_error, "budget");
}

// One case per malformed geometry; each is also registered as its own CTest.
TEST_CASE(malformed_empty) {
    CHECK_THROWS(validate_tree(draft_tree{}, 64, 15, 100), config_error, "no root");
}
TEST_CASE(malformed_root_not_first) {
    draft_tree t = small_tree();
    t.parents[0] = 1;
    CHECK_THROWS(validate_tree(t, 64, 15, 100), config_error, "root must come first");
}
TEST_CASE(malformed_root_depth) {
    draft_tree t = small_tree();
    t.depths[0] = 1;
    CHECK_THROWS(validate_tree(t, 64, 15, 100), config_error, "root must come first");
}
TEST_CASE(malformed_self_parent) {
    draft_tree t = small_tree();
    t.parents[3] = 3;
    CHECK_THROWS(validate_tree(t, 64, 15, 100), config_error, "node itself");
}
TEST_CASE(malformed_forward_parent) {
    draft_tree t = small_tree();
    t.parents[1] = 3;  // also a cycle: 1 -> 3 -> 1
    CHECK_THROWS(validate_tree(t, 64, 15, 100), config_error, "comes after the node");
}
TEST_CASE(malformed_negative_parent) {
    draft_tree t = small_tree();
    t.parents[2] = -1;  // a second root
    CHECK_THROWS(validate_tree(t, 64, 15, 100), config_error, "is not a node");
}
TEST_CASE(malformed_depth) {
    draft_tree t = small_tree();
    t.depths[3] = 3;
    CHECK_THROWS(validate_tree(t, 64, 15, 100), config_error, "!= parent depth");
}
TEST_CASE(malformed_too_deep) {
    draft_tree t = small_tree();
    CHECK_THROWS(validate_tree(t, 64, 1, 100), config_error, "exceeds the block");
}
TEST_CASE(malformed_token) {
    draft_tree t = small_tree();
    t.tokens[4] = 100;
    CHECK_THROWS(validate_tree(t, 64, 15, 100), config_error, "outside the vocabulary");
    t.tokens[4] = -2;
    CHECK_THROWS(validate_tree(t, 64, 15, 100), config_error, "outside the vocabulary");
}
TEST_CASE(malformed_sizes) {
    draft_tree t = small_tree();
    t.depths.pop_back();
    CHECK_THROWS(validate_tree(t, 64, 15, 100), config_error, "depths");
}
TEST_CASE(malformed_too_many_nodes) {
    CHECK_THROWS(validate_tree(small_tree(), 4, 15, 100), config_error, "exceed the limit");
}

TEST_MAIN()
