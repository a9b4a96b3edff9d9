// When speculation pays: the policy of spec "auto". Speculative decoding wins only while
//   (tokens committed per speculative step) / (seconds per speculative step) >= 1 / (seconds per plain step);
// a weak draft, a small model (launch-bound steps) or a CPU (a 16-token verify costs several decode
// steps) can make it slower than plain decoding. The policy measures both sides and switches:
//   - a generation starts speculating; after `window` speculative steps it compares the
//     window's committed tokens per step against the cost ratio;
//   - while the plain step cost is unknown it first decodes `probe` tokens plainly to measure it;
//   - after losing, it decodes `plain_run` tokens plainly, then tries speculation again (acceptance
//     changes along a text: a repetitive stretch accepts whole blocks); each further loss in a row
//     doubles the plain run (up to 16x), a win resets it;
//   - the losses in a row are shared by the engine's generations, so after a loss a new generation
//     starts with a plain run instead of paying for a speculative window first.
// Costs are exponential moving averages shared by the engine's generations (`costs`); the first
// step of each kind in a generation is not recorded (it may build and allocate its graph).
// Pure C++ without tensors, unit-tested in tests/cpp/test_policy.cpp.
#pragma once

#include <cstdint>

namespace lucebox::spec {

struct step_costs {
    double spec_step = 0.0;   // seconds per speculative step (draft + verify + commit); 0: unknown
    double plain_step = 0.0;  // seconds per plain step (one token); 0: unknown
    uint32_t losses = 0;      // decisions in a row where speculation lost
};

class adaptive_policy {
  public:
    struct options {
        uint32_t window = 4;      // speculative steps per decision
        uint32_t probe = 2;       // plain steps when the plain cost is unknown (>= 2: the first is not recorded)
        uint32_t plain_run = 64;  // plain steps after speculation lost, before trying again
        double ema = 0.2;         // weight of a new measurement in the shared costs
    };

    adaptive_policy(step_costs & shared, const options & opt);
    explicit adaptive_policy(step_costs & shared) : adaptive_policy(shared, options()) {}

    // Whether the next step speculates (true) or decodes one token plainly (false).
    bool speculate() const { return speculate_; }
    // A speculative step committed `committed` tokens (accepted proposals + 1) in `seconds`.
    void record_spec(uint32_t committed, double seconds);
    // A plain step took `seconds`.
    void record_plain(double seconds);

  private:
    void decide();
    uint32_t plain_run() const;  // the plain run after `shared_.losses` losses in a row
    step_costs & shared_;
    options opt_;
    bool speculate_ = true;
    bool seen_spec_ = false, seen_plain_ = false;  // first step of each kind (not recorded)
    uint32_t window_steps_ = 0, window_committed_ = 0;
    uint32_t plain_left_ = 0;  // plain steps still to take before the next decision
};

}  // namespace lucebox::spec
