// Token sampling on host float logits: penalties, greedy or temperature / top-k / top-p / min-p,
// then one draw from a deterministic RNG. No ggml dependency.
//
// Order of the transforms (the same in sample() and distribution()):
//   0. logit_bias: logit += bias for each listed id (as llama.cpp's chain, before the penalties)
//   1. penalties, for each id that occurs c > 0 times in the last penalty_last_n history tokens:
//        repetition (HF / llama.cpp): logit > 0 ? logit / rp : logit * rp
//        then frequency and presence (OpenAI): logit -= c * frequency_penalty + presence_penalty
//   2. temperature == 0: greedy, the argmax of the penalized logits, lowest id on ties. Stop.
//   3. top_k: keep the k largest penalized logits (ties broken by lower id).
//   4. temperature: logits / T, softmax over the kept tokens (max subtracted, double accumulation;
//      exp from a 2048-entry table and a 4th-order polynomial, relative error < 3e-10).
//   5. top_p: keep the shortest prefix (descending prob) whose mass is >= top_p.
//   6. min_p: keep tokens with prob >= min_p * max prob. Tokens whose prob underflows to 0 are
//      dropped too.
//   7. renormalize and draw by inverse CDF over the kept tokens sorted by descending prob
//      (ascending id on ties), with one uniform from the sampler's RNG.
// Cost is O(n_vocab) on every path: top_k uses a k-heap (nth_element for k > 4096); without top_k,
// top_p, min_p and the inverse CDF work on a histogram of probability mass over logit buckets and
// sort only the one bucket where the mass crosses its target. distribution() sorts the whole kept
// set: all finite tokens when nothing truncates (~30 ms at 248k; ~0.2 ms with top_k).
// Temperature is applied before top_p / min_p, as in HF transformers, vLLM and SGLang (the
// settings Qwen recommends are tuned for that order). Note that llama.cpp's default chain applies
// temperature after min_p, so its top_p / min_p see T = 1 probabilities.
//
// -inf logits mark masked tokens (probability 0). NaN or +inf logits throw lucebox::error.
//
// A token_constraint (a grammar: structured outputs) masks the raw logits before all of the above:
// the ids it does not allow are -inf, so every transform and draw sees only allowed ids.
//
// Determinism: the RNG is xoshiro256** seeded through splitmix64, and every ordering uses a strict
// total order (logit desc, id asc), so a seed gives the same tokens on every platform (up to libm
// exp() rounding of the table entries). sample() in greedy mode draws nothing; otherwise it draws exactly one uniform.
//
// A sampler holds scratch buffers and RNG state: one sampler per sequence, not shared between
// threads (distribution() is const but uses the same scratch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
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
    // OpenAI's logit_bias: (id, bias) added to the raw logit before the penalties; ids distinct,
    // biases in [-100, 100] (-100 in practice bans a token). Ids are checked against the vocabulary
    // when rows are sampled (session::generate checks them first).
    std::vector<std::pair<int32_t, float>> logit_bias;

    // Throws config_error naming the field and its allowed range.
    void validate() const;
    // temperature == 0 (penalties still apply before the argmax).
    bool is_greedy() const { return temperature == 0.0f; }
    // Any penalty or bias that changes logits (penalties: with a non-empty window).
    bool has_penalties() const;
    bool has_window_penalties() const;  // presence / frequency / repetition with a non-empty window
};

// A subset of one row's logits, selected on the device so that only a few numbers cross to the
// host: the row's top-C raw logits and the raw logits of `extra` ids (the penalty window), in any
// order, duplicates allowed. `floor` bounds the rest: every id outside the subset has a raw logit
// <= floor. The sampler decides from the subset alone when that is exact (see logit_row).
struct candidate_row {
    std::vector<int32_t> ids;
    std::vector<float> logits;
    float floor = 0.0f;
    // log of the sum of exp(logit) over the whole row (the softmax normalizer), when the device was
    // asked for it (logprobs); NaN otherwise.
    float log_norm = std::numeric_limits<float>::quiet_NaN();
};

// One row as the sampler takes it: optional device candidates, and the full row on demand.
// With candidates, greedy-with-penalties and top_k (0 < top_k) sampling are decided from the subset
// when every penalized id is in it (the caller puts the whole window in `extra`) and the k-th best
// penalized candidate is strictly above `floor`: then no outside id can enter the kept set, and
// the kept set, its order and every weight are those of the full row, so the same seed draws the
// same token. Otherwise (top_k off, or the subset cannot decide) `full` is called and the full
// path runs; nothing is drawn before that choice.
struct logit_row {
    const candidate_row * candidates = nullptr;
    std::function<const float *()> full;
};

