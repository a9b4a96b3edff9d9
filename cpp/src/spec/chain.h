// Chain speculative decoding, greedy acceptance: which proposals the target agrees with, and what a
// step commits and emits. Pure functions over token ids (no tensors), unit-tested in tests/cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "lucebox/sampling.h"

namespace lucebox::spec {

// verified = [last, d1 .. d(n-1)] fed to the target; target[i] = the target's greedy choice after
// verified[0..i]. Returns a = the number of accepted proposals: d(i) == target[i-1] for i = 1..a.
uint32_t accept_greedy(const std::vector<int32_t> & verified, const std::vector<int32_t> & target);

// Speculative sampling for a deterministic proposal (the draft's argmax, or a forced token): at
// row i the proposal d(i+1) is accepted with probability p_i(d(i+1)), where p_i is the target's
// sampling distribution (penalties, top-k, temperature, top-p, min-p; the same transforms as plain
// sampling, over the history including the tokens accepted so far). On rejection the token is
// drawn from p_i with d(i+1) removed (renormalized): the residual max(0, p - q) for a point-mass q.
// If every proposal is accepted, the bonus token is drawn from the last row. The emitted tokens
// are therefore distributed exactly as plain sampling from the target.
// row(i): the verify batch's row i as the sampler takes it (device candidates and/or the full
// logits; called once per row the rule reaches). Returns a and fills target[0..a] (target[j] =
// verified[j+1] for j < a; target[a] = the drawn bonus token).
uint32_t accept_sampled(const std::vector<int32_t> & verified, const std::function<logit_row(size_t)> & row,
                        int32_t n_vocab, sampler & smp, std::vector<int32_t> history, std::vector<int32_t> & target);

struct commit_plan {
    uint32_t last_kept = 0;         // verified rows 0..last_kept are committed (always >= row 0)
    std::vector<int32_t> emitted;   // new tokens for the caller, in order
    int32_t pending = -1;           // emitted but not evaluated (the next step's "last"); -1 if none
    bool stopped = false;           // a stop token ended the generation (it is not emitted)
    bool cancelled = false;         // the callback asked to stop
};

// Emits d1..da then target[a] (the bonus token), stopping early at a stop token, after `budget`
// tokens, or when `on_token` returns false. A stop token is not emitted; the token before it is
// committed and nothing is pending. Otherwise the last emitted token is pending and the rows up to
// the one before it are committed.
commit_plan plan_commit(const std::vector<int32_t> & verified, const std::vector<int32_t> & target, uint32_t accepted,
                        uint32_t budget, const std::function<bool(int32_t)> & is_stop,
                        const std::function<bool(int32_t)> & on_token);

}  // namespace lucebox::spec
