// How the fused gated attention op (attention_step.h) cuts a token's keys into chunks on CUDA, in
// plain C++ for both the graph node (its result holds the chunks' partial sums) and the kernels
// (attention_step.cuh). The chunks depend on n_kv alone, so a token's bits do not depend on T.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LUCEBOX_SPLIT_HD __host__ __device__
#else
#define LUCEBOX_SPLIT_HD
#endif

namespace lucebox::kernels::attention {

constexpr int MAX_SPLITS = 64;  // chunks at most
constexpr int MIN_CHUNK = 32;   // keys a chunk at least (one step of a CTA's warps)

// n_kv keys -> `splits` chunks of `chunk` keys (a multiple of 16; the last one may be shorter).
LUCEBOX_SPLIT_HD inline void split_of(int n_kv, int & chunk, int & splits) {
    const int per = (n_kv + MAX_SPLITS - 1) / MAX_SPLITS;
    chunk = per < MIN_CHUNK ? MIN_CHUNK : (per + 15) / 16 * 16;
    splits = (n_kv + chunk - 1) / chunk;
}

// Floats of the chunks' partial results after the output, [T][H][splits][2 + hd] (max, sum,
// unnormalized sums); 0 for one chunk.
LUCEBOX_SPLIT_HD inline int64_t partial_floats(int hd, int H, int T, int n_kv) {
    int chunk = 0, splits = 0;
    split_of(n_kv, chunk, splits);
    return splits > 1 ? int64_t(T) * H * splits * (2 + hd) : 0;
}

}  // namespace lucebox::kernels::attention

#undef LUCEBOX_SPLIT_HD
