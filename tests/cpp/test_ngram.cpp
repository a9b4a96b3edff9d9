// Draftless n-gram proposals (spec/ngram.h): what follows an earlier occurrence of the context's end.
#include <algorithm>
#include <random>
#include <vector>

#include "check.h"
#include "lucebox/errors.h"
#include "spec/ngram.h"

using namespace lucebox::spec;
using toks = std::vector<int32_t>;

namespace {
ngram_proposer::options opts(uint32_t min_n, uint32_t max_n, uint32_t cands = 64) {
    ngram_proposer::options o;
    o.min_n = min_n, o.max_n = max_n, o.max_candidates = cands;
    return o;
}

// The reference: scan every earlier end position, take the longest match (capped at max_n), the
// most recent among equals, among the `cands` most recent occurrences of the last min_n tokens.
toks reference(const toks & ctx, int32_t last, uint32_t max, uint32_t min_n, uint32_t max_n, uint32_t cands) {
    toks s = ctx;
    s.push_back(last);
    const size_t end = s.size() - 1;
    size_t best = 0, best_len = 0, seen = 0;
    for (size_t p = end; p-- > 0 && seen < cands;) {
        size_t len = 0;
        while (len < max_n && len <= p && s[p - len] == s[end - len]) ++len;
        if (len < min_n) continue;
        ++seen;
        if (len > best_len) best = p, best_len = len;
        if (len == max_n) break;
    }
    size_t n = 3;  // proposals: the match's length rounded up to a verify width of 4, 8 or 16
    while (n < best_len && n < 15) n = 2 * n + 1;
    n = std::min<size_t>(n, max);
    toks out;
    for (size_t i = 0; best_len > 0 && i < n; ++i) {
        out.push_back(s[best + 1 + i]);
        s.push_back(out.back());
    }
    return out;
}
}  // namespace

TEST_CASE(proposes_what_followed_the_earlier_occurrence) {
    ngram_proposer p(opts(3, 16));
    //            0  1  2  3  4  5  6  7  8  9
    const toks ctx{9, 1, 2, 3, 4, 5, 6, 7, 1, 2};
    CHECK((p.propose(ctx, 3, 15) == toks{4, 5, 6}));  // a match of 3: a verify width of 4
    CHECK((p.propose(ctx, 3, 2) == toks{4, 5}));
    toks longer{9, 1, 2, 3, 4, 5, 6, 7, 8, 0, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 1, 2, 3, 4, 5, 6, 7};
    p.sync(longer);
    CHECK((p.propose(longer, 8, 15) == toks{0, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 1, 2, 3}));  // 16
    CHECK(p.propose(ctx, 3, 0).empty());
    CHECK(p.propose(ctx, 8, 4).empty());                          // "1 2 8" never occurred
    CHECK((p.propose(toks{1, 2}, 3, 4).empty()));                 // shorter than min_n before last
}

TEST_CASE(prefers_the_longest_match_then_the_most_recent) {
    ngram_proposer p(opts(2, 16));
    // "7 1 2" then 50, "8 1 2" then 60, "9 1 2" then 70: the suffix "8 1 2" matches the second longest
    const toks ctx{7, 1, 2, 50, 8, 1, 2, 60, 9, 1, 2, 70, 8, 1};
    CHECK((p.propose(ctx, 2, 1) == toks{60}));
    const toks ctx2{7, 1, 2, 50, 8, 1, 2, 60, 9, 1, 2, 70, 5, 1};
    p.sync(ctx2);                                 // (a rewritten context is synced first)
    CHECK((p.propose(ctx2, 2, 1) == toks{70}));  // all match "1 2" only: the most recent
}

TEST_CASE(a_repetition_is_continued) {
    ngram_proposer p(opts(3, 16));
    const toks ctx{1, 2, 3, 1, 2, 3, 1};
    CHECK((p.propose(ctx, 2, 7) == toks{3, 1, 2, 3, 1, 2, 3}));
    const toks run{5, 5, 5, 5};
    CHECK((p.propose(run, 5, 3) == toks{5, 5, 5}));
}

TEST_CASE(matches_the_reference_on_random_contexts_grown_and_rewritten) {
    std::mt19937 rng(7);
    for (uint32_t trial = 0; trial < 60; ++trial) {
        const uint32_t vocab = 2 + rng() % 6, min_n = 1 + rng() % 4, max_n = min_n + rng() % 12;
        const uint32_t cands = 1 + rng() % 8;
        ngram_proposer p(opts(min_n, max_n, cands));
        toks ctx;
        for (uint32_t step = 0; step < 120; ++step) {
            const uint32_t what = rng() % 10;
            if (what == 0 && !ctx.empty()) {  // a rewritten context (a restore): cut and diverge
                ctx.resize(rng() % ctx.size());
                ctx.push_back(int32_t(rng() % vocab));
                p.sync(ctx);
            } else if (what == 1 && !ctx.empty()) {  // shorter without a sync: propose syncs itself
                ctx.resize(rng() % ctx.size());
            } else {
                const uint32_t grow = rng() % 4;
                for (uint32_t i = 0; i < grow; ++i) ctx.push_back(int32_t(rng() % vocab));
            }
            const int32_t last = int32_t(rng() % vocab);
            const uint32_t max = rng() % 10;
            CHECK(p.propose(ctx, last, max) == reference(ctx, last, max, min_n, max_n, cands));
            CHECK(p.indexed() == ctx.size());
        }
    }
}

TEST_CASE(bad_sizes_are_config_errors) {
    CHECK_THROWS(ngram_proposer(opts(0, 4)), lucebox::config_error, "min_n");
    CHECK_THROWS(ngram_proposer(opts(5, 4)), lucebox::config_error, "max_n");
    CHECK_THROWS(ngram_proposer(opts(2, 4, 0)), lucebox::config_error, "max_candidates");
}

TEST_MAIN()
