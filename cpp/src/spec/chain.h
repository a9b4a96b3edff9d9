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

// Speculative sampling for a deterministic proposal (the draft's argmax, or a forced token),
// coupled: at row i the target's token is drawn exactly as plain sampling draws it (one uniform of
// the session's generator, sampler::accept_or_resample; the same transforms: penalties, top-k,
// temperature, top-p, min-p, over the history including the tokens accepted so far), and the
// proposal d(i+1) is accepted iff it is that token (probability p_i(d(i+1)), as rejection sampling
// with a residual draw accepts it). The first row that differs ends the step with its drawn token;
// if every proposal is accepted, the bonus token is drawn from the last row. The emitted tokens are
// therefore the plain sampled ones: the same seed gives the same tokens with or without a draft,
// whatever the proposals and wherever spec "auto" takes plain steps.
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
