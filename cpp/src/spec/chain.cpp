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

uint32_t accept_sampled(const std::vector<int32_t> & verified, const std::function<logit_row(size_t)> & row,
                        int32_t n_vocab, sampler & smp, std::vector<int32_t> history, std::vector<int32_t> & target) {
    const size_t n = verified.size();
    target.assign(n, -1);
    history.push_back(verified[0]);
    for (size_t i = 0; i < n; ++i) {
        const logit_row r = row(i);
        if (i + 1 == n) {
            target[i] = smp.sample(r, n_vocab, history);  // bonus after full acceptance
            return static_cast<uint32_t>(i);
        }
        bool accepted = false;
        target[i] = smp.accept_or_resample(r, n_vocab, history, verified[i + 1], accepted);
        if (!accepted) {
            return static_cast<uint32_t>(i);
        }
        history.push_back(verified[i + 1]);
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
