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

// The distinct (id, raw logit) pairs of a candidate row, by id (its extra ids may repeat top ones);
// ids are checked against the vocabulary.
void distinct_by_id(const candidate_row & row, int32_t n_vocab, std::vector<std::pair<int32_t, float>> & out) {
    if (row.ids.size() != row.logits.size()) throw error("internal: candidate ids and logits differ in length");
    out.clear();
    for (size_t j = 0; j < row.ids.size(); ++j) {
        const int32_t id = row.ids[j];
        if (id < 0 || id >= n_vocab) throw error("internal: candidate id " + std::to_string(id) + " out of range");
        out.emplace_back(id, row.logits[j]);
    }
    std::sort(out.begin(), out.end(), [](const auto & a, const auto & b) { return a.first < b.first; });
    out.erase(std::unique(out.begin(), out.end(), [](const auto & a, const auto & b) { return a.first == b.first; }),
              out.end());
}

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
    for (size_t i = 0; i < logit_bias.size(); ++i) {
        const auto & [id, b] = logit_bias[i];
        if (id < 0) {
            throw config_error("sampling logit_bias token id must be >= 0 (got " + std::to_string(id) + ")");
        }
        if (!(b >= -100.0f && b <= 100.0f)) {
            throw config_error("sampling logit_bias of token " + std::to_string(id) + " must be in [-100, 100] (got " +
                               fmt(b) + ")");
        }
        for (size_t j = 0; j < i; ++j) {
            if (logit_bias[j].first == id) {
                throw config_error("sampling logit_bias names token " + std::to_string(id) + " twice");
            }
        }
    }
    if (penalty_last_n < -1) {
        throw config_error("sampling penalty_last_n must be >= -1 (-1 = whole history, 0 = none; got " +
                           std::to_string(penalty_last_n) + ")");
    }
}

bool sampling_params::has_window_penalties() const {
    return penalty_last_n != 0 &&
           (presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f);
}

bool sampling_params::has_penalties() const { return !logit_bias.empty() || has_window_penalties(); }

sampler::sampler(const sampling_params & p, std::shared_ptr<token_constraint> constraint)
    : params_(p), constraint_(std::move(constraint)) {
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
    if (counts_.size() != static_cast<size_t>(n_vocab)) {
        counts_.assign(n_vocab, 0);
        bias_.assign(n_vocab, 0.0f);
        adjusted_.assign(n_vocab, 0);
    }
    for (const auto & [id, b] : params_.logit_bias) {
        if (id < 0 || id >= n_vocab) {
            throw error("logit_bias token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                        std::to_string(n_vocab) + ")");
        }
        bias_[id] = b;
        if (adjusted_[id] == 0) {
            adjusted_[id] = 1;
            touched_.push_back(id);
        }
    }
    if (!params_.has_window_penalties()) return;
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
        ++counts_[id];
        if (adjusted_[id] == 0) {
            adjusted_[id] = 1;
            touched_.push_back(id);
        }
    }
}

void sampler::clear_counts() const {
    for (int32_t id : touched_) {
        counts_[id] = 0;
        bias_[id] = 0.0f;
        adjusted_[id] = 0;
    }
    touched_.clear();
}

float sampler::adjusted(int32_t id, float logit) const {
    float v = logit + bias_[id];
    const int32_t count = counts_[id];
    if (count == 0) return v;
    const float rp = params_.repetition_penalty;
    v = v > 0.0f ? v / rp : v * rp;
    v -= static_cast<float>(count) * params_.frequency_penalty + params_.presence_penalty;
    return v;
}

// ---- greedy ----

float sampler::value_at(const float * logits, int32_t i) const {
    const float v = logits[i];
    if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) bad_logit(v, i);
    if (touched_.empty() || adjusted_[i] == 0) return v;
    const float p = adjusted(i, v);
    if (std::isnan(p) || p == std::numeric_limits<float>::infinity()) {
        throw error("penalties made the logit of id " + std::to_string(i) + " non-finite");
    }
    return p;
}

