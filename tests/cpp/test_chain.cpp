// Greedy chain acceptance and commit planning for every accept length.
#include <set>

#include "check.h"
#include "spec/chain.h"

using namespace lucebox::spec;

namespace {
// verified = [last, d1..d(n-1)]; the target agrees with the first `a` proposals.
void make(uint32_t n, uint32_t a, std::vector<int32_t> & verified, std::vector<int32_t> & target) {
    verified = {100};
    target.clear();
    for (uint32_t i = 1; i < n; ++i) verified.push_back(200 + int32_t(i));
    for (uint32_t i = 0; i < n; ++i) target.push_back(i < a ? verified[i + 1] : 900 + int32_t(i));
}
}  // namespace

TEST_CASE(every_accept_length) {
    const uint32_t n = 16;
    for (uint32_t a = 0; a < n; ++a) {
        std::vector<int32_t> v, t;
        make(n, a, v, t);
        CHECK(accept_greedy(v, t) == a);
        const commit_plan p = plan_commit(v, t, a, 1000, nullptr, nullptr);
        CHECK(p.emitted.size() == a + 1);
        CHECK(p.last_kept == a);
        CHECK(p.pending == t[a]);
        CHECK(p.emitted.back() == t[a]);
        for (uint32_t j = 0; j < a; ++j) CHECK(p.emitted[j] == v[j + 1]);
        CHECK(!p.stopped && !p.cancelled);
    }
}

TEST_CASE(budget_cuts_the_step) {
    std::vector<int32_t> v, t;
    make(16, 10, v, t);
    const commit_plan p = plan_commit(v, t, 10, 3, nullptr, nullptr);
    CHECK(p.emitted.size() == 3);
    CHECK(p.last_kept == 2);          // last, d1, d2 evaluated and kept
    CHECK(p.pending == v[3]);         // d3 emitted, evaluated next step
}

TEST_CASE(stop_token) {
    std::vector<int32_t> v, t;
    make(16, 5, v, t);
    const std::set<int32_t> stops{v[3]};
    const commit_plan p = plan_commit(v, t, 5, 100, [&](int32_t x) { return stops.count(x) > 0; }, nullptr);
    CHECK(p.stopped);
    CHECK(p.emitted.size() == 2);  // d1, d2
    CHECK(p.last_kept == 2);       // last, d1, d2 committed; the stop token is not
    CHECK(p.pending == -1);
    // stop as the very first candidate: only `last` is committed
    const commit_plan q = plan_commit(v, t, 5, 100, [&](int32_t x) { return x == v[1]; }, nullptr);
    CHECK(q.stopped && q.emitted.empty() && q.last_kept == 0);
}

TEST_CASE(cancel_from_callback) {
    std::vector<int32_t> v, t;
    make(16, 7, v, t);
    int seen = 0;
    const commit_plan p = plan_commit(v, t, 7, 100, nullptr, [&](int32_t) { return ++seen < 4; });
    CHECK(p.cancelled);
    CHECK(p.emitted.size() == 4);
    CHECK(p.last_kept == 3);
    CHECK(p.pending == v[4]);
}

TEST_MAIN()
