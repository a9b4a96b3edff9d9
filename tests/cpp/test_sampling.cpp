// Token sampler: greedy, penalties, top-k / top-p / min-p, distribution(), RNG determinism, statistics.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <numeric>
#include <vector>

#include "check.h"
#include "lucebox/errors.h"
#include "lucebox/sampling.h"

using namespace lucebox;

namespace {

const float NEG_INF = -std::numeric_limits<float>::infinity();

int32_t greedy_of(const std::vector<float> & logits, const std::vector<int32_t> & history, sampling_params p) {
    p.temperature = 0.0f;
    sampler s(p);
    return s.sample(logits.data(), static_cast<int32_t>(logits.size()), history);
}

std::vector<std::pair<int32_t, float>> dist_of(const std::vector<float> & logits, const sampling_params & p,
                                               const std::vector<int32_t> & history = {}) {
    sampler s(p);
    return s.distribution(logits.data(), static_cast<int32_t>(logits.size()), history);
}

bool near(double a, double b, double tol = 1e-5) { return std::fabs(a - b) <= tol; }

// Expected distribution as (id, prob) in the order distribution() must return.
bool dist_equals(const std::vector<std::pair<int32_t, float>> & got,
                 const std::vector<std::pair<int32_t, double>> & want, double tol = 1e-5, bool quiet = false) {
    if (got.size() != want.size()) {
        if (!quiet) std::fprintf(stderr, "  distribution has %zu entries, expected %zu\n", got.size(), want.size());
        return false;
    }
    for (size_t i = 0; i < got.size(); ++i) {
        if (got[i].first != want[i].first || !near(got[i].second, want[i].second, tol)) {
            if (!quiet) std::fprintf(stderr, "  entry %zu: got (%d, %.7f), expected (%d, %.7f)\n", i, got[i].first,
                         got[i].second, want[i].first, want[i].second);
            return false;
        }
    }
    return true;
}

// Logits whose T=1 softmax is `probs` (up to a constant).
std::vector<float> logits_from_probs(const std::vector<double> & probs) {
    std::vector<float> l;
    for (double p : probs) l.push_back(p > 0 ? static_cast<float>(std::log(p)) : NEG_INF);
    return l;
}

// Test-local deterministic logits generator (independent of the sampler's RNG).
std::vector<float> random_logits(size_t n, uint64_t seed, float scale) {
    std::vector<float> l(n);
    uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (auto & v : l) {
        double s = 0;
        for (int k = 0; k < 4; ++k) {  // roughly normal
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            s += static_cast<double>(x >> 11) * 0x1.0p-53;
        }
        v = static_cast<float>((s - 2.0) * scale);
    }
    return l;
}

// Sampling settings of the statistical tests: temperature, top_k, top_p, min_p, repetition penalty.
struct variant {
    float t;
    int32_t k;
    float p;
    float m;
    float rep;
    sampling_params params() const {
        sampling_params sp;
        sp.temperature = t;
        sp.top_k = k;
        sp.top_p = p;
        sp.min_p = m;
        sp.repetition_penalty = rep;
        return sp;
    }
};

// Naive reference of the whole chain (full sort, double math, libm exp); drops probabilities that
// are 0 as floats, as distribution() does.
std::vector<std::pair<int32_t, double>> reference(const std::vector<float> & logits, const sampling_params & p) {
    std::vector<std::pair<float, int32_t>> c;
    for (size_t i = 0; i < logits.size(); ++i) {
        if (logits[i] != NEG_INF) c.emplace_back(logits[i], static_cast<int32_t>(i));
    }
    std::sort(c.begin(), c.end(), [](const auto & a, const auto & b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    if (p.top_k > 0 && static_cast<size_t>(p.top_k) < c.size()) c.resize(p.top_k);
    std::vector<double> w;
    for (const auto & e : c) w.push_back(std::exp((static_cast<double>(e.first) - c[0].first) / p.temperature));
    double z = 0;
    for (double v : w) z += v;
    size_t keep = c.size();
    if (p.top_p < 1.0f) {
        double cum = 0;
        for (size_t i = 0; i < c.size(); ++i) {
            cum += w[i] / z;
            if (cum >= p.top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    if (p.min_p > 0.0f) {
        size_t m = 0;
        while (m < keep && w[m] / w[0] >= p.min_p) ++m;
        keep = std::max<size_t>(m, 1);
    }
    double zk = 0;
    for (size_t i = 0; i < keep; ++i) zk += w[i];
    std::vector<std::pair<int32_t, double>> out;
    for (size_t i = 0; i < keep; ++i) {
        if (static_cast<float>(w[i] / zk) > 0.0f) out.emplace_back(c[i].second, w[i] / zk);  // as float
    }
    return out;
}

}  // namespace

TEST_CASE(greedy_is_argmax_lowest_id_on_ties) {
    sampling_params p;
    CHECK(p.is_greedy());
    CHECK(greedy_of({1.0f, 3.0f, 3.0f, 2.0f}, {}, p) == 1);
    CHECK(greedy_of({5.0f, 1.0f, 5.0f}, {}, p) == 0);
    CHECK(greedy_of({NEG_INF, NEG_INF, -7.5f}, {}, p) == 2);
    CHECK(greedy_of({-3.0f, -1.0f, -2.0f, -1.0f}, {}, p) == 1);
    // distribution() of a greedy sampler is the one-hot argmax.
    const auto d = dist_of({0.5f, 2.0f, 2.0f}, p);
    CHECK(d.size() == 1 && d[0].first == 1 && d[0].second == 1.0f);
    // The greedy path draws nothing from the RNG.
    sampler a(p), b(p);
    const std::vector<float> l = {0.0f, 1.0f};
    for (int i = 0; i < 10; ++i) a.sample(l.data(), 2, {});
    CHECK(a.uniform() == b.uniform());
}

TEST_CASE(presence_penalty_changes_argmax) {
    sampling_params p;
    p.presence_penalty = 0.6f;  // 2.0 - 0.6 = 1.4 < 1.5
    CHECK(greedy_of({2.0f, 1.5f, 1.0f}, {0}, p) == 1);
    CHECK(greedy_of({2.0f, 1.5f, 1.0f}, {}, p) == 0);
    p.presence_penalty = 0.4f;  // 1.6 > 1.5
    CHECK(greedy_of({2.0f, 1.5f, 1.0f}, {0}, p) == 0);
    // Presence counts once however often the token occurs: 2.0 - 0.4 = 1.6 > 1.5.
    CHECK(greedy_of({2.0f, 1.5f, 1.0f}, {0, 0, 0, 0}, p) == 0);
    // Negative presence penalty boosts: 1.0 + 1.2 = 2.2 > 2.0.
    p.presence_penalty = -1.2f;
    CHECK(greedy_of({2.0f, 1.5f, 1.0f}, {2}, p) == 2);
}

TEST_CASE(frequency_penalty_changes_argmax) {
    sampling_params p;
    p.frequency_penalty = 0.2f;
    CHECK(greedy_of({2.0f, 1.5f}, {0}, p) == 0);        // 1.8
    CHECK(greedy_of({2.0f, 1.5f}, {0, 0}, p) == 0);     // 1.6
    CHECK(greedy_of({2.0f, 1.5f}, {0, 0, 0}, p) == 1);  // 1.4
    CHECK(greedy_of({2.0f, 1.5f}, {0, 1, 0, 0}, p) == 0);  // 1.4 vs 1.3
    CHECK(greedy_of({2.0f, 1.5f}, {0, 0, 0, 0}, p) == 1);  // 1.2 vs 1.5
    CHECK(greedy_of({2.0f, 1.5f}, {0, 1, 1, 0, 0, 1, 1}, p) == 0);  // 1.4 vs 0.7
}

TEST_CASE(repetition_penalty_changes_argmax) {
    sampling_params p;
    p.repetition_penalty = 1.5f;
    CHECK(greedy_of({2.0f, 1.5f}, {0}, p) == 1);  // 2 / 1.5 = 1.333 < 1.5
    CHECK(greedy_of({2.0f, 1.2f}, {0}, p) == 0);  // 1.333 > 1.2
    // Negative logits are multiplied: -1.0 * 1.5 = -1.5 < -1.2 (dividing would give -0.667 and keep id 0).
    CHECK(greedy_of({-1.0f, -1.2f}, {0}, p) == 1);
    // Repetition counts once: 3 occurrences are the same as one.
    CHECK(greedy_of({2.0f, 1.3f}, {0, 0, 0}, p) == 0);  // 1.333 > 1.3
    // rp < 1 rewards repeats: 1.0 / 0.5 = 2.0 > 1.5.
    p.repetition_penalty = 0.5f;
    CHECK(greedy_of({1.5f, 1.0f}, {1}, p) == 1);
}

TEST_CASE(penalty_window) {
    sampling_params p;
    p.presence_penalty = 0.5f;
    const std::vector<float> l = {2.0f, 0.0f, 1.8f};
    const std::vector<int32_t> h = {0, 1, 1};
    p.penalty_last_n = 2;  // id 0 is outside the window
    CHECK(greedy_of(l, h, p) == 0);
    p.penalty_last_n = 3;  // 2.0 - 0.5 = 1.5 < 1.8
    CHECK(greedy_of(l, h, p) == 2);
    p.penalty_last_n = -1;
    CHECK(greedy_of(l, h, p) == 2);
    p.penalty_last_n = 100;
    CHECK(greedy_of(l, h, p) == 2);
    p.penalty_last_n = 0;  // no penalties
    CHECK(greedy_of(l, h, p) == 0);
    // Counts do not leak from one call to the next.
    p.penalty_last_n = -1;
    sampler s(p);
    CHECK(s.sample(l.data(), 3, h) == 2);
    CHECK(s.sample(l.data(), 3, {}) == 0);
}

TEST_CASE(penalty_order_repetition_then_frequency) {
    // logits {2, 0}, id 0 seen twice, rp 2, frequency 0.5: 2 / 2 - 2 * 0.5 = 0 -> probs {0.5, 0.5}.
    // The other order would give (2 - 1) / 2 = 0.5.
    sampling_params p;
    p.temperature = 1.0f;
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    const auto d = dist_of({2.0f, 0.0f}, p, {0, 0});
    CHECK(dist_equals(d, {{0, 0.5}, {1, 0.5}}));
    // Presence on top: 0 - 0.25 -> softmax(-0.25, 0).
    p.presence_penalty = 0.25f;
    const double e = std::exp(-0.25);
    CHECK(dist_equals(dist_of({2.0f, 0.0f}, p, {0, 0}), {{1, 1.0 / (1.0 + e)}, {0, e / (1.0 + e)}}));
}

TEST_CASE(top_k_1_equals_greedy) {
    const std::vector<float> l = random_logits(1000, 7, 3.0f);
    const std::vector<int32_t> hist = {5, 17, 17, 400};
    for (float t : {0.05f, 0.7f, 1.0f, 5.0f, 1000.0f}) {
        for (uint64_t seed : {0ull, 1ull, 99ull}) {
            sampling_params p;
            p.temperature = t;
            p.top_k = 1;
            p.seed = seed;
            p.frequency_penalty = 0.3f;
            sampler s(p);
            const int32_t g = greedy_of(l, hist, p);
            for (int i = 0; i < 20; ++i) CHECK(s.sample(l.data(), 1000, hist) == g);
            const auto d = s.distribution(l.data(), 1000, hist);
            CHECK(d.size() == 1 && d[0].first == g && d[0].second == 1.0f);
        }
    }
}

TEST_CASE(top_k_keeps_k_best) {
    sampling_params p;
    p.temperature = 1.0f;
    p.top_k = 2;
    // probs by id {0.15, 0.5, 0.05, 0.3}: the two best are ids 1 and 3 -> {0.625, 0.375}.
    const auto l = logits_from_probs({0.15, 0.5, 0.05, 0.3});
    CHECK(dist_equals(dist_of(l, p), {{1, 0.625}, {3, 0.375}}));
    // Ties at the boundary go to the lower id.
    CHECK(dist_equals(dist_of({1.0f, 0.0f, 1.0f, 1.0f}, p), {{0, 0.5}, {2, 0.5}}));
    // top_k larger than the vocabulary is the whole vocabulary.
    p.top_k = 100;
    CHECK(dist_of(l, p).size() == 4);
}

// The hand examples run on both paths: top_k 0 (full-vocabulary path) and top_k 4 < n_vocab 5 (top_k
// path; the fifth token is masked, so top_k 4 removes nothing).
TEST_CASE(top_p_keeps_minimal_prefix) {
    const auto l = logits_from_probs({0.15, 0.5, 0.05, 0.3, 0.0});  // sorted: 1 (0.5), 3 (0.3), 0 (0.15), 2 (0.05)
    for (int32_t k : {0, 4}) {
        sampling_params p;
        p.temperature = 1.0f;
        p.top_k = k;
        p.top_p = 0.45f;  // 0.5 alone reaches 0.45
        CHECK(dist_equals(dist_of(l, p), {{1, 1.0}}));
        p.top_p = 0.75f;  // 0.5 < 0.75 <= 0.8
        CHECK(dist_equals(dist_of(l, p), {{1, 0.625}, {3, 0.375}}));
        p.top_p = 0.81f;  // needs 0.95
        CHECK(dist_equals(dist_of(l, p), {{1, 0.5 / 0.95}, {3, 0.3 / 0.95}, {0, 0.15 / 0.95}}));
        p.top_p = 0.99f;
        CHECK(dist_of(l, p).size() == 4);
        p.top_p = 1.0f;
        CHECK(dist_equals(dist_of(l, p), {{1, 0.5}, {3, 0.3}, {0, 0.15}, {2, 0.05}}));
        // top_p sees the temperature-scaled distribution: at T = 0.5 probs are {25, 9, 2.25, 0.25} / 36.5,
        // so 0.9 is reached by the first two (34 / 36.5 = 0.93), whereas at T = 1 it needs three.
        p.temperature = 0.5f;
        p.top_p = 0.9f;
        CHECK(dist_equals(dist_of(l, p), {{1, 25.0 / 34.0}, {3, 9.0 / 34.0}}));
        p.temperature = 1.0f;
        CHECK(dist_of(l, p).size() == 3);
    }
}

TEST_CASE(min_p_drops_below_fraction_of_max) {
    const auto l = logits_from_probs({0.15, 0.5, 0.05, 0.3, 0.0});
    for (int32_t k : {0, 4}) {
        sampling_params p;
        p.temperature = 1.0f;
        p.top_k = k;
        p.min_p = 0.2f;  // threshold 0.1: drops 0.05
        CHECK(dist_equals(dist_of(l, p), {{1, 0.5 / 0.95}, {3, 0.3 / 0.95}, {0, 0.15 / 0.95}}));
        p.min_p = 0.5f;  // threshold 0.25: keeps 0.5, 0.3
        CHECK(dist_equals(dist_of(l, p), {{1, 0.625}, {3, 0.375}}));
        p.min_p = 0.65f;  // threshold 0.325: only the max
        CHECK(dist_equals(dist_of(l, p), {{1, 1.0}}));
        // min_p sees the temperature-scaled distribution: at T = 2 the ratio 0.3 / 0.5 becomes
        // sqrt(0.6) = 0.775 > 0.65.
        p.temperature = 2.0f;
        CHECK(dist_of(l, p).size() == 2);
        p.temperature = 1.0f;
        // Combined with top_p the tighter one wins: top_p 0.81 keeps 3, min_p 0.5 keeps 2.
        p.min_p = 0.5f;
        p.top_p = 0.81f;
        CHECK(dist_of(l, p).size() == 2);
        p.min_p = 0.2f;
        p.top_p = 0.75f;
        CHECK(dist_of(l, p).size() == 2);
    }
}

TEST_CASE(distribution_matches_softmax_at_temperature_2) {
    sampling_params p;
    p.temperature = 2.0f;
    // exp(l / 2) / sum for l = {1, 2, 3, 0}, computed independently.
    const auto d = dist_of({1.0f, 2.0f, 3.0f, 0.0f}, p);
    CHECK(dist_equals(d, {{2, 0.45505423392341127}, {1, 0.27600434470659363}, {0, 0.16740509727844333},
                          {3, 0.1015363240915518}},
                      1e-6));
    double sum = 0;
    for (const auto & e : d) sum += e.second;
    CHECK(near(sum, 1.0, 1e-6));
    // Masked tokens are absent, and shifting all logits changes nothing.
    const auto m = dist_of({1001.0f, 1002.0f, 1003.0f, 1000.0f, NEG_INF}, p);
    CHECK(dist_equals(m, {{2, 0.45505423392341127}, {1, 0.27600434470659363}, {0, 0.16740509727844333},
                          {3, 0.1015363240915518}},
                      1e-6));
}

TEST_CASE(distribution_matches_reference_on_larger_vocab) {
    // Flat-ish logits over 5000 ids make top_p / min_p need thousands of candidates, exercising the
    // incremental partial sort; compared with a naive full-sort reference.
    const std::vector<float> l = random_logits(5000, 3, 1.0f);
    struct cfg { float t; int32_t k; float tp; float mp; };
    const cfg cfgs[] = {{1.0f, 0, 1.0f, 0.0f}, {1.0f, 0, 0.9f, 0.0f}, {0.3f, 0, 0.95f, 0.0f}, {1.0f, 0, 1.0f, 0.3f},
                        {0.7f, 0, 0.8f, 0.1f}, {1.0f, 3000, 0.9f, 0.0f}, {1.3f, 40, 0.9f, 0.05f}, {0.01f, 0, 0.5f, 0.0f},
                        {0.01f, 0, 1.0f, 0.0f}, {1000.0f, 0, 0.5f, 0.0f}, {0.05f, 4999, 0.99f, 0.0f}, {3.0f, 0, 0.3f, 0.9f}};
    for (const cfg & c : cfgs) {
        sampling_params p;
        p.temperature = c.t;
        p.top_k = c.k;
        p.top_p = c.tp;
        p.min_p = c.mp;
        const auto d = dist_of(l, p);
        const auto r = reference(l, p);
        CHECK(dist_equals(d, r, 1e-6));
        double sum = 0;
        for (const auto & e : d) sum += e.second;
        CHECK(near(sum, 1.0, 1e-4));
        for (size_t i = 1; i < d.size(); ++i) CHECK(d[i - 1].second >= d[i].second);
    }
}

TEST_CASE(ties_and_masks_on_large_vocab) {
    // 5000 equal logits: one bucket holds everything; ties keep the lowest ids.
    std::vector<float> l(5000, 0.25f);
    for (int i = 0; i < 5000; i += 7) l[i] = NEG_INF;
    for (int32_t k : {0, 100}) {
        sampling_params p;
        p.temperature = 0.8f;
        p.top_k = k;
        p.top_p = 0.5f;
        const auto d = dist_of(l, p);
        CHECK(dist_equals(d, reference(l, p), 1e-7));
        const size_t n_finite = 5000 - (4999 / 7 + 1);
        CHECK(d.size() == (k > 0 ? 50 : (n_finite + 1) / 2));
        CHECK(d.front().first == 1 && d[1].first == 2 && d[6].first == 8);
    }
}

TEST_CASE(penalties_equal_prepenalized_logits) {
    // distribution() with history must equal distribution() of logits penalized by hand, on both
    // the top_k path and the full-vocabulary path.
    const std::vector<float> l = random_logits(3000, 9, 2.0f);
    std::vector<int32_t> hist;
    for (int i = 0; i < 300; ++i) hist.push_back((i * 37) % 3000);
    hist.push_back(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
    for (int32_t k : {0, 50}) {
        sampling_params p;
        p.temperature = 0.9f;
        p.top_k = k;
        p.top_p = 0.9f;
        p.repetition_penalty = 1.3f;
        p.frequency_penalty = 0.1f;
        p.presence_penalty = 0.2f;
        p.penalty_last_n = 200;
        std::vector<int> count(3000, 0);
        for (size_t i = hist.size() - 200; i < hist.size(); ++i) ++count[hist[i]];
        std::vector<float> pen = l;
        for (int i = 0; i < 3000; ++i) {
            if (count[i] == 0) continue;
            pen[i] = pen[i] > 0 ? pen[i] / 1.3f : pen[i] * 1.3f;
            pen[i] -= count[i] * 0.1f + 0.2f;
        }
        const auto a = dist_of(l, p, hist);
        const auto b = dist_of(pen, p);
        CHECK(dist_equals(a, std::vector<std::pair<int32_t, double>>(b.begin(), b.end()), 1e-7));
        CHECK(!dist_equals(a, reference(l, p), 1e-5, true));  // the penalties did change something
    }
}

TEST_CASE(logit_bias_equals_prebiased_logits) {
    // logit_bias adds to the raw logits before the penalties: the same distribution (and greedy
    // pick) as logits biased by hand, with and without penalties, top_k and full-vocabulary paths.
    const std::vector<float> l = random_logits(3000, 19, 2.0f);
    const int32_t top = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    const std::vector<std::pair<int32_t, float>> bias{{top, -100.0f}, {17, 6.0f}, {2999, 3.5f}, {40, -2.0f}};
    std::vector<int32_t> hist{17, 17, 40, 5, 6};
    for (bool penalties : {false, true}) {
        for (int32_t k : {0, 50}) {
            sampling_params p;
            p.temperature = 0.9f;
            p.top_k = k;
            p.logit_bias = bias;
            if (penalties) {
                p.repetition_penalty = 1.3f;
                p.presence_penalty = 0.5f;
            }
            std::vector<float> pre = l;
            for (const auto & [id, b] : bias) pre[id] += b;
            sampling_params q = p;
            q.logit_bias.clear();
            const auto a = dist_of(l, p, hist);
            const auto b = dist_of(pre, q, hist);
            CHECK(dist_equals(a, std::vector<std::pair<int32_t, double>>(b.begin(), b.end()), 1e-7));
            CHECK(std::none_of(a.begin(), a.end(), [&](const auto & e) { return e.first == top; }));  // banned
            p.temperature = q.temperature = 0.0f;
            CHECK(greedy_of(l, hist, p) == greedy_of(pre, hist, q));
        }
    }
    sampling_params bad;
    bad.logit_bias = {{3, 101.0f}};
    CHECK_THROWS(bad.validate(), config_error, "[-100, 100]");
    bad.logit_bias = {{3, 1.0f}, {3, 2.0f}};
    CHECK_THROWS(bad.validate(), config_error, "twice");
    bad.logit_bias = {{-1, 1.0f}};
    CHECK_THROWS(bad.validate(), config_error, ">= 0");
    sampling_params far;
    far.logit_bias = {{5000, 1.0f}};
    sampler s(far);
    CHECK_THROWS(s.sample(l.data(), 3000, {}), error, "outside the vocabulary");
}

TEST_CASE(rng_is_pinned) {
    // xoshiro256** seeded by splitmix64; values from an independent implementation.
    sampling_params p;
    sampler s(p);
    CHECK(s.uniform() == 0x1.33d8be6d96ebep-1);
    CHECK(s.uniform() == 0x1.7edc3ef092ac8p-1);
    CHECK(s.uniform() == 0x1.a5f849d4933e0p-4);
    CHECK(s.uniform() == 0x1.aa9653c498b4ap-2);
    CHECK(s.uniform() == 0x1.774b5a943f085p-1);
    for (int i = 5; i < 999; ++i) s.uniform();
    CHECK(s.uniform() == 0x1.eab23120e8bb6p-2);  // the 1000th
    s.reseed(12345);
    CHECK(s.uniform() == 0x1.7cd46c6e82c1ap-1);
    CHECK(s.uniform() == 0x1.0a555031bd344p-3);
    CHECK(s.uniform() == 0x1.ed3a2dbd32a9ap-1);
    p.seed = 12345;
    sampler t(p);
    CHECK(t.uniform() == 0x1.7cd46c6e82c1ap-1);
}

TEST_CASE(sample_is_inverse_cdf_of_distribution) {
  const std::vector<float> l = random_logits(2000, 11, 2.0f);
  for (int32_t k : {0, 300}) {
    sampling_params p;
    p.temperature = 0.9f;
    p.top_k = k;
    p.top_p = 0.95f;
    p.min_p = 0.001f;
    p.seed = 5;
    sampler s(p);
    const auto d = s.distribution(l.data(), 2000, {});
    int mismatches = 0;
    for (int i = 0; i < 2000; ++i) {
        s.reseed(1000 + i);
        const double u = s.uniform();
        s.reseed(1000 + i);
        const int32_t got = s.sample(l.data(), 2000, {});
        double cum = 0;
        int32_t want = d.back().first;
        for (const auto & e : d) {
            cum += e.second;
            if (cum > u) {
                want = e.first;
                break;
            }
        }
        mismatches += got != want;
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE(statistical_frequencies_match_distribution) {
    const std::vector<float> l = {0.1f, 1.0f, -0.5f, 2.0f, 0.7f};
    struct cfg { float top_p; int32_t top_k; };
    for (const cfg & c : {cfg{1.0f, 0}, cfg{0.8f, 0}, cfg{1.0f, 3}}) {
        const float top_p = c.top_p;
        sampling_params p;
        p.temperature = 0.8f;
        p.top_p = top_p;
        p.top_k = c.top_k;
        p.seed = 42;
        sampler s(p);
        const auto d = s.distribution(l.data(), 5, {});
        std::vector<double> want(5, 0.0);
        for (const auto & e : d) want[e.first] = e.second;
        const int n = 200000;
        std::vector<int> count(5, 0);
        for (int i = 0; i < n; ++i) ++count[s.sample(l.data(), 5, {})];
        double max_abs = 0, chi2 = 0;
        for (int i = 0; i < 5; ++i) {
            const double f = static_cast<double>(count[i]) / n;
            max_abs = std::max(max_abs, std::fabs(f - want[i]));
            if (want[i] > 0) chi2 += (count[i] - n * want[i]) * (count[i] - n * want[i]) / (n * want[i]);
            else CHECK(count[i] == 0);  // truncated tokens are never drawn
        }
        std::printf("  top_p %.1f top_k %d: %zu tokens, max |freq - prob| = %.5f, chi2 = %.2f\n", top_p, c.top_k,
                    d.size(), max_abs, chi2);
        CHECK(max_abs < 0.01);
        CHECK(chi2 < 20.0);  // df <= 4: p ~ 5e-4
    }
}

TEST_CASE(same_seed_same_sequence) {
    const std::vector<float> l = {0.1f, 1.0f, -0.5f, 2.0f, 0.7f};
    sampling_params p;
    p.temperature = 1.5f;
    p.seed = 7;
    sampler a(p), b(p);
    p.seed = 8;
    sampler c(p);
    std::vector<int32_t> sa, sb, sc;
    for (int i = 0; i < 1000; ++i) {
        sa.push_back(a.sample(l.data(), 5, {}));
        sb.push_back(b.sample(l.data(), 5, {}));
        sc.push_back(c.sample(l.data(), 5, {}));
    }
    CHECK(sa == sb);
    CHECK(sa != sc);
    // reseed restarts the stream.
    a.reseed(7);
    std::vector<int32_t> again;
    for (int i = 0; i < 1000; ++i) again.push_back(a.sample(l.data(), 5, {}));
    CHECK(again == sa);
}

TEST_CASE(validate_rejects_each_bad_field) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    sampling_params ok;
    ok.validate();
    ok.top_p = 1.0f;
    ok.min_p = 0.0f;
    ok.temperature = 0.0f;
    ok.penalty_last_n = -1;
    ok.presence_penalty = -2.0f;
    ok.validate();

    auto bad = [](auto mutate) {
        sampling_params p;
        mutate(p);
        return p;
    };
    CHECK_THROWS(bad([](sampling_params & p) { p.temperature = -0.1f; }).validate(), config_error, "temperature");
    CHECK_THROWS(bad([&](sampling_params & p) { p.temperature = nan; }).validate(), config_error, "temperature");
    CHECK_THROWS(bad([&](sampling_params & p) { p.temperature = inf; }).validate(), config_error, ">= 0");
    CHECK_THROWS(bad([](sampling_params & p) { p.top_k = -1; }).validate(), config_error, "top_k");
    CHECK_THROWS(bad([](sampling_params & p) { p.top_p = 0.0f; }).validate(), config_error, "top_p must be in (0, 1]");
    CHECK_THROWS(bad([](sampling_params & p) { p.top_p = 1.5f; }).validate(), config_error, "top_p");
    CHECK_THROWS(bad([&](sampling_params & p) { p.top_p = nan; }).validate(), config_error, "top_p");
    CHECK_THROWS(bad([](sampling_params & p) { p.min_p = -0.1f; }).validate(), config_error, "min_p must be in [0, 1)");
    CHECK_THROWS(bad([](sampling_params & p) { p.min_p = 1.0f; }).validate(), config_error, "min_p");
    CHECK_THROWS(bad([&](sampling_params & p) { p.presence_penalty = inf; }).validate(), config_error,
                 "presence_penalty");
    CHECK_THROWS(bad([&](sampling_params & p) { p.frequency_penalty = nan; }).validate(), config_error,
                 "frequency_penalty");
    CHECK_THROWS(bad([](sampling_params & p) { p.repetition_penalty = 0.0f; }).validate(), config_error,
                 "repetition_penalty");
    CHECK_THROWS(bad([](sampling_params & p) { p.repetition_penalty = -1.0f; }).validate(), config_error,
                 "repetition_penalty");
    CHECK_THROWS(bad([](sampling_params & p) { p.penalty_last_n = -2; }).validate(), config_error, "penalty_last_n");
    // The constructor validates.
    CHECK_THROWS(sampler(bad([](sampling_params & p) { p.top_p = 2.0f; })), config_error, "top_p");
}

TEST_CASE(bad_logits_and_history) {
    sampling_params g;
    sampling_params t;
    t.temperature = 1.0f;
    for (const sampling_params & p : {g, t}) {
        sampler s(p);
        const std::vector<float> nan_l = {0.0f, 1.0f, 2.0f, std::numeric_limits<float>::quiet_NaN()};
        CHECK_THROWS(s.sample(nan_l.data(), 4, {}), error, "logits contain NaN at id 3");
        CHECK_THROWS(s.distribution(nan_l.data(), 4, {}), error, "NaN at id 3");
        const std::vector<float> inf_l = {0.0f, std::numeric_limits<float>::infinity()};
        CHECK_THROWS(s.sample(inf_l.data(), 2, {}), error, "+inf at id 1");
        const std::vector<float> masked = {NEG_INF, NEG_INF};
        CHECK_THROWS(s.sample(masked.data(), 2, {}), error, "-inf");
        const std::vector<float> l = {0.0f, 1.0f};
        CHECK_THROWS(s.sample(nullptr, 2, {}), error, "no logits");
        sampling_params pp = p;
        pp.presence_penalty = 1.0f;
        sampler sp(pp);
        CHECK_THROWS(sp.sample(l.data(), 2, {0, 2}), error, "history token id 2");
        CHECK_THROWS(sp.sample(l.data(), 2, {-1}), error, "outside the vocabulary");
        // After the error the sampler still works and no counts leaked.
        const int32_t after = sp.sample(l.data(), 2, {});
        CHECK(p.is_greedy() ? after == 1 : (after == 0 || after == 1));
        const auto d = sp.distribution(l.data(), 2, {});
        if (!p.is_greedy()) CHECK(d.size() == 2 && d[0].first == 1 && near(d[0].second, 1.0 / (1.0 + std::exp(-1.0))));
    }
    // Masked tokens are never drawn.
    sampler s(t);
    const std::vector<float> l = {0.0f, NEG_INF, 0.0f, NEG_INF};
    for (int i = 0; i < 1000; ++i) {
        const int32_t id = s.sample(l.data(), 4, {});
        CHECK(id == 0 || id == 2);
    }
}

TEST_CASE(full_vocab_timing) {
    const int32_t n_vocab = 248320;
    const std::vector<float> l = random_logits(n_vocab, 2024, 4.0f);
    std::vector<int32_t> history;
    for (int i = 0; i < 200; ++i) history.push_back((i * 7919) % n_vocab);

    std::vector<float> sorted = l;
    std::nth_element(sorted.begin(), sorted.begin() + 39, sorted.end(), std::greater<float>());
    const float kth = sorted[39];

    struct cfg { const char * name; float t; int32_t k; float tp; float mp; float rp; };
    const cfg cfgs[] = {{"greedy", 0.0f, 0, 1.0f, 0.0f, 1.0f},
                        {"top_k=40 top_p=0.9 T=0.7", 0.7f, 40, 0.9f, 0.0f, 1.0f},
                        {"top_k=40 top_p=0.9 T=0.7 rp=1.1", 0.7f, 40, 0.9f, 0.0f, 1.1f},
                        {"top_k=20 top_p=0.95 T=0.6", 0.6f, 20, 0.95f, 0.0f, 1.0f},
                        {"top_p=0.9 T=1", 1.0f, 0, 0.9f, 0.0f, 1.0f},
                        {"min_p=0.05 T=1", 1.0f, 0, 1.0f, 0.05f, 1.0f},
                        {"T=1 only", 1.0f, 0, 1.0f, 0.0f, 1.0f}};
    for (const cfg & c : cfgs) {
        sampling_params p;
        p.temperature = c.t;
        p.top_k = c.k;
        p.top_p = c.tp;
        p.min_p = c.mp;
        p.repetition_penalty = c.rp;
        p.seed = 1;
        sampler s(p);
        const int iters = 50;
        int32_t id = 0;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) id = s.sample(l.data(), n_vocab, history);
        const auto t1 = std::chrono::steady_clock::now();
        const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count() / iters;
        std::printf("  vocab %d, %-32s %.3f ms/sample (last id %d)\n", n_vocab, c.name, ms, id);
        CHECK(id >= 0 && id < n_vocab);
        if (c.k == 40 && c.rp == 1.0f) CHECK(l[id] >= kth);
    }
    for (const cfg & c : {cfgs[1], cfgs[4], cfgs[6]}) {
        sampling_params p;
        p.temperature = c.t;
        p.top_k = c.k;
        p.top_p = c.tp;
        sampler s(p);
        const auto t0 = std::chrono::steady_clock::now();
        const auto d = s.distribution(l.data(), n_vocab, history);
        const auto t1 = std::chrono::steady_clock::now();
        std::printf("  vocab %d, distribution() %-19s %.3f ms, %zu tokens\n", n_vocab, c.name,
                    std::chrono::duration<double, std::milli>(t1 - t0).count(), d.size());
        CHECK(!d.empty() && (c.k == 0 || d.size() <= static_cast<size_t>(c.k)));
        double sum = 0;
        for (const auto & e : d) sum += e.second;
        CHECK(near(sum, 1.0, 1e-5));
    }
}

// accept_or_resample keeps the distribution: P(token) equals distribution() whether the proposal
// is accepted or resampled, on the full-vocabulary path (histogram buckets) and the top_k path.
// The device-candidate path (logit_row with candidates) must draw exactly what the full row draws
// for the same seed whenever it decides, and fall back to the full row otherwise.
candidate_row device_candidates(const std::vector<float> & logits, int32_t c, const std::vector<int32_t> & extra) {
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    // the device's top-C in no particular order (ties broken arbitrarily: here by higher id)
    std::partial_sort(order.begin(), order.begin() + c, order.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a > b); });
    candidate_row row;
    row.floor = std::numeric_limits<float>::infinity();
    for (int32_t i = c; i-- > 0;) {
        row.ids.push_back(order[i]);
        row.logits.push_back(logits[order[i]]);
        row.floor = std::min(row.floor, logits[order[i]]);
    }
    for (int32_t id : extra) {
        row.ids.push_back(id);
        row.logits.push_back(logits[id]);
    }
    return row;
}

TEST_CASE(candidates_draw_what_the_full_row_draws) {
    const int32_t V = 6000;
    int decided = 0, fell_back = 0, cases = 0;
    for (uint64_t trial = 0; trial < 400; ++trial) {
        std::vector<float> logits = random_logits(V, 1000 + trial, trial % 3 == 0 ? 2.0f : 6.0f);
        if (trial % 7 == 0) {  // ties around the cut
            for (int32_t i = 0; i < 40; ++i) logits[i * 13] = 9.0f;
        }
        sampling_params p;
        p.temperature = trial % 11 == 0 ? 0.0f : 0.3f + 0.1f * static_cast<float>(trial % 9);
        p.top_k = std::vector<int32_t>{1, 5, 20, 40, 0, 64}[trial % 6];
        p.top_p = trial % 4 == 0 ? 1.0f : 0.8f;
        p.min_p = trial % 5 == 0 ? 0.05f : 0.0f;
        if (trial % 3 != 0) {
            p.repetition_penalty = trial % 2 ? 1.3f : 0.8f;  // < 1 raises penalized logits
            p.presence_penalty = trial % 4 == 1 ? -1.5f : 0.7f;
            p.frequency_penalty = 0.2f;
            p.penalty_last_n = trial % 5 == 0 ? -1 : 32;
        }
        p.seed = trial;
        if (trial % 4 == 2) {  // biases: one lifted from anywhere, the top id banned, one in the window
            p.logit_bias = {{int32_t((trial * 577) % V), 4.0f + float(trial % 7)},
                            {int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()), -100.0f},
                            {13, trial % 8 == 2 ? 2.5f : -3.0f}};
            if (p.logit_bias[0].first == p.logit_bias[1].first || p.logit_bias[0].first == 13 ||
                p.logit_bias[1].first == 13) {
                p.logit_bias.pop_back();
                p.logit_bias.pop_back();
            }
        }
        std::vector<int32_t> history;
        for (int32_t i = 0; i < 80; ++i) history.push_back(static_cast<int32_t>((trial * 7919 + i * 104729) % V));
        for (int32_t i = 0; i < 6; ++i) history.push_back(i * 13);  // some top ids in the window
        sampler full(p), dev(p);
        const int32_t c = std::max(dev.wanted_candidates(), 64);
        const candidate_row cand = device_candidates(logits, c, dev.penalty_ids(history));
        for (int draw = 0; draw < 4; ++draw) {
            ++cases;
            bool used_full = false;
            logit_row row{&cand, [&] {
                              used_full = true;
                              return logits.data();
                          }};
            const int32_t want = full.sample(logits.data(), V, history);
            const int32_t got = dev.sample(row, V, history);
            CHECK(got == want);
            (used_full ? fell_back : decided) += 1;
            // acceptance of a proposal: the top candidate and a random id
            const int32_t proposed = draw % 2 ? cand.ids.back() : static_cast<int32_t>((trial * 31 + draw) % V);
            bool acc_full = false, acc_dev = false;
            used_full = false;
            const int32_t t_full = full.accept_or_resample(logits.data(), V, history, proposed, acc_full);
            const int32_t t_dev = dev.accept_or_resample(row, V, history, proposed, acc_dev);
            CHECK(t_full == t_dev && acc_full == acc_dev);
            // top_k off (and not greedy): the subset can never decide
            if (p.top_k == 0 && !p.is_greedy()) CHECK(used_full);
        }
    }
    std::printf("  candidates decided %d of %d draws, full row %d\n", decided, cases, fell_back);
    CHECK(decided > cases / 2);
    CHECK(fell_back > 0);
}

TEST_CASE(candidates_missing_a_penalized_id_fall_back) {
    const int32_t V = 500;
    std::vector<float> logits = random_logits(V, 5, 3.0f);
    sampling_params p;
    p.temperature = 0.8f;
    p.top_k = 10;
    p.presence_penalty = -50.0f;  // lifts the penalized id above everything
    const std::vector<int32_t> history{7};
    sampler s(p);
    candidate_row cand = device_candidates(logits, 64, {});  // the window's id not gathered
    if (std::find(cand.ids.begin(), cand.ids.end(), 7) != cand.ids.end()) return;  // (not the case for this seed)
    bool used_full = false;
    logit_row row{&cand, [&] {
                      used_full = true;
                      return logits.data();
                  }};
    s.sample(row, V, history);
    CHECK(used_full);
}

TEST_CASE(accept_or_resample_is_distribution_exact) {
    const int32_t V = 3000;
    std::vector<float> logits(V);
    uint64_t x = 12345;
    for (float & v : logits) {  // deterministic pseudo-random logits with a few strong tokens
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        v = static_cast<float>((x >> 40) % 1000) / 250.0f;
    }
    logits[7] = 7.0f;
    logits[99] = 6.5f;
    logits[1234] = 6.8f;
    const std::vector<int32_t> history{7, 7, 42};
    const variant variants[] = {{0.8f, 0, 0.9f, 0.0f, 1.0f}, {1.2f, 0, 1.0f, 0.05f, 1.3f}, {1.0f, 50, 0.95f, 0.0f, 1.0f}};
    for (const variant & vr : variants) {
        sampling_params p = vr.params();
        p.seed = 99;
        sampler smp(p);
        const auto dist = smp.distribution(logits.data(), V, history);
        for (int32_t proposed : {dist[0].first, dist[std::min<size_t>(2, dist.size() - 1)].first, int32_t(2999)}) {
            const int n = 200000;
            std::vector<int> counts(V, 0);
            int accepted_n = 0;
            for (int i = 0; i < n; ++i) {
                bool accepted = false;
                const int32_t t = smp.accept_or_resample(logits.data(), V, history, proposed, accepted);
                counts[t]++;
                accepted_n += accepted ? 1 : 0;
                CHECK(!accepted || t == proposed);
            }
            double worst = 0.0, p_prop = 0.0;
            for (const auto & [id, prob] : dist) {
                worst = std::max(worst, std::fabs(counts[id] / double(n) - prob));
                if (id == proposed) p_prop = prob;
            }
            int outside = 0;
            for (int32_t id = 0; id < V; ++id) {
                const bool kept = std::any_of(dist.begin(), dist.end(), [&](const auto & d) { return d.first == id; });
                if (!kept) outside += counts[id];
            }
            if (worst >= 0.006 || outside != 0) {
                std::fprintf(stderr, "  T=%.1f k=%d p=%.2f m=%.2f proposed %d: max |freq - p| %.4f, %d outside\n",
                             vr.t, vr.k, vr.p, vr.m, proposed, worst, outside);
            }
            CHECK(worst < 0.006);
            CHECK(outside == 0);
            CHECK(std::fabs(accepted_n / double(n) - p_prop) < 0.006);
        }
    }
}

// Several proposals (a tree node's children) tried in order: the emitted token follows
// distribution() exactly, proposal j is accepted with probability p(d_j) (0 for a repeated id or
// one outside the kept set), for proposal sets with ids outside the kept set and repeats.
TEST_CASE(accept_or_resample_among_is_distribution_exact) {
    const int32_t V = 3000;
    std::vector<float> logits(V);
    uint64_t x = 777;
    for (float & v : logits) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        v = static_cast<float>((x >> 40) % 1000) / 250.0f;
    }
    logits[7] = 7.0f;
    logits[99] = 6.5f;
    logits[1234] = 6.8f;
    logits[55] = 6.6f;
    const std::vector<int32_t> history{7, 7, 42};
    // the full-vocabulary path (min_p, a penalty) and the top_k path (the whole kept set proposed)
    const variant variants[] = {{1.2f, 0, 0.95f, 0.05f, 1.3f}, {1.0f, 4, 1.0f, 0.0f, 1.0f}, {1.0f, 50, 0.95f, 0.0f, 1.0f}};
    logit_row row;
    row.full = [&] { return logits.data(); };
    for (const variant & vr : variants) {
        sampling_params p = vr.params();
        p.seed = 7;
        sampler smp(p);
        const auto dist = smp.distribution(logits.data(), V, history);
        auto prob = [&](int32_t id) {
            for (const auto & d : dist) {
                if (d.first == id) return double(d.second);
            }
            return 0.0;
        };
        auto at = [&](size_t i) { return dist[std::min(i, dist.size() - 1)].first; };
        const std::vector<std::vector<int32_t>> sets = {
            {at(0), at(1)},                // the two best
            {at(1), 2999, at(0), at(2)},   // one outside the kept set in the middle
            {at(2), at(0), at(2), at(3)},  // a repeat
            {at(0), at(1), at(2), at(3)},  // with top_k 4: the whole kept set
            {},                            // none: a plain draw
        };
        for (const auto & props : sets) {
            const int n = 100000;
            std::vector<int> counts(V, 0), acc(props.size() + 1, 0);
            for (int i = 0; i < n; ++i) {
                int index = -2;
                const int32_t t = smp.accept_or_resample_among(row, V, history, props, index);
                counts[t]++;
                CHECK(index >= -1 && index < int(props.size()));
                if (index >= 0) CHECK(t == props[size_t(index)]);
                if (index < 0) CHECK(std::find(props.begin(), props.end(), t) == props.end());
                acc[size_t(index + 1)]++;
            }
            double worst = 0.0;
            for (const auto & [id, pr] : dist) worst = std::max(worst, std::fabs(counts[id] / double(n) - pr));
            int outside = 0;
            for (int32_t id = 0; id < V; ++id) {
                if (prob(id) == 0.0) outside += counts[id];
            }
            double worst_acc = 0.0, rest = 1.0;
            for (size_t j = 0; j < props.size(); ++j) {
                const bool repeat = std::find(props.begin(), props.begin() + j, props[j]) != props.begin() + j;
                const double want = repeat ? 0.0 : prob(props[j]);
                rest -= want;
                worst_acc = std::max(worst_acc, std::fabs(acc[j + 1] / double(n) - want));
            }
            worst_acc = std::max(worst_acc, std::fabs(acc[0] / double(n) - std::max(rest, 0.0)));
            if (worst >= 0.006 || outside != 0 || worst_acc >= 0.006) {
                std::fprintf(stderr, "  T=%.1f k=%d %zu proposals: max |freq - p| %.4f, accept %.4f, %d outside\n",
                             vr.t, vr.k, props.size(), worst, worst_acc, outside);
            }
            CHECK(worst < 0.006);
            CHECK(worst_acc < 0.006);
            CHECK(outside == 0);
        }
    }
}

// One proposal: accept_or_resample_among is accept_or_resample draw for draw (same tokens, same
// acceptance, same RNG stream), on the full row, the candidate rows and greedy with penalties;
// greedy takes the first proposal equal to the argmax.
TEST_CASE(accept_or_resample_among_one_proposal_is_accept_or_resample) {
    const int32_t V = 2000;
    for (uint64_t trial = 0; trial < 60; ++trial) {
        const std::vector<float> logits = random_logits(V, 50 + trial, trial % 2 ? 2.0f : 5.0f);
        sampling_params p;
        p.temperature = trial % 10 == 0 ? 0.0f : 0.7f;
        p.top_k = std::vector<int32_t>{0, 20, 5}[trial % 3];
        p.top_p = trial % 4 == 0 ? 0.9f : 1.0f;
        if (trial % 2) {
            p.repetition_penalty = 1.2f;
            p.presence_penalty = 0.5f;
        }
        p.seed = trial;
        const std::vector<int32_t> history{3, 17, 17, int32_t(trial % V)};
        sampler a(p), b(p);
        const candidate_row cand = device_candidates(logits, std::max(a.wanted_candidates(), 64),
                                                     a.penalty_ids(history));
        for (int draw = 0; draw < 40; ++draw) {
            logit_row row{draw % 2 ? &cand : nullptr, [&] { return logits.data(); }};
            const int32_t proposed = draw % 3 == 0 ? cand.ids.back() : static_cast<int32_t>((trial * 97 + draw) % V);
            bool accepted = false;
            int index = -2;
            const int32_t ta = a.accept_or_resample(row, V, history, proposed, accepted);
            const int32_t tb = b.accept_or_resample_among(row, V, history, {proposed}, index);
            CHECK(ta == tb);
            CHECK(accepted == (index == 0));
            CHECK(index == 0 || index == -1);
        }
        CHECK(a.uniform() == b.uniform());  // the same number of draws
    }
    // greedy: the first proposal equal to the argmax (repeats included), else the argmax
    sampling_params g;
    sampler s(g);
    const std::vector<float> logits{0.1f, 2.0f, 0.5f, 1.0f};
    logit_row row{nullptr, [&] { return logits.data(); }};
    int index = -2;
    const std::vector<int32_t> none, hit{3, 1, 1}, miss{3, 2}, bad{4};
    CHECK(s.accept_or_resample_among(row, 4, none, hit, index) == 1 && index == 1);
    CHECK(s.accept_or_resample_among(row, 4, none, miss, index) == 1 && index == -1);
    CHECK(s.accept_or_resample_among(row, 4, none, none, index) == 1 && index == -1);
    CHECK_THROWS(s.accept_or_resample_among(row, 4, none, bad, index), error, "outside the vocabulary");
}

// Coupled acceptance: accept_or_resample(_among) returns the very token sample() draws with the same
// generator state, whatever the proposals (the sampled one, others, repeats, none), and advances
// the generator as sample() does; a proposal is accepted iff it is that token (the first such).
TEST_CASE(speculative_rows_draw_what_sample_draws) {
    const int32_t V = 2000;
    for (uint64_t trial = 0; trial < 60; ++trial) {
        const std::vector<float> logits = random_logits(V, 900 + trial, trial % 2 ? 2.0f : 5.0f);
        sampling_params p;
        p.temperature = trial % 10 == 0 ? 0.0f : 0.9f;
        p.top_k = std::vector<int32_t>{0, 20, 5}[trial % 3];
        p.min_p = trial % 4 == 1 ? 0.02f : 0.0f;
        if (trial % 2) p.frequency_penalty = 0.4f;
        p.seed = 1000 + trial;
        const std::vector<int32_t> history{5, 5, int32_t(trial % V)};
        sampler plain(p), spec(p), spec_among(p);
        const candidate_row cand = device_candidates(logits, std::max(plain.wanted_candidates(), 64),
                                                     plain.penalty_ids(history));
        int hits = 0;
        for (int draw = 0; draw < 40; ++draw) {
            logit_row row{draw % 2 ? &cand : nullptr, [&] { return logits.data(); }};
            const int32_t want = plain.sample(row, V, history);
            // the proposal: the token itself every third row, else a likely or an arbitrary id
            const int32_t proposed = draw % 3 == 0 ? want : draw % 3 == 1 ? cand.ids[0] : int32_t((trial * 31 + draw) % V);
            bool accepted = false;
            CHECK(spec.accept_or_resample(row, V, history, proposed, accepted) == want);
            CHECK(accepted == (proposed == want));
            hits += accepted;
            const std::vector<int32_t> kids{int32_t((draw * 7) % V), proposed, proposed, want};
            int index = -2;
            CHECK(spec_among.accept_or_resample_among(row, V, history, kids, index) == want);
            int first = -1;
            for (size_t j = 0; j < kids.size() && first < 0; ++j) {
                if (kids[j] == want) first = int(j);
            }
            CHECK(index == first);
        }
        CHECK(hits >= 13);  // every third proposal is the drawn token
        const double u = plain.uniform();  // the generators are in step
        CHECK(spec.uniform() == u);
        CHECK(spec_among.uniform() == u);
    }
}

// logprobs_of: the log-softmax of the raw logits (no penalties, no temperature), from the candidates when
// they decide it exactly, else from the full row, with the same numbers either way.
TEST_CASE(logprobs_are_the_raw_log_softmax) {
    const int32_t V = 3000;
    int from_candidates = 0;
    for (uint64_t trial = 0; trial < 60; ++trial) {
        std::vector<float> logits = random_logits(V, 7000 + trial, 4.0f);
        if (trial % 5 == 0) {
            for (int32_t i = 0; i < V; i += 3) logits[i] = NEG_INF;  // masked ids
        }
        if (trial % 6 == 0) {  // ties at the top: lower id first
            logits[11] = logits[700] = *std::max_element(logits.begin(), logits.end()) + 1.0f;
        }
        double mx = NEG_INF;
        for (float v : logits) mx = std::max(mx, double(v));
        double sum = 0.0;
        for (float v : logits) sum += std::exp(double(v) - mx);
        const double lse = mx + std::log(sum);
        std::vector<int32_t> order(V);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
        const uint32_t n_top = uint32_t(trial % (MAX_TOP_LOGPROBS + 1));
        candidate_row cand = device_candidates(logits, 64, {5, int32_t(trial % V)});
        cand.log_norm = float(lse);
        for (int32_t tok : {order[0], order[3], order[40], int32_t((trial * 977) % V)}) {
            int full_calls = 0;
            const logit_row row{&cand, [&] { ++full_calls; return logits.data(); }};
            const token_logprobs lp = logprobs_of(row, tok, n_top, V);
            from_candidates += full_calls == 0;
            if (std::isinf(logits[tok])) {
                CHECK(std::isinf(lp.logprob) && lp.logprob < 0);
            } else {
                CHECK(near(lp.logprob, double(logits[tok]) - lse, 1e-4));
            }
            CHECK(lp.top.size() == n_top);
            for (uint32_t j = 0; j < lp.top.size(); ++j) {
                CHECK(lp.top[j].first == order[j]);
                CHECK(near(lp.top[j].second, double(logits[order[j]]) - lse, 1e-4));
            }
            const token_logprobs whole = logprobs_of(logit_row{nullptr, [&] { return logits.data(); }}, tok, n_top, V);
            CHECK(whole.top.size() == lp.top.size());
            for (size_t j = 0; j < whole.top.size() && j < lp.top.size(); ++j) {
                CHECK(whole.top[j].first == lp.top[j].first && near(whole.top[j].second, lp.top[j].second, 1e-4));
            }
            CHECK(near(whole.logprob, lp.logprob, 1e-4) || (std::isinf(whole.logprob) && std::isinf(lp.logprob)));
            if (tok == order[0] || tok == order[3]) {
                CHECK(full_calls == 0);  // in the top 64 and n_top <= 20 < 64: decided by the candidates
            }
        }
        cand.log_norm = std::numeric_limits<float>::quiet_NaN();  // not asked of the device: the full row
        int full_calls = 0;
        logprobs_of(logit_row{&cand, [&] { ++full_calls; return logits.data(); }}, order[0], n_top, V);
        CHECK(full_calls == 1);
    }
    CHECK(from_candidates > 100);
    std::vector<float> bad(10, 0.0f);
    bad[4] = std::numeric_limits<float>::quiet_NaN();
    const logit_row row{nullptr, [&] { return bad.data(); }};
    CHECK_THROWS(logprobs_of(row, 1, 2, 10), error, "NaN");
    CHECK_THROWS(logprobs_of(row, 10, 2, 10), error, "outside the vocabulary");
    CHECK_THROWS(logprobs_of(row, 1, MAX_TOP_LOGPROBS + 1, 10), error, "at most");
}

namespace {

// Allowed ids for a constraint's n-th question: a density that varies with n (a handful, a tenth,
// most), and every third time without the row's best ids (the constrained choice lies deeper).
std::vector<uint8_t> allowed_set(uint64_t seed, uint64_t n, const std::vector<float> & logits) {
    const int32_t V = static_cast<int32_t>(logits.size());
    std::vector<uint8_t> ok(size_t(V), 0);
    uint64_t x = (seed * 1000003u + n) * 6364136223846793005ull + 1442695040888963407ull;
    const uint64_t per_mille = std::vector<uint64_t>{3, 100, 900}[n % 3];
    for (int32_t i = 0; i < V; ++i) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ok[size_t(i)] = (x >> 33) % 1000 < per_mille;
    }
    if (n % 3 == 1) {  // the 100 best raw ids are not allowed
        std::vector<int32_t> order(static_cast<size_t>(V));
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + 100, order.end(),
                          [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
        for (int32_t k = 0; k < 100; ++k) ok[size_t(order[k])] = 0;
    }
    ok[size_t((seed + n) % uint64_t(V))] = 1;  // never empty
    return ok;
}

// A constraint allowing allowed_set(seed, n) at its n-th question, recording what it was told.
struct recording_constraint final : token_constraint {
    uint64_t seed = 0;
    const std::vector<float> * logits = nullptr;
    uint64_t asked = 0;
    std::vector<int32_t> accepted;
    std::vector<uint8_t> last;
    void allowed(uint32_t * words, size_t n_words) override {
        last = allowed_set(seed, asked++, *logits);
        CHECK(n_words == (last.size() + 31) / 32);
        for (size_t i = 0; i < n_words; ++i) CHECK(words[i] == 0u);
        for (size_t i = 0; i < last.size(); ++i) {
            if (last[i]) words[i / 32] |= 1u << (i % 32);
        }
        if (last.size() % 32 != 0) words[n_words - 1] |= ~0u << (last.size() % 32);  // junk past n_vocab
    }
    void accept(int32_t token) override { accepted.push_back(token); }
};

}  // namespace

TEST_CASE(constraint_restricts_every_path_to_allowed_ids) {
    // A constrained sampler draws what an unconstrained one draws from the row with the disallowed
    // ids at -inf (same seed), from the full row and from the device's candidates alike, and tells the
    // constraint each choice.
    const int32_t V = 3001;  // not a multiple of 32
    int decided = 0, cases = 0;
    for (uint64_t trial = 0; trial < 120; ++trial) {
        std::vector<float> logits = random_logits(V, 9000 + trial, trial % 2 ? 3.0f : 7.0f);
        sampling_params p;
        p.temperature = trial % 4 == 0 ? 0.0f : 0.5f + 0.1f * float(trial % 7);
        p.top_k = std::vector<int32_t>{0, 1, 8, 40}[trial % 4 == 0 ? 0 : trial % 4];
        p.top_p = trial % 3 == 0 ? 0.9f : 1.0f;
        if (trial % 5 == 1) {
            p.presence_penalty = 1.0f;
            p.repetition_penalty = 1.2f;
            p.logit_bias = {{int32_t(trial % V), 3.0f}};
        }
        p.seed = trial;
        const std::vector<int32_t> history{int32_t(trial % V), 17, 400};
        auto full_c = std::make_shared<recording_constraint>();
        auto dev_c = std::make_shared<recording_constraint>();
        full_c->seed = dev_c->seed = trial;
        full_c->logits = dev_c->logits = &logits;
        sampler ref(p), full(p, full_c), dev(p, dev_c);
        CHECK(dev.constrained() && !ref.constrained());
        CHECK(dev.wanted_candidates() > 0);  // greedy too: the device's argmax alone cannot decide
        const candidate_row cand = device_candidates(logits, std::max(dev.wanted_candidates(), 64),
                                                     dev.penalty_ids(history));
        for (uint64_t n = 0; n < 6; ++n) {
            ++cases;
            const std::vector<uint8_t> ok = allowed_set(trial, n, logits);
            std::vector<float> masked = logits;
            for (int32_t i = 0; i < V; ++i) {
                if (!ok[size_t(i)]) masked[size_t(i)] = NEG_INF;
            }
            const int32_t proposed = n % 2 ? int32_t((trial * 131 + n) % V) : cand.ids.front();
            bool acc_ref = false, acc_full = false, acc_dev = false;
            const int32_t want = ref.accept_or_resample(masked.data(), V, history, proposed, acc_ref);
            const int32_t got_full = full.accept_or_resample(logits.data(), V, history, proposed, acc_full);
            bool used_full = false;
            const logit_row row{&cand, [&] {
                                    used_full = true;
                                    return logits.data();
                                }};
            const int32_t got_dev = dev.accept_or_resample(row, V, history, proposed, acc_dev);
            CHECK(ok[size_t(want)]);
            CHECK(got_full == want && acc_full == acc_ref);
            CHECK(got_dev == want && acc_dev == acc_ref);
            CHECK(full_c->accepted.size() == n + 1 && full_c->accepted.back() == want);
            CHECK(dev_c->accepted.size() == n + 1 && dev_c->accepted.back() == want);
            decided += !used_full;
        }
    }
    std::printf("  constrained rows decided by the candidates: %d of %d\n", decided, cases);
    CHECK(decided > 0 && decided < cases);

    struct none final : token_constraint {
        void allowed(uint32_t *, size_t) override {}
        void accept(int32_t) override { CHECK(false); }
    };
    std::vector<float> logits = random_logits(64, 1, 1.0f);
    sampler s(sampling_params{}, std::make_shared<none>());
    CHECK_THROWS(s.sample(logits.data(), 64, {}), error, "allows no token");
    struct past_the_end final : token_constraint {  // bits past n_vocab only
        void allowed(uint32_t * w, size_t n) override { w[n - 1] = 1u << 31; }
        void accept(int32_t) override { CHECK(false); }
    };
    sampler t(sampling_params{}, std::make_shared<past_the_end>());
    CHECK_THROWS(t.sample(logits.data(), 40, {}), error, "allows no token");
}

TEST_MAIN()
