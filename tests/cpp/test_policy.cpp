// spec "auto": switching between speculative and plain steps from measured costs.
#include <cmath>

#include "check.h"
#include "spec/policy.h"

using namespace lucebox::spec;

namespace {
// Runs `n` steps with fixed costs; returns how many were speculative.
uint32_t run(adaptive_policy & p, uint32_t n, uint32_t committed, double spec_s, double plain_s) {
    uint32_t spec = 0;
    for (uint32_t i = 0; i < n; ++i) {
        if (p.speculate()) {
            ++spec;
            p.record_spec(committed, spec_s);
        } else {
            p.record_plain(plain_s);
        }
    }
    return spec;
}
}  // namespace

TEST_CASE(weak_draft_falls_back_then_retries) {
    step_costs costs;
    adaptive_policy p(costs);
    CHECK(p.speculate());
    for (int i = 0; i < 4; ++i) p.record_spec(1, 3.0);  // AL 1 at 3x the plain cost
    CHECK(!p.speculate());                              // probe the plain cost
    p.record_plain(1.0);
    CHECK(!p.speculate());
    p.record_plain(1.0);
    CHECK(std::fabs(costs.plain_step - 1.0) < 1e-9 && std::fabs(costs.spec_step - 3.0) < 1e-9);
    CHECK(!p.speculate());                              // lost: a plain run of 64
    for (int i = 0; i < 63; ++i) p.record_plain(1.0);
    CHECK(!p.speculate());
    p.record_plain(1.0);
    CHECK(p.speculate());                               // then speculation is tried again
}

TEST_CASE(strong_draft_keeps_speculating) {
    step_costs costs;
    adaptive_policy p(costs);
    const uint32_t spec = run(p, 200, 8, 2.0, 1.0);  // AL 8 at 2x: 4x faster than plain
    CHECK(spec >= 198);                               // only the probe steps were plain
    CHECK(std::fabs(costs.plain_step - 1.0) < 1e-9);
}

TEST_CASE(break_even_is_measured) {
    step_costs costs{2.5, 1.0};                       // known costs: no probe
    adaptive_policy a(costs);
    CHECK(run(a, 100, 3, 2.5, 1.0) == 100);           // 3 tokens per 2.5 plain steps: speculate
    step_costs costs2{2.5, 1.0};
    adaptive_policy b(costs2);
    CHECK(run(b, 4, 2, 2.5, 1.0) == 4);
    CHECK(!b.speculate());                            // 2 tokens per 2.5: plain
}

TEST_CASE(costs_are_moving_averages_shared_between_generations) {
    step_costs costs;
    {
        adaptive_policy p(costs);
        run(p, 10, 1, 3.0, 1.0);
    }
    const double plain = costs.plain_step;
    adaptive_policy q(costs);                         // a later generation: no probe needed
    for (int i = 0; i < 4; ++i) q.record_spec(1, 3.0);
    CHECK(!q.speculate());
    q.record_plain(5.0);                              // its first plain step is not recorded
    CHECK(costs.plain_step == plain);
    q.record_plain(5.0);
    CHECK(costs.plain_step > plain);
}

TEST_CASE(losses_in_a_row_lengthen_the_plain_runs) {
    step_costs costs{3.0, 1.0};
    adaptive_policy p(costs);
    uint32_t plain_runs[3] = {0, 0, 0};
    for (int round = 0; round < 3; ++round) {
        for (int i = 0; i < 4; ++i) {
            CHECK(p.speculate());
            p.record_spec(1, 3.0);
        }
        while (!p.speculate()) {
            p.record_plain(1.0);
            ++plain_runs[round];
        }
    }
    CHECK(plain_runs[0] == 64 && plain_runs[1] == 128 && plain_runs[2] == 256);
    CHECK(costs.losses == 3);
    for (int i = 0; i < 4; ++i) p.record_spec(16, 3.0);  // a repetitive stretch: speculation wins
    CHECK(p.speculate() && costs.losses == 0);
}

TEST_CASE(a_new_generation_after_a_loss_starts_plain) {
    step_costs costs{3.0, 1.0};
    {
        adaptive_policy p(costs);
        for (int i = 0; i < 4; ++i) p.record_spec(1, 3.0);
        CHECK(!p.speculate() && costs.losses == 1);
    }
    adaptive_policy q(costs);
    CHECK(!q.speculate());
    uint32_t plain = 0;
    while (!q.speculate()) {
        q.record_plain(1.0);
        ++plain;
    }
    CHECK(plain == 64);
    step_costs fresh;
    CHECK(adaptive_policy(fresh).speculate());  // nothing measured: speculate first
}

TEST_MAIN()