// Log probabilities of an emitted token under the model's own distribution: the softmax of the raw
// logits (no penalties, temperature, top-k/p or min-p), as OpenAI's and llama.cpp's logprobs.
struct token_logprobs {
    float logprob = 0.0f;                         // log p(token); -inf for a masked token
    std::vector<std::pair<int32_t, float>> top;   // the n most likely ids and their log p, best first (lower id on ties)
};
constexpr uint32_t MAX_TOP_LOGPROBS = 20;  // top alternatives a token can report (OpenAI's limit)

// logprobs of `token` in `row` with its n_top (<= MAX_TOP_LOGPROBS) best alternatives. Reads only the
// candidates when they decide it exactly (their log_norm is known, `token` is among them, and the
// n_top-th best candidate is strictly above `floor`); otherwise the full row. Throws lucebox::error on
// a NaN or +inf logit or a token outside [0, n_vocab).
token_logprobs logprobs_of(const logit_row & row, int32_t token, uint32_t n_top, int32_t n_vocab);

// Which tokens a generation may emit next: a grammar (structured outputs), say. A sampler given one
// asks it before every token it chooses and reports the choice, so plain and speculative steps
// alike emit only allowed tokens: a speculative walk chooses its tokens in emission order (row j's
// history ends with the tokens chosen at rows < j), so the constraint sees them in that order too.
// Implementations keep their own state (e.g. a parser) and are used from one thread at a time.
class token_constraint {
  public:
    virtual ~token_constraint() = default;
    // Sets bit (id % 32) of words[id / 32] for each id allowed after the tokens accepted so far.
    // The n_words = ceil(n_vocab / 32) words arrive zeroed; bits past n_vocab are ignored. Allowing
    // no id is an error (the sampler throws).
    virtual void allowed(uint32_t * words, size_t n_words) = 0;
    // The sampler chose `token` (an allowed id) next.
    virtual void accept(int32_t token) = 0;
};

class sampler {
  public:
    // Validates p. With a constraint, every token sample() (and so accept_or_resample*) chooses is
    // drawn from the allowed ids only and reported to it; distribution() ignores it.
    explicit sampler(const sampling_params & p, std::shared_ptr<token_constraint> constraint = nullptr);

    const sampling_params & params() const { return params_; }

    // Applies penalties from `history`, then greedy or top_k -> temperature -> top_p -> min_p, and
    // draws one token. History ids must lie in [0, n_vocab).
    int32_t sample(const float * logits, int32_t n_vocab, const std::vector<int32_t> & history);
    int32_t sample(const logit_row & row, int32_t n_vocab, const std::vector<int32_t> & history);

    // The final distribution sample() draws from, as (id, prob) pairs sorted by descending prob
    // (ascending id on ties), probs > 0 and summing to 1. Greedy: {(argmax, 1)}.
    std::vector<std::pair<int32_t, float>> distribution(const float * logits, int32_t n_vocab,
                                                        const std::vector<int32_t> & history) const;

    // One row of speculative sampling for a point-mass proposal, coupled: the row's token is drawn
    // exactly as sample() would draw it (one uniform, whether or not anything is accepted), and
    // `accepted` says whether it equals `proposed`. So `proposed` is accepted with its probability
    // p under sample()'s distribution, as in rejection sampling with a residual draw, and a
    // speculative generation consumes the generator as plain sampling does: with the same seed and
    // the same rows it emits the same tokens. Costs one pass over the logits (no sort), unlike
    // distribution(). Greedy: accepted iff proposed is the argmax.
    int32_t accept_or_resample(const float * logits, int32_t n_vocab, const std::vector<int32_t> & history,
                               int32_t proposed, bool & accepted);
    int32_t accept_or_resample(const logit_row & row, int32_t n_vocab, const std::vector<int32_t> & history,
                               int32_t proposed, bool & accepted);

    // Several point-mass proposals on one row (the children of a tree node): the row's token drawn
    // as sample() draws it (one uniform), `index` the position of the first proposal equal to it, or
    // -1. proposals[j] is thus accepted with probability p(proposals[j]) (0 for a repeat of an
    // earlier id). One proposal is accept_or_resample; no proposal is sample(). Greedy: the first
    // proposal equal to the argmax, else the argmax (index -1).
    int32_t accept_or_resample_among(const logit_row & row, int32_t n_vocab, const std::vector<int32_t> & history,
                                     const std::vector<int32_t> & proposals, int & index);

    // Candidates (top-C) the device should return for these parameters so that rows are usually
    // decided from the subset: 0 when the subset can never decide (top_k off and not greedy, or
    // top_k too large to be worth it).
    int32_t wanted_candidates() const;
    bool constrained() const { return constraint_ != nullptr; }
    // The distinct ids whose logits the penalties or biases change after `history`: the logit_bias
    // ids and those of its last penalty_last_n tokens (all of them for -1), sorted. Empty without
    // penalties or biases.
    std::vector<int32_t> penalty_ids(const std::vector<int32_t> & history) const;

