// Where the tensor-core attention kernel (attention_step.cuh, attend_mma_kernel) keeps what, in
// plain C++ for both the kernel and host tests (tests/cpp/test_attention_mma_layout.cpp checks it
// against the PTX ISA's fragment layouts and emulates one warp's key tile with it).
//
// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 on one warp: lane l is in group l / 4
// (groupID) at place l % 4 (threadID_in_group). Fragments:
//   A 16 x 16 f16 (rows x k): 4 registers of 2 halves, element i = 0..7 of the lane;
//   B 16 x 8  f16 (k x cols): 2 registers of 2 halves, element i = 0..3;
//   C 16 x 8  f32 (rows x cols): 4 floats, element i = 0..3.
// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16 loads four 8 x 8 b16 matrices, lane 8 m + r
// giving the address of row r of matrix m; register m of lane l receives matrix m's halves
// (l / 4, 2 (l % 4) + {0, 1}), transposed: (2 (l % 4) + {0, 1}, l / 4).
//
// A CTA's ROWS rows are (token, query head) pairs of one KV head's group of G heads, token-major
// (row_of); warp w takes rows 16 w .. 16 w + 15 of them, lane l rows group_of(l) and group_of(l) + 8.
#pragma once

#if defined(__CUDACC__)
#define LUCEBOX_MMA_HD __host__ __device__ __forceinline__
#else
#define LUCEBOX_MMA_HD inline
#endif

namespace lucebox::kernels::attention::mma_layout {

constexpr int WARPS = 4;             // warps a CTA
constexpr int WARP_ROWS = 16;        // rows a warp (the mma's M)
constexpr int ROWS = WARPS * WARP_ROWS;  // (token, head) rows a CTA
constexpr int TILE_KEYS = 16;        // keys a staged tile (two mma N tiles for scores, one K step for values)

struct rc {
    int row, col;
};

LUCEBOX_MMA_HD int group_of(int lane) { return lane / 4; }
LUCEBOX_MMA_HD int place_of(int lane) { return lane % 4; }

// Which of the lane's two rows (group, group + 8) element i of its A fragment (0..7) or C fragment
// (0..3) is in (a compile-time constant where i is).
LUCEBOX_MMA_HD int a_half(int i) { return (i / 2) % 2; }
LUCEBOX_MMA_HD int c_half(int i) { return i / 2; }

// Element i (0..7) of lane's A fragment: registers i / 2 hold (rows gid, gid + 8, gid, gid + 8)
// and columns (k) 2 place + {0, 1}, then + 8.
LUCEBOX_MMA_HD rc a_elem(int lane, int i) {
    return {group_of(lane) + 8 * a_half(i), 2 * place_of(lane) + i % 2 + 8 * (i / 4)};
}
// Element i (0..3) of lane's B fragment as (k, col): k 2 place + {0, 1}, then + 8; col gid.
LUCEBOX_MMA_HD rc b_elem(int lane, int i) { return {2 * place_of(lane) + i % 2 + 8 * (i / 2), group_of(lane)}; }
// Element i (0..3) of lane's C (and D) fragment: rows gid (i < 2), gid + 8; columns 2 place + {0, 1}.
LUCEBOX_MMA_HD rc c_elem(int lane, int i) { return {group_of(lane) + 8 * c_half(i), 2 * place_of(lane) + i % 2}; }

// The row (key) and first column (dim) of a 16-key tile whose address lane gives to ldmatrix.x4
// (non-transposed) for the scores' B fragments of one 16-dim K step: matrices (keys 0-7, dims
// 0-7), (keys 0-7, dims 8-15), (keys 8-15, dims 0-7), (keys 8-15, dims 8-15), so that registers
// 0, 1 are the B fragment of keys 0-7 (the N tile's columns) and 2, 3 that of keys 8-15.
LUCEBOX_MMA_HD rc k_ldsm_src(int lane) { return {8 * (lane / 16) + lane % 8, 8 * ((lane / 8) % 2)}; }
// The same for ldmatrix.x4.trans of a V tile (16 keys x 16 dims): matrices (keys 0-7, dims 0-7),
// (keys 8-15, dims 0-7), (keys 0-7, dims 8-15), (keys 8-15, dims 8-15), so that registers 0, 1 are
// the values' B fragment (k = key) of dims 0-7 and 2, 3 that of dims 8-15.
LUCEBOX_MMA_HD rc v_ldsm_src(int lane) { return {8 * ((lane / 8) % 2) + lane % 8, 8 * (lane / 16)}; }

// P (the scores' C fragments of keys 0-7 and 8-15: s0[4], s1[4]) as the values' A fragment: its
// register r takes C elements (2 c, 2 c + 1) of tile n: (n, c) = p_source(r).
struct p_src {
    int tile, pair;
};
LUCEBOX_MMA_HD p_src p_source(int reg) { return {reg / 2, reg % 2}; }

// Rows <-> (token, head): the CTA of row block b takes rows b ROWS .. of the flattened T G rows,
// row R = t G + g (token t, head g of the group); rows >= T G are padding.
LUCEBOX_MMA_HD int row_of(int t, int g, int G) { return t * G + g; }
LUCEBOX_MMA_HD int token_of_row(int row, int G) { return row / G; }
LUCEBOX_MMA_HD int head_of_row(int row, int G) { return row % G; }
LUCEBOX_MMA_HD int row_blocks(int T, int G) { return (T * G + ROWS - 1) / ROWS; }

}  // namespace lucebox::kernels::attention::mma_layout

#undef LUCEBOX_MMA_HD
