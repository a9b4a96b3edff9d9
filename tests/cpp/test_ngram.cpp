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

// The reference implementation: scan every earlier end position of the context (and of `ref`),
// take the longest match (capped at max_n), the most recent among equals, among the `cands` most
// recent occurrences of the last min_n tokens; the reference wins ties and is skipped where its
// match ends at its last token.
struct found {
    size_t end = 0, len = 0;
};
found scan(const toks & seq, size_t limit, const toks & s, size_t end, uint32_t min_n, uint32_t max_n,
           uint32_t cands) {
    found best;
    size_t seen = 0;
    for (size_t p = limit; p-- > 0 && seen < cands;) {
        size_t len = 0;
        while (len < max_n && len <= p && len <= end && seq[p - len] == s[end - len]) ++len;
        if (len < min_n) continue;
        ++seen;
        if (len > best.len) best = {p, len};
        if (len == max_n) break;
    }
    return best;
}

toks reference(const toks & ctx, int32_t last, uint32_t max, uint32_t min_n, uint32_t max_n, uint32_t cands,
               const toks & ref = {}) {
    toks s = ctx;
    s.push_back(last);
    const size_t end = s.size() - 1;
    if (end < min_n) return {};
    found r = scan(ref, ref.size(), s, end, min_n, max_n, cands);
    if (r.end + 1 >= ref.size()) r = {};
    const found c = scan(s, end, s, end, min_n, max_n, cands);
    const bool from_ref = r.len > 0 && r.len >= c.len;
    const found m = from_ref ? r : c;
    size_t n = 3;  // proposals: the match's length rounded up to a verify width of 4, 8 or 16
    while (n < m.len && n < 15) n = 2 * n + 1;
    n = std::min<size_t>(n, max);
    toks out;
    for (size_t i = 0; m.len > 0 && i < n; ++i) {
        if (from_ref) {
            if (m.end + 1 + i >= ref.size()) break;
            out.push_back(ref[m.end + 1 + i]);
        } else {
            out.push_back(s[m.end + 1 + i]);
            s.push_back(out.back());
        }
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
        toks ctx, ref;
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
            if (rng() % 8 == 0) {  // a new reference (a prediction), sometimes none
                ref.clear();
                for (uint32_t i = 0, len = rng() % 3 ? rng() % 40 : 0; i < len; ++i) ref.push_back(int32_t(rng() % vocab));
                p.set_reference(ref);
            }
            const int32_t last = int32_t(rng() % vocab);
            const uint32_t max = rng() % 20;
            CHECK(p.propose(ctx, last, max) == reference(ctx, last, max, min_n, max_n, cands, ref));
            CHECK(p.indexed() == ctx.size());
        }
    }
}

TEST_CASE(a_reference_is_proposed_from_where_it_matches) {
    ngram_proposer p(opts(3, 16));
    // the context ends with "1 2" + last 3; the reference (a prediction) holds "1 2 3 40 41 42 ..."
    const toks ref{7, 1, 2, 3, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49};
    p.set_reference(ref);
    const toks ctx{9, 9, 1, 2};
    CHECK((p.propose(ctx, 3, 15) == toks{40, 41, 42}) && p.from_reference());  // a match of 3: width 4
    // the context matches further back ("5 1 2 3") than the reference: the context's continuation
    const toks ctx2{5, 1, 2, 3, 60, 61, 5, 1, 2};
    p.sync(ctx2);
    CHECK((p.propose(ctx2, 3, 15) == toks{60, 61, 5, 1, 2, 3, 60}) && !p.from_reference());  // 4: width 8
    // a long run of the reference proposes 15, and stops at its end
    const toks ctx3{7, 1, 2, 3, 40, 41, 42, 43, 44, 45, 46};
    p.sync(ctx3);
    CHECK((p.propose(ctx3, 47, 15) == toks{48, 49}) && p.from_reference());
    // the match at the reference's very end: nothing follows there, the context is used
    p.set_reference(toks{1, 2, 3});
    p.sync(ctx);
    CHECK(p.propose(ctx, 3, 15).empty() && !p.from_reference());
}

TEST_CASE(bad_sizes_are_config_errors) {
    CHECK_THROWS(ngram_proposer(opts(0, 4)), lucebox::config_error, "min_n");
    CHECK_THROWS(ngram_proposer(opts(5, 4)), lucebox::config_error, "max_n");
    CHECK_THROWS(ngram_proposer(opts(2, 4, 0)), lucebox::config_error, "max_candidates");
}

TEST_MAIN()
