// DDTree draft trees: the best-first tree of the most probable continuations under a node budget,
// built from one draft pass's per-position top-K log-probabilities, and the geometry checks every
// tree passes before it reaches the target. Pure C++ over token ids and floats (no tensors),
// unit-tested in tests/cpp/test_tree.cpp.
//
// A tree has n nodes in topological order. Node 0 is the root: the last committed (pending) token,
// depth 0, parent -1. Every other node i holds a proposed token at depth = depth[parent] + 1, with
// parent[i] < i, so a node's ancestors precede it and a prefix of the node list is itself a tree.
// The path root -> i spells the continuation the node stands for; its score is the sum of the
// draft's log-probabilities of its tokens (the draft's per-position marginals treated as
// independent, as in the DDTree paper).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "lucebox/sampling.h"

namespace lucebox::spec {

// One draft pass: for each depth d = 1..D, the K best (token, log-prob) pairs, best first.
// cand_tokens / cand_logp are [D][K] row-major: entry (d-1) * K + r is rank r at depth d.
struct draft_topk {
    uint32_t depth = 0;  // D: proposal positions (block size - 1)
    uint32_t k = 0;      // K: candidates per position
    std::vector<int32_t> tokens;
    std::vector<float> logp;

    // Throws config_error on inconsistent sizes, non-finite or unsorted log-probs.
    void validate() const;
};

struct draft_tree {
    std::vector<int32_t> tokens;   // [n] token per node; tokens[0] = the root token
    std::vector<int32_t> parents;  // [n] parent index; -1 for the root
    std::vector<int32_t> depths;   // [n] 0 for the root
    std::vector<float> scores;     // [n] path log-prob (0 for the root)

    uint32_t size() const { return static_cast<uint32_t>(tokens.size()); }
    // Ancestor mask, row-major [n][n]: mask[i * n + j] = 1 iff j is i or an ancestor of i (the
    // tokens node i may attend to within the tree).
    std::vector<uint8_t> ancestor_mask() const;
    // The node indices of the path root -> node, root first.
    std::vector<int32_t> path_to(int32_t node) const;
};

struct tree_options {
    uint32_t budget = 22;       // nodes besides the root (>= 1)
    bool seed_top1_chain = false;  // force the top-1 chain (up to the budget) into the tree first
};

// The best-first tree: the `budget` highest-scoring prefixes (ties: shallower, then lower rank
// sequence first), found lazily with a heap in O(budget log budget): popping a node pushes its
// best child and its next sibling. Nodes are emitted in pop order, which is topological.
// With seed_top1_chain, the top-1 chain of min(budget, D) nodes is taken first and the remaining
// budget is filled best-first. Throws config_error on bad options or input.
draft_tree build_tree(int32_t root_token, const draft_topk & topk, const tree_options & opt);

// Fail-closed geometry check of a tree about to be verified: sizes agree and n in [1, max_nodes],
// node 0 is the root (parent -1, depth 0), every other parent is in [0, i) (so no self, forward or
// cyclic parents), depths equal parent depth + 1 and stay <= max_depth, tokens in [0, n_vocab).
// Throws config_error naming the first violation (node index, field, values).
void validate_tree(const draft_tree & t, uint32_t max_nodes, uint32_t max_depth, int32_t n_vocab);

// Greedy acceptance on a tree: target[i] is the target's choice after node i's path. Walks from the
// root, at each step moving to the child whose token equals the target's choice at the current
// node (children are unique by token when built by build_tree; the first match wins otherwise).
// Returns the accepted path (node indices, root first); its last node's target choice is the bonus
// token.
std::vector<int32_t> accept_tree_greedy(const draft_tree & t, const std::vector<int32_t> & target);

// Speculative sampling on a tree of point-mass proposals (spec/chain.h accept_sampled for a tree).
// From the root, with history = the committed tokens + the root + the path accepted so far, the
// node's token is drawn as plain sampling draws it (sampler::accept_or_resample_among: one uniform)
// and the walk moves to the first child carrying that token; when none does (or at a leaf) the
// drawn token is the bonus. The emitted tokens (the path's tokens after the root, then the bonus)
// are the plain sampled ones for the same seed. Greedy parameters (with or without penalties)
// accept the first child equal to the node's argmax, as accept_tree_greedy.
// row(i): node i's verify row as the sampler takes it (called once per node the walk reaches).
struct tree_acceptance {
    std::vector<int32_t> path;  // accepted node indices, root first
    int32_t bonus = -1;         // the token drawn at the path's last node
};
tree_acceptance accept_tree_sampled(const draft_tree & t, const std::function<logit_row(size_t)> & row,
                                    int32_t n_vocab, sampler & smp, std::vector<int32_t> history);

}  // namespace lucebox::spec
