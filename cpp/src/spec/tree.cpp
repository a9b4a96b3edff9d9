#include "tree.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <string>

#include "lucebox/errors.h"

namespace lucebox::spec {

namespace {

std::string node_str(size_t i) { return "tree node " + std::to_string(i) + ": "; }

// A node not yet in the tree: rank `rank` at depth `depth` under tree node `parent`.
struct frontier_item {
    float score;
    uint32_t depth;
    uint32_t rank;
    int32_t parent;
    uint64_t seq;  // push order, the last tie-break (deterministic)
};

struct worse {  // priority_queue is a max-heap on "not worse"
    bool operator()(const frontier_item & a, const frontier_item & b) const {
        if (a.score != b.score) return a.score < b.score;
        if (a.depth != b.depth) return a.depth > b.depth;
        return a.seq > b.seq;
    }
};

}  // namespace

void draft_topk::validate() const {
    if (depth == 0 || k == 0) {
        throw config_error("draft top-k: depth and k must be >= 1 (got depth " + std::to_string(depth) + ", k " +
                           std::to_string(k) + ")");
    }
    const size_t n = size_t(depth) * k;
    if (tokens.size() != n || logp.size() != n) {
        throw config_error("draft top-k: expected " + std::to_string(n) + " tokens and log-probs, got " +
                           std::to_string(tokens.size()) + " and " + std::to_string(logp.size()));
    }
    // runs every step: the messages are built only on failure, and repeats are found by a scan of
    // the ranks before (k is at most tree_top_k, <= 64)
    for (uint32_t d = 0; d < depth; ++d) {
        const size_t row = size_t(d) * k;
        for (uint32_t r = 0; r < k; ++r) {
            const size_t i = row + r;
            auto where = [&] {
                return "draft top-k depth " + std::to_string(d + 1) + " rank " + std::to_string(r) + ": ";
            };
            if (tokens[i] < 0) throw config_error(where() + "negative token " + std::to_string(tokens[i]));
            if (std::find(tokens.begin() + row, tokens.begin() + i, tokens[i]) != tokens.begin() + i) {
                throw config_error(where() + "token " + std::to_string(tokens[i]) + " repeats");
            }
            // log-probs are <= 0 (a tiny positive rounding error is tolerated); sorted best first
            if (!std::isfinite(logp[i]) || logp[i] > 1e-4f) {
                throw config_error(where() + "log-prob " + std::to_string(logp[i]) + " is not a finite value <= 0");
            }
            if (r > 0 && logp[i] > logp[i - 1]) {
                throw config_error(where() + "log-probs are not sorted best first");
            }
        }
    }
}

std::vector<uint8_t> draft_tree::ancestor_mask() const {
    const size_t n = tokens.size();
    std::vector<uint8_t> mask(n * n, 0);
    for (size_t i = 0; i < n; ++i) {
        for (int32_t j = int32_t(i); j >= 0; j = parents[size_t(j)]) {
            mask[i * n + size_t(j)] = 1;
        }
    }
    return mask;
}

std::vector<int32_t> draft_tree::path_to(int32_t node) const {
    if (node < 0 || size_t(node) >= tokens.size()) {
        throw error("internal: path_to node " + std::to_string(node) + " of " + std::to_string(tokens.size()));
    }
    std::vector<int32_t> path;
    for (int32_t j = node; j >= 0; j = parents[size_t(j)]) {
        path.push_back(j);
    }
    return {path.rbegin(), path.rend()};
}

draft_tree build_tree(int32_t root_token, const draft_topk & topk, const tree_options & opt) {
    topk.validate();
    if (opt.budget == 0) {
        throw config_error("tree budget must be >= 1 node");
    }
    if (root_token < 0) {
        throw config_error("tree root token " + std::to_string(root_token) + " is negative");
    }
    const uint32_t K = topk.k, D = topk.depth;
    auto logp = [&](uint32_t depth, uint32_t rank) { return topk.logp[size_t(depth - 1) * K + rank]; };
    auto token = [&](uint32_t depth, uint32_t rank) { return topk.tokens[size_t(depth - 1) * K + rank]; };

    draft_tree t;
    t.tokens.reserve(opt.budget + 1);
    t.tokens.push_back(root_token);
    t.parents.push_back(-1);
    t.depths.push_back(0);
    t.scores.push_back(0.0f);

    std::priority_queue<frontier_item, std::vector<frontier_item>, worse> heap;
    uint64_t seq = 0;
    auto push = [&](int32_t parent, uint32_t depth, uint32_t rank) {
        if (depth <= D && rank < K) {
            heap.push({t.scores[size_t(parent)] + logp(depth, rank), depth, rank, parent, seq++});
        }
    };
    // Appends node (parent, depth, rank) and pushes the candidates it opens: its best child and
    // its next sibling (skipped when the chain seeding already placed the child).
    auto emit = [&](int32_t parent, uint32_t depth, uint32_t rank, bool push_child) {
        t.tokens.push_back(token(depth, rank));
        t.parents.push_back(parent);
        t.depths.push_back(int32_t(depth));
        t.scores.push_back(t.scores[size_t(parent)] + logp(depth, rank));
        const int32_t self = int32_t(t.tokens.size() - 1);
        if (push_child) push(self, depth + 1, 0);
        push(parent, depth, rank + 1);
    };

    if (opt.seed_top1_chain) {
        const uint32_t L = std::min(opt.budget, D);
        for (uint32_t d = 1; d <= L; ++d) {
            emit(int32_t(d - 1), d, 0, /*push_child=*/d == L);
        }
    } else {
        push(0, 1, 0);
    }
    while (t.tokens.size() < size_t(opt.budget) + 1 && !heap.empty()) {
        const frontier_item it = heap.top();
        heap.pop();
        emit(it.parent, it.depth, it.rank, true);
    }
    return t;
}

void validate_tree(const draft_tree & t, uint32_t max_nodes, uint32_t max_depth, int32_t n_vocab) {
    const size_t n = t.tokens.size();
    if (t.parents.size() != n || t.depths.size() != n) {
        throw config_error("tree: " + std::to_string(n) + " tokens but " + std::to_string(t.parents.size()) +
                           " parents and " + std::to_string(t.depths.size()) + " depths");
    }
    if (n == 0) {
        throw config_error("tree: no root node");
    }
    if (n > max_nodes) {
        throw config_error("tree: " + std::to_string(n) + " nodes exceed the limit of " + std::to_string(max_nodes));
    }
    if (t.parents[0] != -1 || t.depths[0] != 0) {
        throw config_error(node_str(0) + "the root must come first with parent -1 and depth 0 (got parent " +
                           std::to_string(t.parents[0]) + ", depth " + std::to_string(t.depths[0]) + ")");
    }
    for (size_t i = 0; i < n; ++i) {
        if (t.tokens[i] < 0 || t.tokens[i] >= n_vocab) {
            throw config_error(node_str(i) + "token " + std::to_string(t.tokens[i]) + " is outside the vocabulary [0, " +
                               std::to_string(n_vocab) + ")");
        }
        if (i == 0) continue;
        const int32_t p = t.parents[i];
        if (p < 0 || size_t(p) >= i) {
            const char * why = p < 0                ? " is not a node (only the root has no parent)"
                               : p == int32_t(i) ? " is the node itself"
                                                 : " comes after the node (parents must precede children)";
            throw config_error(node_str(i) + "parent " + std::to_string(p) + why);
        }
        if (t.depths[i] != t.depths[size_t(p)] + 1) {
            throw config_error(node_str(i) + "depth " + std::to_string(t.depths[i]) + " != parent depth " +
                               std::to_string(t.depths[size_t(p)]) + " + 1");
        }
        if (uint32_t(t.depths[i]) > max_depth) {
            throw config_error(node_str(i) + "depth " + std::to_string(t.depths[i]) + " exceeds the block's " +
                               std::to_string(max_depth));
        }
    }
}

std::vector<int32_t> accept_tree_greedy(const draft_tree & t, const std::vector<int32_t> & target) {
    if (target.size() != t.tokens.size()) {
        throw error("internal: accept_tree_greedy needs one target choice per tree node");
    }
    std::vector<std::vector<int32_t>> children(t.tokens.size());
    for (size_t i = 1; i < t.tokens.size(); ++i) {
        children[size_t(t.parents[i])].push_back(int32_t(i));
    }
    std::vector<int32_t> path{0};
    for (;;) {
        const int32_t cur = path.back();
        int32_t next = -1;
        for (int32_t c : children[size_t(cur)]) {
            if (t.tokens[size_t(c)] == target[size_t(cur)]) {
                next = c;
                break;
            }
        }
        if (next < 0) return path;
        path.push_back(next);
    }
}

tree_acceptance accept_tree_sampled(const draft_tree & t, const std::function<logit_row(size_t)> & row,
                                    int32_t n_vocab, sampler & smp, std::vector<int32_t> history) {
    if (t.tokens.empty() || t.parents.size() != t.tokens.size()) {
        throw error("internal: accept_tree_sampled needs a tree with a root");
    }
    std::vector<std::vector<int32_t>> children(t.tokens.size());
    for (size_t i = 1; i < t.tokens.size(); ++i) {
        children[size_t(t.parents[i])].push_back(int32_t(i));
    }
    tree_acceptance out;
    out.path.push_back(0);
    history.push_back(t.tokens[0]);
    std::vector<int32_t> proposals;
    for (;;) {
        const int32_t cur = out.path.back();
        const std::vector<int32_t> & kids = children[size_t(cur)];
        const logit_row r = row(size_t(cur));
        if (kids.empty()) {
            out.bonus = smp.sample(r, n_vocab, history);  // a leaf: the bonus, as after a full chain
            return out;
        }
        proposals.clear();
        for (int32_t c : kids) proposals.push_back(t.tokens[size_t(c)]);
        int index = -1;
        const int32_t tok = smp.accept_or_resample_among(r, n_vocab, history, proposals, index);
        if (index < 0) {
            out.bonus = tok;
            return out;
        }
        out.path.push_back(kids[size_t(index)]);
        history.push_back(tok);
    }
}

}  // namespace lucebox::spec
