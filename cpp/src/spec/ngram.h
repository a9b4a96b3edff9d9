// Draftless proposals ("prompt lookup" / n-gram speculation): the tokens that followed an earlier
// occurrence of the context's last tokens: of the occurrences of its last `min_n` tokens (the most
// recent `max_candidates`), the one whose match extends furthest back (up to `max_n` tokens; the
// most recent among equals). A reference (OpenAI's predicted outputs: the text the client expects,
// such as the file being edited) is searched the same way and preferred where it matches at least
// as far back. Text that repeats its context or the reference (code edits, quotations, structured
// data) is proposed whole; elsewhere there is usually no match. Pure C++ over token ids,
// unit-tested in tests/cpp/test_ngram.cpp; the engine verifies the proposals as a chain (spec
// "ngram", or any generation given a prediction).
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
        uint32_t max_candidates = 64;  // occurrences compared per proposal and sequence
    };

    explicit ngram_proposer(const options & opt);  // 1 <= min_n <= max_n <= 1024, candidates >= 1
    ngram_proposer() : ngram_proposer(options()) {}

    // Makes the context's index that of `tokens` (the part shared with the indexed context is kept;
    // the rest is dropped and the new tokens indexed). O(context) for the comparison: once per generation.
    void sync(const std::vector<int32_t> & tokens);
    // The reference searched besides the context (empty: none).
    void set_reference(const std::vector<int32_t> & reference);

    // Up to `max` proposals after the sequence tokens + [last] (tokens: the committed context,
    // last: the token to be verified first): as many as the match is long, rounded up to a verify
    // width of 4, 8 or 16 (few graph shapes), at most `max`; continued from the reference (up to
    // its end) or the context (a repetition that runs into the context's end continued). Between
    // syncs the context may only grow: the tokens past the indexed ones are indexed (a context
    // shorter than the index is synced first). `from_reference()` tells where the last came from.
    std::vector<int32_t> propose(const std::vector<int32_t> & tokens, int32_t last, uint32_t max);
    bool from_reference() const { return from_reference_; }

    size_t indexed() const { return context_.seq.size(); }

  private:
    static constexpr uint32_t NONE = UINT32_MAX;
    // The occurrences of each min_n tokens' hash in one sequence.
    struct index {
        std::vector<int32_t> seq;
        std::vector<uint32_t> prev;  // per end position: the previous end of the same hash
        std::unordered_map<uint64_t, uint32_t> latest;  // hash -> the most recent end position
        void append(int32_t token, uint32_t min_n);
        void extend(const std::vector<int32_t> & tokens, uint32_t min_n);  // appends tokens[seq.size()..]
        void pop(uint32_t min_n);  // forgets the last position
    };
    struct match {
        size_t end = 0, len = 0;  // the occurrence's last position in its sequence, and the match's length
    };
    static uint64_t hash(const int32_t * last_n, uint32_t n);  // of the n tokens ending at last_n[n - 1]
    // the best occurrence in `ix` of the suffix of s ending at s[end] (below ix.seq.size() only)
    match best_match(const index & ix, const std::vector<int32_t> & s, size_t end) const;

    options opt_;
    index context_;
    index reference_;
    bool from_reference_ = false;
};

}  // namespace lucebox::spec
