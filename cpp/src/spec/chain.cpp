#include "chain.h"

#include "lucebox/errors.h"

namespace lucebox::spec {

uint32_t accept_greedy(const std::vector<int32_t> & verified, const std::vector<int32_t> & target) {
    if (verified.empty() || target.size() != verified.size()) {
        throw error("internal: accept_greedy needs one target choice per verified token");
    }
    uint32_t a = 0;
    while (a + 1 < verified.size() && verified[a + 1] == target[a]) {
        ++a;
    }
    return a;
}

namespace {
// Inverse CDF over `dist` (sorted (id, prob), summing to 1), skipping `excluded` and renormalizing.
int32_t draw(const std::vector<std::pair<int32_t, float>> & dist, double u, int32_t excluded, double excluded_mass) {
    const double total = 1.0 - excluded_mass;
    double target = u * total, acc = 0.0;
    int32_t last_ok = -1;
    for (const auto & [id, prob] : dist) {
        if (id == excluded) {
            continue;
        }
        acc += prob;
        last_ok = id;
        if (target < acc) {
            return id;
        }
    }
    if (last_ok < 0) {
        throw error("internal: empty residual distribution");
    }
    return last_ok;  // rounding: u*total at the very end of the mass
}
}  // namespace

uint32_t accept_sampled(const std::vector<int32_t> & verified, const float * logits, int32_t n_vocab, sampler & smp,
                        std::vector<int32_t> history, std::vector<int32_t> & target) {
    const size_t n = verified.size();
    target.assign(n, -1);
    history.push_back(verified[0]);
    for (size_t i = 0; i < n; ++i) {
        const auto dist = smp.distribution(logits + i * size_t(n_vocab), n_vocab, history);
        if (i + 1 == n) {
            target[i] = draw(dist, smp.uniform(), -1, 0.0);
            return static_cast<uint32_t>(i);
        }
        const int32_t d = verified[i + 1];
        double pd = 0.0;
        for (const auto & [id, prob] : dist) {
            if (id == d) {
                pd = prob;
                break;
            }
        }
        if (smp.uniform() < pd) {
            target[i] = d;
            history.push_back(d);
            continue;
        }
        target[i] = draw(dist, smp.uniform(), d, pd);
        return static_cast<uint32_t>(i);
    }
    return static_cast<uint32_t>(n - 1);
}

commit_plan plan_commit(const std::vector<int32_t> & verified, const std::vector<int32_t> & target, uint32_t accepted,
                        uint32_t budget, const std::function<bool(int32_t)> & is_stop,
                        const std::function<bool(int32_t)> & on_token) {
    if (accepted >= verified.size() || target.size() != verified.size()) {
        throw error("internal: plan_commit with " + std::to_string(accepted) + " accepted of " +
                    std::to_string(verified.size()));
    }
    commit_plan p;
    for (uint32_t j = 0; j <= accepted; ++j) {
        const int32_t tok = j < accepted ? verified[j + 1] : target[accepted];  // == target[j]
        if (is_stop && is_stop(tok)) {
            p.stopped = true;
            p.last_kept = j;  // rows 0..j: everything emitted so far is evaluated
            p.pending = -1;
            return p;
        }
        if (budget == 0) {
            break;
        }
        p.emitted.push_back(tok);
        p.last_kept = j;
        p.pending = tok;
        const bool keep_going = !on_token || on_token(tok);
        if (!keep_going) {
            p.cancelled = true;
            return p;
        }
        if (p.emitted.size() >= budget) {
            return p;
        }
    }
    return p;
}

}  // namespace lucebox::spec
