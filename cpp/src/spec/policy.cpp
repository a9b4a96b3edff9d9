#include "policy.h"

#include <algorithm>

namespace lucebox::spec {

namespace {
void update(double & avg, double x, double w) { avg = avg == 0.0 ? x : (1.0 - w) * avg + w * x; }
}  // namespace

adaptive_policy::adaptive_policy(step_costs & shared, const options & opt) : shared_(shared), opt_(opt) {
    if (shared_.losses > 0 && shared_.plain_step > 0.0) {
        speculate_ = false;  // speculation lost last time: start with a plain run
        plain_left_ = plain_run();
    }
}

uint32_t adaptive_policy::plain_run() const {
    const uint32_t doublings = shared_.losses > 0 ? std::min<uint32_t>(shared_.losses - 1, 4) : 0;
    return opt_.plain_run << doublings;
}

void adaptive_policy::record_spec(uint32_t committed, double seconds) {
    if (seen_spec_) {
        update(shared_.spec_step, seconds, opt_.ema);
    }
    seen_spec_ = true;
    ++window_steps_;
    window_committed_ += committed;
    if (window_steps_ >= opt_.window) {
        if (shared_.plain_step == 0.0) {
            speculate_ = false;  // measure the other side first
            plain_left_ = opt_.probe;
        } else {
            decide();
        }
    }
}

void adaptive_policy::record_plain(double seconds) {
    if (seen_plain_) {
        update(shared_.plain_step, seconds, opt_.ema);
    }
    seen_plain_ = true;
    if (plain_left_ > 0) {
        --plain_left_;
    }
    if (plain_left_ == 0) {
        if (window_steps_ >= opt_.window && shared_.plain_step > 0.0) {
            decide();  // the window is still there when this was a probe
        } else {
            speculate_ = true;  // a plain run ended: try speculation again
            window_steps_ = window_committed_ = 0;
        }
    }
}

void adaptive_policy::decide() {
    const double per_step = double(window_committed_) / window_steps_;
    const bool spec_wins = shared_.spec_step == 0.0 || per_step * shared_.plain_step >= shared_.spec_step;
    window_steps_ = window_committed_ = 0;
    speculate_ = spec_wins;
    shared_.losses = spec_wins ? 0 : shared_.losses + 1;
    plain_left_ = spec_wins ? 0 : plain_run();
}

}  // namespace lucebox::spec
