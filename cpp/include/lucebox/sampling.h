// Token sampling on host float logits: penalties, greedy or temperature / top-k / top-p / min-p,
// then one draw from a deterministic RNG. No ggml dependency.
//
// Order of the transforms (the same in sample() and distribution()):
//   1. penalties, for each id that occurs c > 0 times in the last penalty_last_n history tokens:
//        repetition (HF / llama.cpp): logit > 0 ? logit / rp : logit * rp
//        then frequency and presence (OpenAI): logit -= c * frequency_penalty + presence_penalty
//   2. temperature == 0: greedy, the argmax of the penalized logits, lowest id on ties. Stop.
//   3. top_k: keep the k largest penalized logits (ties broken by lower id).
//   4. temperature: logits / T, softmax over the kept tokens (max subtracted, double accumulation).
//   5. top_p: keep the shortest prefix (descending prob) whose mass is >= top_p.
//   6. min_p: keep tokens with prob >= min_p * max prob.
//   7. renormalize and draw by inverse CDF over the kept tokens sorted by descending prob
//      (ascending id on ties), with one uniform from the sampler's RNG.
// Cost is O(n_vocab) on every path: top_k uses a k-heap (nth_element for k > 4096), top_p and the
// inverse CDF use a weighted quickselect over the kept set instead of sorting it; only
// distribution() sorts the kept set (all of it when nothing truncates).
// Temperature is applied before top_p / min_p, as in HF transformers, vLLM and SGLang (the
// settings Qwen recommends are tuned for that order). Note that llama.cpp's default chain applies
// temperature after min_p, so its top_p / min_p see T = 1 probabilities.
//
// -inf logits mark masked tokens (probability 0). NaN or +inf logits throw lucebox::error.
//
// Determinism: the RNG is xoshiro256** seeded through splitmix64, and every ordering uses a strict
// total order (logit desc, id asc), so a seed gives the same tokens on every platform (up to libm
// exp() rounding). sample() in greedy mode draws nothing; otherwise it draws exactly one uniform.
//
// A sampler holds scratch buffers and RNG state: one sampler per sequence, not shared between
// threads (distribution() is const but uses the same scratch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace lucebox {

struct sampling_params {
    float temperature = 0.0f;         // 0 => greedy (argmax; ties -> lowest id)
    int32_t top_k = 0;                // 0 => off
    float top_p = 1.0f;               // 1 => off; in (0, 1]
    float min_p = 0.0f;               // 0 => off; in [0, 1)
    float presence_penalty = 0.0f;    // OpenAI: subtracted once for every id present in the window
    float frequency_penalty = 0.0f;   // OpenAI: subtract count * penalty
    float repetition_penalty = 1.0f;  // HF / llama.cpp: logit > 0 -> logit / rp, else logit * rp
    int32_t penalty_last_n = 64;      // history window for penalties (0 => none, -1 => whole history)
    uint64_t seed = 0;

    // Throws config_error naming the field and its allowed range.
    void validate() const;
    // temperature == 0 (penalties still apply before the argmax).
    bool is_greedy() const { return temperature == 0.0f; }
    // Any penalty that changes logits (and a non-empty window).
    bool has_penalties() const;
};

class sampler {
  public:
    explicit sampler(const sampling_params & p);  // validates

    const sampling_params & params() const { return params_; }

    // Applies penalties from `history`, then greedy or top_k -> temperature -> top_p -> min_p, and
    // draws one token. History ids must lie in [0, n_vocab).
    int32_t sample(const float * logits, int32_t n_vocab, const std::vector<int32_t> & history);

    // The final distribution sample() draws from, as (id, prob) pairs sorted by descending prob
    // (ascending id on ties), probs > 0 and summing to 1. Greedy: {(argmax, 1)}.
    std::vector<std::pair<int32_t, float>> distribution(const float * logits, int32_t n_vocab,
                                                        const std::vector<int32_t> & history) const;

    // A uniform in [0, 1) from this sampler's RNG (53 random bits).
    double uniform();
    void reseed(uint64_t seed);

  private:
    struct cand {
        float logit;  // penalized, before temperature
        int32_t id;
        double w;     // exp((logit - max) / T), filled by prepare()
    };

    // Counts the penalty window into counts_ (ids recorded in touched_).
    void count_history(int32_t n_vocab, const std::vector<int32_t> & history) const;
    void clear_counts() const;
    float penalized(float logit, int32_t count) const;
    float value_at(const float * logits, int32_t i) const;  // penalized logit, checked
    int32_t argmax(const float * logits, int32_t n_vocab) const;
    // Leaves the kept set (after top_k, top_p, min_p) in cands_[0, n_kept_), unordered, and
    // returns its normalizer.
    double prepare(const float * logits, int32_t n_vocab) const;
    // Weighted quickselect: the index j in [lo, hi) where the mass of the candidates of [lo, hi)
    // taken best-first first reaches `target` (>= target, or > target if strict), rearranging so
    // that [lo, j] are the best of [lo, hi); SIZE_MAX if the whole range does not reach it.
    size_t select_mass(size_t lo, size_t hi, double target, bool strict) const;

    uint64_t next_u64();

    sampling_params params_;
    uint64_t s_[4] = {0, 0, 0, 0};

    mutable std::vector<int32_t> counts_;   // n_vocab, all zero between calls
    mutable std::vector<int32_t> touched_;  // ids with counts_ > 0
    mutable std::vector<cand> cands_;
    mutable size_t n_kept_ = 0;
};

}  // namespace lucebox
