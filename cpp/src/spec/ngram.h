// Draftless proposals ("prompt lookup" / n-gram speculation): the tokens that followed an earlier
// occurrence of the context's last tokens: of the occurrences of its last `min_n` tokens (the most
// recent `max_candidates`), the one whose match extends furthest back (up to `max_n` tokens; the
// most recent among equals). Text that repeats its context (code edits, quotations, structured
// data) is proposed whole; elsewhere there is usually no match and the step is a plain one. Pure
// C++ over token ids, unit-tested in tests/cpp/test_ngram.cpp; the engine verifies the proposals
// as a chain (spec "ngram", and "auto" without a draft).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace lucebox::spec {

class ngram_proposer {
  public:
    struct options {
        uint32_t min_n = 3;            // shortest match proposed from (shorter ones match by chance)
        uint32_t max_n = 16;           // longest match measured when choosing among occurrences
        uint32_t max_candidates = 64;  // occurrences compared per proposal
    };

    explicit ngram_proposer(const options & opt);  // 1 <= min_n <= max_n <= 1024, candidates >= 1
    ngram_proposer() : ngram_proposer(options()) {}

    // Makes the index that of `tokens` (the part shared with the indexed context is kept; the rest
    // is dropped and the new tokens indexed). O(context) for the comparison: once per generation.
    void sync(const std::vector<int32_t> & tokens);

    // Up to `max` proposals after the sequence tokens + [last] (tokens: the committed context,
    // last: the token to be verified first). Between syncs the context may only grow: the tokens
    // past the indexed ones are indexed (a context shorter than the index is synced first).
    std::vector<int32_t> propose(const std::vector<int32_t> & tokens, int32_t last, uint32_t max);

    size_t indexed() const { return seq_.size(); }

  private:
    static constexpr uint32_t NONE = UINT32_MAX;
    void append(const std::vector<int32_t> & tokens);  // indexes tokens[indexed()..]
    uint64_t hash_at(size_t end) const;  // of the min_n tokens of seq_ ending at `end`

    options opt_;
    std::vector<int32_t> seq_;    // the indexed context (then, during propose, + last + proposals)
    std::vector<uint32_t> prev_;  // per end position: the previous end of the same min_n tokens' hash
    std::unordered_map<uint64_t, uint32_t> latest_;  // hash -> the most recent end position
};

}  // namespace lucebox::spec
