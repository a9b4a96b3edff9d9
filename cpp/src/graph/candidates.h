// Sampling candidates computed on the device: per logits row, the top-C ids and their logits, and
// the logits of a given id list (the penalty window), so that only these numbers, not the whole
// vocabulary row, cross to the host for sampling (sampler::sample with a candidate_row).
#pragma once

#include <cstdint>

#include "ggml.h"

namespace lucebox::graph {

struct candidate_outputs {
    ggml_tensor * extra_ids = nullptr;     // input [n_extra, n_rows] I32 (null when n_extra == 0)
    ggml_tensor * top_ids = nullptr;       // [n_cand, n_rows] I32, in no particular order
    ggml_tensor * top_logits = nullptr;    // [1, n_cand, n_rows] F32: logits at top_ids
    ggml_tensor * extra_logits = nullptr;  // [1, n_extra, n_rows] F32: logits at extra_ids
    // with log_norm: the row's log-sum-exp as row_max + log(sum_exp) (logprobs)
    ggml_tensor * row_max = nullptr;       // [1, 1, n_rows] F32: the row's largest logit
    ggml_tensor * sum_exp = nullptr;       // [1, n_rows] F32: sum of exp(logit - row_max) over the row
};

// logits: [V, n_rows] F32 (already in gf). Adds the selection (and with log_norm the normalizer) to gf
// and marks its results as outputs.
candidate_outputs build_candidates(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * logits, uint32_t n_cand,
                                   uint32_t n_extra, bool log_norm);

}  // namespace lucebox::graph