    // A uniform in [0, 1) from this sampler's RNG (53 random bits).
    double uniform();
    void reseed(uint64_t seed);

  private:
    struct cand {
        float logit;  // penalized, before temperature
        int32_t id;
        double w;     // exp((logit - max) / T)
    };
    // Buckets of the full-vocabulary path: width 1/32 of a nat of (max - logit) / T, over 64 nats,
    // then one bucket for everything below (weights < 1.7e-28).
    static constexpr int n_buckets = 64 * 32;
    static constexpr uint16_t masked_bucket = 0xffff;  // -inf logits

    // Counts the penalty window into counts_ and sets bias_ from logit_bias (adjusted ids flagged in
    // adjusted_ and recorded in touched_).
    void count_history(int32_t n_vocab, const std::vector<int32_t> & history) const;
    void clear_counts() const;
    float adjusted(int32_t id, float logit) const;  // bias, then penalties (for a flagged id)
    float value_at(const float * logits, int32_t i) const;  // penalized logit, checked (throws)
    float value(const float * logits, int32_t i) const {   // penalized logit, already checked
        const float v = logits[i];
        return touched_.empty() || adjusted_[i] == 0 ? v : adjusted(i, v);
    }
    int32_t argmax(const float * logits, int32_t n_vocab) const;
    double weight_of(float logit) const;
    int bucket_of(float logit) const;
    // The finite tokens of bucket b, with weights, best first, into `out`.
    void gather(const float * logits, int32_t n_vocab, int b, std::vector<cand> & out) const;

    // Runs the chain up to the kept set and returns its normalizer. Two representations:
    //  - top_k path (0 < top_k < n_vocab): cands_[0, n_kept_) sorted best-first, weights filled;
    //  - full-vocabulary path: the kept set is every token at least as good as cut_ (in the order
    //    logit desc, id asc); bucket_mass_ holds per-bucket masses, prefix_mass_ the mass of the
    //    buckets before cut_'s, and cut_bucket_items_ the sorted tokens of cut_'s bucket. Nothing
    //    is sorted but single buckets, so the cost is a few passes over the logits.
    double prepare(const float * logits, int32_t n_vocab) const;
    // The top_k path of prepare() over the ids for_each visits in ascending order.
    // Returns true if a logit was NaN or +inf (before or after penalties).
    template <typename ForEach>
    bool select_top_k(ForEach for_each, int32_t k) const;
    // Sorts the selected candidates, weighs them, applies top_p / min_p; returns the normalizer.
    double finish_sorted() const;
    // The candidate path: false (nothing changed that matters) when the subset cannot decide.
    // Greedy: fills `argmax`; otherwise prepares the sorted path and fills `z`.
    bool prepare_candidates(const candidate_row & row, int32_t n_vocab, double & z, int32_t & argmax) const;
    // Draws from the prepared kept set.
    int32_t draw(const float * logits, int32_t n_vocab, double z);

    uint64_t next_u64();
    // sample() without the constraint.
    int32_t choose(const logit_row & row, int32_t n_vocab, const std::vector<int32_t> & history);
    // `row` with the ids the constraint does not allow now at -inf (candidates at once, the full
    // row when it is read), valid until the next call.
    logit_row constrain(const logit_row & row, int32_t n_vocab);

    sampling_params params_;
    std::shared_ptr<token_constraint> constraint_;
    std::vector<uint32_t> allowed_;        // the constraint's bits for the row being sampled
    candidate_row constrained_cands_;      // a candidate row with disallowed logits at -inf
    std::vector<float> constrained_row_;   // a full row with disallowed logits at -inf
    uint64_t s_[4] = {0, 0, 0, 0};

    mutable std::vector<int32_t> counts_;    // n_vocab, all zero between calls
    mutable std::vector<float> bias_;        // n_vocab, all zero between calls
    mutable std::vector<uint8_t> adjusted_;  // n_vocab: 1 where counts_ or bias_ changes the logit
    mutable std::vector<int32_t> touched_;   // ids with adjusted_ set
    mutable bool sorted_path_ = false;
    mutable std::vector<cand> cands_;       // top_k path
    mutable size_t n_kept_ = 0;
    mutable float max_logit_ = 0.0f;        // full-vocabulary path from here on
    mutable double inv_t_ = 1.0;
    mutable std::vector<double> bucket_mass_;  // n_buckets + 1
    mutable std::vector<uint16_t> bucket_idx_; // per token, masked_bucket for -inf
    mutable cand cut_{0.0f, 0, 0.0};
    mutable int cut_bucket_ = 0;
    mutable double prefix_mass_ = 0.0;
    mutable std::vector<cand> cut_bucket_items_;
    mutable std::vector<cand> scratch_;
    mutable std::vector<std::pair<int32_t, float>> subset_;  // candidate path: (id, raw logit), by id
};

}  // namespace lucebox