int32_t sampler::argmax(const float * logits, int32_t n_vocab) const {
    const uint8_t * adj = touched_.empty() ? nullptr : adjusted_.data();
    int32_t best = -1;
    float best_v = -std::numeric_limits<float>::infinity();
    bool bad = false;
    for (int32_t i = 0; i < n_vocab; ++i) {
        float v = logits[i];
        bad |= !(v < std::numeric_limits<float>::infinity());  // NaN or +inf
        if (adj != nullptr && adj[i] != 0) v = value_at(logits, i);
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

namespace {

// exp(-d) for d >= 0 from a table at bucket starts and a 4th-order Taylor polynomial inside the
// bucket (width 1/32: relative error < 3e-10). Much cheaper than libm exp() per token, and libm is
// only used for the 2048 table entries and the far tail (d >= 64).
constexpr double bucket_width = 1.0 / 32.0;

const double * exp_table() {
    static const std::vector<double> t = [] {
        std::vector<double> v(64 * 32);
        for (size_t b = 0; b < v.size(); ++b) v[b] = std::exp(-static_cast<double>(b) * bucket_width);
        return v;
    }();
    return t.data();
}

inline double exp_neg(const double * table, double d, int b, int n_buckets) {
    if (b >= n_buckets) return std::exp(-d);
    const double x = d - b * bucket_width;
    return table[b] * (1.0 - x * (1.0 - x * (0.5 - x * (1.0 / 6.0 - x * (1.0 / 24.0)))));
}

}  // namespace

int sampler::bucket_of(float logit) const {
    // Monotone in the logit (higher logit -> same or lower bucket), so buckets follow the order.
    const double d = (static_cast<double>(max_logit_) - static_cast<double>(logit)) * inv_t_;
    return d < 64.0 ? static_cast<int>(d * 32.0) : n_buckets;
}

double sampler::weight_of(float logit) const {
    const double d = (static_cast<double>(max_logit_) - static_cast<double>(logit)) * inv_t_;
    return exp_neg(exp_table(), d, d < 64.0 ? static_cast<int>(d * 32.0) : n_buckets, n_buckets);
}

void sampler::gather(const float * logits, int32_t n_vocab, int b, std::vector<cand> & out) const {
    out.clear();
    const uint16_t * bi = bucket_idx_.data();
    const uint16_t key = static_cast<uint16_t>(b);
    for (int32_t i = 0; i < n_vocab; ++i) {
        if (bi[i] == key) {
            const float v = value(logits, i);
            out.push_back({v, i, weight_of(v)});
        }
    }
    std::sort(out.begin(), out.end(), better{});
}

template <typename ForEach>
bool sampler::select_top_k(ForEach for_each, int32_t k) const {
    // A heap of the k best so far, worst on top. Ids come in ascending order, so a token whose
    // logit equals the worst kept one loses the tie: `v <= thr` skips it.
    const better bt;
    cands_.clear();
    cands_.reserve(k);
    const uint8_t * adj = touched_.empty() ? nullptr : adjusted_.data();
    float thr = -std::numeric_limits<float>::infinity();
    bool bad = false;
    for_each([&](int32_t i, float v) {
        bad |= !(v < std::numeric_limits<float>::infinity());  // NaN or +inf
        if (adj != nullptr && adj[i] != 0) {
            v = adjusted(i, v);
            bad |= !(v < std::numeric_limits<float>::infinity());
        }
        if (!(v > thr)) return;  // also skips NaN and -inf
        if (cands_.size() < static_cast<size_t>(k)) {
            cands_.push_back({v, i, 0.0});
            std::push_heap(cands_.begin(), cands_.end(), bt);
            if (cands_.size() == static_cast<size_t>(k)) thr = cands_.front().logit;
        } else {
            std::pop_heap(cands_.begin(), cands_.end(), bt);
            cands_.back() = {v, i, 0.0};
            std::push_heap(cands_.begin(), cands_.end(), bt);
            thr = cands_.front().logit;
        }
    });
    return bad;
}

double sampler::finish_sorted() const {
    std::sort(cands_.begin(), cands_.end(), better{});
    max_logit_ = cands_[0].logit;
    double z = 0.0;
    for (cand & c : cands_) {
        c.w = weight_of(c.logit);
        z += c.w;
    }
    const double min_p = params_.min_p;
    const size_t k = cands_.size();
    size_t n = k;
    if (params_.top_p < 1.0f) {  // shortest prefix with mass >= top_p
        const double target = static_cast<double>(params_.top_p) * z;
        double cum = 0.0;
        for (size_t i = 0; i < k; ++i) {
            cum += cands_[i].w;
            if (cum >= target) {
                n = i + 1;
                break;
            }
        }
    }
    size_t n_min_p = 1;  // w >= min_p (w_max = 1), and w > 0
    while (n_min_p < n && cands_[n_min_p].w >= min_p && cands_[n_min_p].w > 0.0) ++n_min_p;
    n_kept_ = std::min(n, n_min_p);
    if (n_kept_ == k) return z;
    double zk = 0.0;
    for (size_t i = 0; i < n_kept_; ++i) zk += cands_[i].w;
    return zk;
}

bool sampler::prepare_candidates(const candidate_row & row, int32_t n_vocab, double & z, int32_t & best) const {
    distinct_by_id(row, n_vocab, subset_);
    auto in_subset = [&](int32_t id) {
        auto it = std::lower_bound(subset_.begin(), subset_.end(), id,
                                   [](const auto & a, int32_t v) { return a.first < v; });
        return it != subset_.end() && it->first == id;
    };
    for (int32_t id : touched_) {
        if (!in_subset(id)) return false;  // a penalized id the device did not return
    }
    auto throw_if_bad = [&] {  // the same errors as value_at() on the full row
        for (const auto & [id, v] : subset_) {
            if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) bad_logit(v, id);
            if (touched_.empty() || adjusted_[id] == 0) continue;
            const float p = adjusted(id, v);
            if (std::isnan(p) || p == std::numeric_limits<float>::infinity()) {
                throw error("penalties made the logit of id " + std::to_string(id) + " non-finite");
            }
        }
    };
    if (params_.is_greedy()) {
        best = -1;
        float best_v = -std::numeric_limits<float>::infinity();
        bool bad = false;
        for (const auto & [id, raw] : subset_) {
            float v = raw;
            bad |= !(v < std::numeric_limits<float>::infinity());
            if (!touched_.empty() && adjusted_[id] != 0) v = adjusted(id, v);
            bad |= !(v < std::numeric_limits<float>::infinity());
            if (v > best_v) {  // ascending ids: the lowest id wins ties, as argmax()
                best_v = v;
                best = id;
            }
        }
        if (bad) throw_if_bad();
        return best >= 0 && best_v > row.floor;
    }
    const int32_t k = params_.top_k;
    if (k <= 0 || k >= n_vocab) return false;
    inv_t_ = 1.0 / static_cast<double>(params_.temperature);
    const bool bad = select_top_k(
        [&](auto && visit) {
            for (const auto & [id, v] : subset_) visit(id, v);
        },
        k);
    if (bad) throw_if_bad();
    // the worst kept candidate must beat every id outside the subset (raw <= floor, no penalty)
    if (cands_.size() < static_cast<size_t>(k) || !(cands_.front().logit > row.floor)) return false;
    sorted_path_ = true;
    z = finish_sorted();
    return true;
}

int32_t sampler::wanted_candidates() const {
    if (params_.is_greedy()) {  // plain greedy: the argmax on the device
        return params_.has_penalties() || constraint_ != nullptr ? 64 : 0;
    }
    if (params_.top_k <= 0 || params_.top_k > 992) return 0;
    int32_t c = 64;  // room for penalties to push some of the top ids below the k-th
    while (c < params_.top_k + 32) c *= 2;
    return c;
}

std::vector<int32_t> sampler::penalty_ids(const std::vector<int32_t> & history) const {
    std::vector<int32_t> ids;
    for (const auto & [id, b] : params_.logit_bias) ids.push_back(id);
    if (params_.has_window_penalties()) {
        const size_t n = history.size();
        const size_t w = params_.penalty_last_n < 0 ? n : static_cast<size_t>(params_.penalty_last_n);
        ids.insert(ids.end(), history.begin() + (n > w ? n - w : 0), history.end());
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    return ids;
}

double sampler::prepare(const float * logits, int32_t n_vocab) const {
    const better bt;
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const int32_t top_k = params_.top_k;
    const double min_p = params_.min_p;
    inv_t_ = 1.0 / static_cast<double>(params_.temperature);

    if (top_k > 0 && top_k < n_vocab) {
        // ---- top_k path: the k best, sorted, then prefix walks. ----
        sorted_path_ = true;
        if (top_k <= 4096) {
            const bool bad = select_top_k(
                [&](auto && visit) {
                    for (int32_t i = 0; i < n_vocab; ++i) visit(i, logits[i]);
                },
                top_k);
            if (bad) {
                for (int32_t i = 0; i < n_vocab; ++i) value_at(logits, i);  // throws naming the first bad id
            }
        } else {
            cands_.clear();
            argmax(logits, n_vocab);  // validates
            cands_.reserve(n_vocab);
            for (int32_t i = 0; i < n_vocab; ++i) {
                const float v = value(logits, i);
                if (v != neg_inf) cands_.push_back({v, i, 0.0});
            }
            if (static_cast<size_t>(top_k) < cands_.size()) {
                std::nth_element(cands_.begin(), cands_.begin() + top_k, cands_.end(), bt);
                cands_.resize(top_k);
            }
        }
        if (cands_.empty()) throw error("all " + std::to_string(n_vocab) + " logits are -inf (every token masked)");
        return finish_sorted();
    }

    // ---- full-vocabulary path: mass histogram over logit buckets. ----
    sorted_path_ = false;
    const int32_t best = argmax(logits, n_vocab);  // validates, throws if all masked
    max_logit_ = value(logits, best);
    bucket_mass_.assign(n_buckets + 1, 0.0);
    bucket_idx_.resize(n_vocab);
    double * mass = bucket_mass_.data();
    uint16_t * bidx = bucket_idx_.data();
    const uint8_t * adj = touched_.empty() ? nullptr : adjusted_.data();
    const double * table = exp_table();
    const double mx = max_logit_;
    const double inv_t = inv_t_;
    cand worst{max_logit_, best, 1.0};  // the worst token with w >= min_p and w > 0
    for (int32_t i = 0; i < n_vocab; ++i) {
        const float v = adj != nullptr && adj[i] != 0 ? adjusted(i, logits[i]) : logits[i];
        if (v == neg_inf) {
            bidx[i] = masked_bucket;
            continue;
        }
        const double d = (mx - static_cast<double>(v)) * inv_t;
        const int b = d < 64.0 ? static_cast<int>(d * 32.0) : n_buckets;
        const double w = exp_neg(table, d, b, n_buckets);
        bidx[i] = static_cast<uint16_t>(b);
        mass[b] += w;
        if (v <= worst.logit && (v < worst.logit || i > worst.id) && w >= min_p && w > 0.0) worst = {v, i, w};
    }
    double z = 0.0;  // summed per bucket, in the order the walks below use
    for (int b = 0; b <= n_buckets; ++b) z += mass[b];
    cut_ = worst;
    cut_bucket_ = -1;

    if (params_.top_p < 1.0f) {  // the token where the best-first mass first reaches top_p * z
        const double target = static_cast<double>(params_.top_p) * z;
        double cum = 0.0;
        for (int b = 0; b <= n_buckets; ++b) {
            if (cum + bucket_mass_[b] < target) {
                cum += bucket_mass_[b];
                continue;
            }
            gather(logits, n_vocab, b, cut_bucket_items_);
            cut_bucket_ = b;
            cand cp = cut_bucket_items_.empty() ? cut_ : cut_bucket_items_.back();
            for (const cand & c : cut_bucket_items_) {
                cum += c.w;
                if (cum >= target) {
                    cp = c;
                    break;
                }
            }
            if (bt(cp, cut_)) cut_ = cp;
            break;
        }
    }

    const int cb = bucket_of(cut_.logit);
    if (cb != cut_bucket_) {
        gather(logits, n_vocab, cb, cut_bucket_items_);
        cut_bucket_ = cb;
    }
    prefix_mass_ = 0.0;
    for (int b = 0; b < cb; ++b) prefix_mass_ += bucket_mass_[b];
    double zl = prefix_mass_;
    for (const cand & c : cut_bucket_items_) {
        zl += c.w;
        if (c.id == cut_.id) break;
    }
    return zl;
}

int32_t sampler::sample(const float * logits, int32_t n_vocab, const std::vector<int32_t> & history) {
    if (logits == nullptr || n_vocab <= 0) throw error("sample: no logits (n_vocab = " + std::to_string(n_vocab) + ")");
    logit_row row;
    row.full = [logits] { return logits; };
    return sample(row, n_vocab, history);
}

int32_t sampler::sample(const logit_row & row, int32_t n_vocab, const std::vector<int32_t> & history) {
    if (n_vocab <= 0) throw error("sample: empty vocabulary");
    if (constraint_ == nullptr) return choose(row, n_vocab, history);
    const int32_t tok = choose(constrain(row, n_vocab), n_vocab, history);
    constraint_->accept(tok);
    return tok;
}

logit_row sampler::constrain(const logit_row & row, int32_t n_vocab) {
    const size_t n_words = (static_cast<size_t>(n_vocab) + 31) / 32;
    allowed_.assign(n_words, 0u);
    constraint_->allowed(allowed_.data(), n_words);
    if (n_vocab % 32 != 0) allowed_.back() &= (1u << (n_vocab % 32)) - 1u;  // bits past the vocabulary
    if (std::all_of(allowed_.begin(), allowed_.end(), [](uint32_t w) { return w == 0; })) {
        throw error("the token constraint allows no token");
    }
    const uint32_t * bits = allowed_.data();
    auto allows = [bits](int32_t id) { return (bits[id >> 5] >> (id & 31)) & 1u; };
    constexpr float masked = -std::numeric_limits<float>::infinity();
    logit_row out;
    if (row.candidates != nullptr) {
        // Disallowed candidates stay in the subset at -inf (a penalized id must be in it to decide);
        // the floor still bounds every id outside it.
        const candidate_row & c = *row.candidates;
        constrained_cands_ = c;
        for (size_t j = 0; j < c.ids.size(); ++j) {
            const int32_t id = c.ids[j];
            if (id >= 0 && id < n_vocab && !allows(id)) constrained_cands_.logits[j] = masked;
        }
        out.candidates = &constrained_cands_;
    }
    out.full = [this, full = row.full, n_vocab, allows] {
        const float * src = full();
        constrained_row_.resize(static_cast<size_t>(n_vocab));
        for (int32_t i = 0; i < n_vocab; ++i) constrained_row_[size_t(i)] = allows(i) ? src[i] : masked;
        return static_cast<const float *>(constrained_row_.data());
    };
    return out;
}

int32_t sampler::choose(const logit_row & row, int32_t n_vocab, const std::vector<int32_t> & history) {
    auto guard = make_scope_exit([this] { clear_counts(); });
    count_history(n_vocab, history);
    double z = 0.0;
    int32_t best = -1;
    if (row.candidates != nullptr && prepare_candidates(*row.candidates, n_vocab, z, best)) {
        return params_.is_greedy() ? best : draw(nullptr, n_vocab, z);
    }
    const float * logits = row.full();
    if (params_.is_greedy()) return argmax(logits, n_vocab);
    z = prepare(logits, n_vocab);
    return draw(logits, n_vocab, z);
}

int32_t sampler::draw(const float * logits, int32_t n_vocab, double z) {
    const double target = uniform() * z;
    double cum = 0.0;
    if (sorted_path_) {
        for (size_t i = 0; i < n_kept_; ++i) {
            cum += cands_[i].w;
            if (cum > target) return cands_[i].id;
        }
        return cands_[n_kept_ - 1].id;  // rounding: the worst kept token (w > 0)
    }
    for (int b = 0; b < cut_bucket_; ++b) {
        if (cum + bucket_mass_[b] <= target) {
            cum += bucket_mass_[b];
            continue;
        }
        gather(logits, n_vocab, b, scratch_);
        for (const cand & c : scratch_) {
            cum += c.w;
            if (cum > target) return c.id;
        }
        for (size_t i = scratch_.size(); i-- > 0;) {  // rounding: the bucket's worst with mass
            if (scratch_[i].w > 0.0) return scratch_[i].id;
        }
    }
    for (const cand & c : cut_bucket_items_) {
        cum += c.w;
        if (cum > target || c.id == cut_.id) return c.id;
    }
    return cut_.id;
}

int32_t sampler::accept_or_resample(const float * logits, int32_t n_vocab, const std::vector<int32_t> & history,
                                    int32_t proposed, bool & accepted) {
    if (logits == nullptr || n_vocab <= 0) {
        throw error("accept_or_resample: no logits (n_vocab = " + std::to_string(n_vocab) + ")");
    }
    logit_row row;
    row.full = [logits] { return logits; };
    return accept_or_resample(row, n_vocab, history, proposed, accepted);
}

int32_t sampler::accept_or_resample(const logit_row & row, int32_t n_vocab, const std::vector<int32_t> & history,
                                    int32_t proposed, bool & accepted) {
    if (n_vocab <= 0) throw error("accept_or_resample: empty vocabulary");
    int index = -1;
    const int32_t tok = accept_or_resample_among(row, n_vocab, history, {proposed}, index);
    accepted = index == 0;
    return tok;
}

int32_t sampler::accept_or_resample_among(const logit_row & row, int32_t n_vocab, const std::vector<int32_t> & history,
                                          const std::vector<int32_t> & proposals, int & index) {
    if (n_vocab <= 0) throw error("accept_or_resample: empty vocabulary");
    for (int32_t d : proposals) {
        if (d < 0 || d >= n_vocab) {
            throw error("accept_or_resample: proposed id " + std::to_string(d) + " is outside the vocabulary");
        }
    }
    // Coupled acceptance: the row's token is the one sample() draws (one uniform, the same inverse
    // CDF; greedy: the argmax), and the first proposal equal to it is accepted. For point-mass
    // proposals that accepts proposals[j] with probability p(proposals[j]) when no earlier proposal
    // matched, as rejection sampling with residual draws does, but every row costs one uniform as a
    // plain step does: a speculative generation emits the tokens plain sampling would with the seed.
    const int32_t tok = sample(row, n_vocab, history);
    index = -1;
    for (size_t j = 0; j < proposals.size(); ++j) {
        if (proposals[j] == tok) {
            index = static_cast<int>(j);
            break;
        }
    }
    return tok;
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
    if (!sorted_path_) {  // every token at least as good as the cut
        const better bt;
        const int cb = cut_bucket_;
        cands_.clear();
        for (int32_t i = 0; i < n_vocab; ++i) {
            const int b = bucket_idx_[i];
            if (b > cb) continue;  // also masked tokens
            const float v = value(logits, i);
            if (b == cb && bt(cut_, cand{v, i, 0.0})) continue;
            cands_.push_back({v, i, weight_of(v)});
        }
        std::sort(cands_.begin(), cands_.end(), bt);
        n_kept_ = cands_.size();
    }
    out.reserve(n_kept_);
    for (size_t i = 0; i < n_kept_; ++i) {
        const float p = static_cast<float>(cands_[i].w / z);
        if (p <= 0.0f) break;  // sorted: the rest underflowed too
        out.emplace_back(cands_[i].id, p);
    }
    return out;
}

namespace {

struct scored {
    float logit;
    int32_t id;
};

// The n best of `items` (ids distinct) in the order logit desc, id asc, into items[0, n).
void keep_best(std::vector<scored> & items, size_t n) {
    n = std::min(n, items.size());
    const better order;
    std::partial_sort(items.begin(), items.begin() + std::ptrdiff_t(n), items.end(), order);
    items.resize(n);
}

// `best`: the n_top best of the row, in any order.
token_logprobs from_best(std::vector<scored> best, float token_logit, double log_norm, uint32_t n_top) {
    token_logprobs out;
    out.logprob = float(double(token_logit) - log_norm);
    keep_best(best, n_top);  // (sorts them)
    for (const scored & s : best) {
        out.top.emplace_back(s.id, float(double(s.logit) - log_norm));
    }
    return out;
}

}  // namespace

token_logprobs logprobs_of(const logit_row & row, int32_t token, uint32_t n_top, int32_t n_vocab) {
    if (token < 0 || token >= n_vocab) {
        throw error("logprobs: token id " + std::to_string(token) + " is outside the vocabulary");
    }
    if (n_top > MAX_TOP_LOGPROBS) {
        throw error("logprobs: " + std::to_string(n_top) + " top alternatives asked, at most " +
                    std::to_string(MAX_TOP_LOGPROBS));
    }
    if (const candidate_row * c = row.candidates; c != nullptr && std::isfinite(c->log_norm)) {
        std::vector<std::pair<int32_t, float>> pairs;
        distinct_by_id(*c, n_vocab, pairs);
        std::vector<scored> subset;  // by id
        subset.reserve(pairs.size());
        for (const auto & [id, logit] : pairs) {
            subset.push_back({logit, id});
        }
        auto it = std::lower_bound(subset.begin(), subset.end(), token,
                                   [](const scored & a, int32_t id) { return a.id < id; });
        for (const scored & s : subset) {
            if (std::isnan(s.logit) || s.logit == std::numeric_limits<float>::infinity()) bad_logit(s.logit, s.id);
        }
        if (it != subset.end() && it->id == token) {
            std::vector<scored> best = subset;
            keep_best(best, n_top);
            // the n_top-th best must beat every id outside the subset
            if (n_top == 0 || (best.size() == n_top && best.back().logit > c->floor)) {
                return from_best(std::move(best), it->logit, double(c->log_norm), n_top);
            }
        }
    }
    const float * logits = row.full();
    float mx = -std::numeric_limits<float>::infinity();
    for (int32_t i = 0; i < n_vocab; ++i) {
        const float v = logits[i];
        if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) bad_logit(v, i);
        mx = std::max(mx, v);
    }
    double sum = 0.0;
    if (mx > -std::numeric_limits<float>::infinity()) {
        for (int32_t i = 0; i < n_vocab; ++i) {
            sum += std::exp(double(logits[i]) - double(mx));
        }
    }
    const double log_norm = double(mx) + std::log(sum);  // every logit -inf: -inf, and all logprobs NaN
    if (!std::isfinite(log_norm)) {
        throw error("logprobs: every logit of the row is -inf");
    }
    std::vector<scored> best;
    if (n_top > 0) {  // a bounded pass keeps memory small: the n_top best seen so far
        const better order;
        for (int32_t i = 0; i < n_vocab; ++i) {
            const scored s{logits[i], i};
            if (best.size() < n_top) {
                best.push_back(s);
                std::push_heap(best.begin(), best.end(), order);
            } else if (order(s, best.front())) {
                std::pop_heap(best.begin(), best.end(), order);
                best.back() = s;
                std::push_heap(best.begin(), best.end(), order);
            }
        }
    }
    return from_best(std::move(best), logits[token], log_norm, n_top);
}

}  // namespace lucebox
