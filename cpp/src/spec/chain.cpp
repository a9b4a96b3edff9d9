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
