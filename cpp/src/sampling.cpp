#include "lucebox/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "lucebox/errors.h"

namespace lucebox {

namespace {

std::string fmt(double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%g", v);
    return buf;
}

uint64_t splitmix64(uint64_t & x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// Strict total order: larger logit first, then lower id.
struct better {
    template <typename C>
    bool operator()(const C & a, const C & b) const {
        return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    }
};

[[noreturn]] void bad_logit(float v, int32_t id) {
    throw error(std::string("logits contain ") + (std::isnan(v) ? "NaN" : "+inf") + " at id " + std::to_string(id));
}

}  // namespace

void sampling_params::validate() const {
    if (!(std::isfinite(temperature) && temperature >= 0.0f)) {
        throw config_error("sampling temperature must be finite and >= 0 (got " + fmt(temperature) + ")");
    }
    if (top_k < 0) {
        throw config_error("sampling top_k must be >= 0, 0 = off (got " + std::to_string(top_k) + ")");
    }
    if (!(top_p > 0.0f && top_p <= 1.0f)) {
        throw config_error("sampling top_p must be in (0, 1], 1 = off (got " + fmt(top_p) + ")");
    }
    if (!(min_p >= 0.0f && min_p < 1.0f)) {
        throw config_error("sampling min_p must be in [0, 1), 0 = off (got " + fmt(min_p) + ")");
    }
    if (!std::isfinite(presence_penalty)) {
        throw config_error("sampling presence_penalty must be finite (got " + fmt(presence_penalty) + ")");
    }
    if (!std::isfinite(frequency_penalty)) {
        throw config_error("sampling frequency_penalty must be finite (got " + fmt(frequency_penalty) + ")");
    }
    if (!(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f)) {
        throw config_error("sampling repetition_penalty must be finite and > 0, 1 = off (got " +
                           fmt(repetition_penalty) + ")");
    }
    if (penalty_last_n < -1) {
        throw config_error("sampling penalty_last_n must be >= -1 (-1 = whole history, 0 = none; got " +
                           std::to_string(penalty_last_n) + ")");
    }
}

bool sampling_params::has_penalties() const {
    return penalty_last_n != 0 &&
           (presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f);
}

sampler::sampler(const sampling_params & p) : params_(p) {
    params_.validate();
    reseed(p.seed);
}

void sampler::reseed(uint64_t seed) {
    uint64_t x = seed;
    for (auto & s : s_) s = splitmix64(x);
}

uint64_t sampler::next_u64() {  // xoshiro256**
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
}

double sampler::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

// ---- penalties ----

namespace {
// Leaves counts_ all zero however the scope is left.
template <typename F>
struct scope_exit {
    F f;
    ~scope_exit() { f(); }
};
template <typename F>
scope_exit<F> make_scope_exit(F f) { return {f}; }
}  // namespace

void sampler::count_history(int32_t n_vocab, const std::vector<int32_t> & history) const {
    if (!params_.has_penalties()) return;
    if (counts_.size() != static_cast<size_t>(n_vocab)) counts_.assign(n_vocab, 0);
    const size_t n = history.size();
    const size_t start = params_.penalty_last_n < 0 ? 0
                         : n > static_cast<size_t>(params_.penalty_last_n) ? n - params_.penalty_last_n
                                                                           : 0;
    for (size_t i = start; i < n; ++i) {
        const int32_t id = history[i];
        if (id < 0 || id >= n_vocab) {
            throw error("history token id " + std::to_string(id) + " (position " + std::to_string(i) +
                        ") is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
        }
        if (counts_[id]++ == 0) touched_.push_back(id);
    }
}

void sampler::clear_counts() const {
    for (int32_t id : touched_) counts_[id] = 0;
    touched_.clear();
}

float sampler::penalized(float logit, int32_t count) const {
    const float rp = params_.repetition_penalty;
    float v = logit > 0.0f ? logit / rp : logit * rp;
    v -= static_cast<float>(count) * params_.frequency_penalty + params_.presence_penalty;
    return v;
}

// ---- greedy ----

float sampler::value_at(const float * logits, int32_t i) const {
    const float v = logits[i];
    if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) bad_logit(v, i);
    if (touched_.empty() || counts_[i] == 0) return v;
    const float p = penalized(v, counts_[i]);
    if (std::isnan(p) || p == std::numeric_limits<float>::infinity()) {
        throw error("penalties made the logit of id " + std::to_string(i) + " non-finite");
    }
    return p;
}

int32_t sampler::argmax(const float * logits, int32_t n_vocab) const {
    const int32_t * cnt = touched_.empty() ? nullptr : counts_.data();
    int32_t best = -1;
    float best_v = -std::numeric_limits<float>::infinity();
    bool bad = false;
    for (int32_t i = 0; i < n_vocab; ++i) {
        float v = logits[i];
        bad |= !(v < std::numeric_limits<float>::infinity());  // NaN or +inf
        if (cnt != nullptr && cnt[i] != 0) v = value_at(logits, i);
        if (v > best_v) {
            best_v = v;
            best = i;
        }
    }
    if (bad) {
        for (int32_t i = 0; i < n_vocab; ++i) value_at(logits, i);  // throws naming the first bad id
    }
    if (best < 0) throw error("all " + std::to_string(n_vocab) + " logits are -inf (every token masked)");
    return best;
}

// ---- stochastic ----

size_t sampler::select_mass(size_t lo, size_t hi, double target, bool strict) const {
    auto reaches = [strict](double cum, double t) { return strict ? cum > t : cum >= t; };
    const better bt;
    std::vector<cand> & c = cands_;
    while (hi - lo > 32) {
        // Median of three as pivot, moved to hi - 1; Lomuto partition, best first.
        size_t a = lo, b = lo + (hi - lo) / 2, d = hi - 1;
        if (bt(c[b], c[a])) std::swap(a, b);
        if (bt(c[d], c[b])) std::swap(b, d);
        if (bt(c[b], c[a])) std::swap(a, b);
        std::swap(c[b], c[hi - 1]);
        const cand pv = c[hi - 1];
        size_t store = lo;
        double upper = 0.0;
        for (size_t i = lo; i < hi - 1; ++i) {
            if (bt(c[i], pv)) {
                upper += c[i].w;
                std::swap(c[i], c[store++]);
            }
        }
        std::swap(c[store], c[hi - 1]);
        if (reaches(upper, target)) {
            hi = store;
            continue;
        }
        target -= upper;
        if (reaches(pv.w, target)) return store;
        target -= pv.w;
        lo = store + 1;
    }
    std::sort(c.begin() + static_cast<std::ptrdiff_t>(lo), c.begin() + static_cast<std::ptrdiff_t>(hi), bt);
    double cum = 0.0;
    for (size_t i = lo; i < hi; ++i) {
        cum += c[i].w;
        if (reaches(cum, target)) return i;
    }
    return SIZE_MAX;
}

double sampler::prepare(const float * logits, int32_t n_vocab) const {
    const better bt;
    const float neg_inf = -std::numeric_limits<float>::infinity();
    cands_.clear();
    const int32_t top_k = params_.top_k;
    if (top_k > 0 && top_k < n_vocab && top_k <= 4096) {
        // A heap of the k best seen so far, worst on top; most tokens cost one comparison.
        cands_.reserve(top_k);
        for (int32_t i = 0; i < n_vocab; ++i) {
            const float v = value_at(logits, i);
            if (v == neg_inf) continue;
            const cand x{v, i, 0.0};
            if (cands_.size() < static_cast<size_t>(top_k)) {
                cands_.push_back(x);
                std::push_heap(cands_.begin(), cands_.end(), bt);
            } else if (bt(x, cands_.front())) {
                std::pop_heap(cands_.begin(), cands_.end(), bt);
                cands_.back() = x;
                std::push_heap(cands_.begin(), cands_.end(), bt);
            }
        }
        std::sort(cands_.begin(), cands_.end(), bt);
    } else {
        cands_.reserve(n_vocab);
        for (int32_t i = 0; i < n_vocab; ++i) {
            const float v = value_at(logits, i);
            if (v != neg_inf) cands_.push_back({v, i, 0.0});
        }
        if (top_k > 0 && static_cast<size_t>(top_k) < cands_.size()) {
            std::nth_element(cands_.begin(), cands_.begin() + top_k, cands_.end(), bt);
            cands_.resize(top_k);
            std::sort(cands_.begin(), cands_.end(), bt);  // a unique order for the sums below
        }
    }
    if (cands_.empty()) throw error("all " + std::to_string(n_vocab) + " logits are -inf (every token masked)");
    const size_t k = cands_.size();

    // Softmax weights of the top_k set (temperature applied), their sum, and the min_p set:
    // p_i >= min_p * p_max  <=>  w_i >= min_p, since w_max = 1.
    float mx = neg_inf;
    for (const cand & x : cands_) mx = std::max(mx, x.logit);
    const double inv_t = 1.0 / static_cast<double>(params_.temperature);
    const double min_p = params_.min_p;
    double z = 0.0;
    size_t n_min_p = 0;
    for (cand & x : cands_) {
        x.w = std::exp((static_cast<double>(x.logit) - static_cast<double>(mx)) * inv_t);
        z += x.w;
        if (x.w >= min_p) ++n_min_p;
    }
    if (n_min_p < k) {  // move the min_p set to the front (it is the n_min_p best)
        size_t out = 0;
        for (size_t i = 0; i < k; ++i) {
            if (cands_[i].w >= min_p) std::swap(cands_[out++], cands_[i]);
        }
    }

    // top_p: the shortest best-first prefix with mass >= top_p * z; never past the min_p set.
    size_t n_top_p = k;
    if (params_.top_p < 1.0f) {
        const size_t j = select_mass(0, n_min_p, static_cast<double>(params_.top_p) * z, false);
        if (j != SIZE_MAX) n_top_p = j + 1;
    }

    n_kept_ = std::min({k, n_min_p, n_top_p});
    if (n_kept_ == k) return z;
    double zk = 0.0;
    for (size_t i = 0; i < n_kept_; ++i) zk += cands_[i].w;
    return zk;
}

int32_t sampler::sample(const float * logits, int32_t n_vocab, const std::vector<int32_t> & history) {
    if (logits == nullptr || n_vocab <= 0) throw error("sample: no logits (n_vocab = " + std::to_string(n_vocab) + ")");
    auto guard = make_scope_exit([this] { clear_counts(); });
    count_history(n_vocab, history);
    if (params_.is_greedy()) return argmax(logits, n_vocab);

    const double z = prepare(logits, n_vocab);
    const size_t j = select_mass(0, n_kept_, uniform() * z, true);
    if (j != SIZE_MAX) return cands_[j].id;
    // Rounding left the total just short of the target: the worst kept token with mass.
    const better bt;
    size_t worst = 0;
    for (size_t i = 1; i < n_kept_; ++i) {
        if (cands_[i].w > 0.0 && bt(cands_[worst], cands_[i])) worst = i;
    }
    return cands_[worst].id;
}

std::vector<std::pair<int32_t, float>> sampler::distribution(const float * logits, int32_t n_vocab,
                                                             const std::vector<int32_t> & history) const {
    if (logits == nullptr || n_vocab <= 0) {
        throw error("distribution: no logits (n_vocab = " + std::to_string(n_vocab) + ")");
    }
    auto guard = make_scope_exit([this] { clear_counts(); });
    count_history(n_vocab, history);
    std::vector<std::pair<int32_t, float>> out;
    if (params_.is_greedy()) {
        out.emplace_back(argmax(logits, n_vocab), 1.0f);
        return out;
    }
    const double z = prepare(logits, n_vocab);
    std::sort(cands_.begin(), cands_.begin() + static_cast<std::ptrdiff_t>(n_kept_), better{});
    out.reserve(n_kept_);
    for (size_t i = 0; i < n_kept_; ++i) {
        const float p = static_cast<float>(cands_[i].w / z);
        if (p <= 0.0f) break;  // sorted: the rest underflowed too
        out.emplace_back(cands_[i].id, p);
    }
    return out;
}

}  // namespace lucebox
