#include "spec/ngram.h"

#include <algorithm>
#include <string>

#include "lucebox/errors.h"

namespace lucebox::spec {

ngram_proposer::ngram_proposer(const options & opt) : opt_(opt) {
    if (opt.min_n < 1 || opt.min_n > opt.max_n || opt.max_n > 1024 || opt.max_candidates < 1) {
        throw config_error("ngram: need 1 <= min_n (" + std::to_string(opt.min_n) + ") <= max_n (" +
                           std::to_string(opt.max_n) + ") <= 1024 and max_candidates >= 1");
    }
}

uint64_t ngram_proposer::hash_at(size_t end) const {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (size_t i = end + 1 - opt_.min_n; i <= end; ++i) {
        h ^= static_cast<uint32_t>(seq_[i]);
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    return h;
}

void ngram_proposer::sync(const std::vector<int32_t> & tokens) {
    const size_t shared = static_cast<size_t>(
        std::mismatch(seq_.begin(), seq_.begin() + std::min(seq_.size(), tokens.size()), tokens.begin()).first -
        seq_.begin());
    while (seq_.size() > shared) {  // forget the last position: its hash's latest end is the one before
        const size_t p = seq_.size() - 1;
        if (p + 1 >= opt_.min_n) {
            const auto it = latest_.find(hash_at(p));
            if (prev_[p] == NONE) {
                latest_.erase(it);
            } else {
                it->second = prev_[p];
            }
        }
        seq_.pop_back();
        prev_.pop_back();
    }
    append(tokens);
}

void ngram_proposer::append(const std::vector<int32_t> & tokens) {
    for (size_t p = seq_.size(); p < tokens.size(); ++p) {
        seq_.push_back(tokens[p]);
        uint32_t before = NONE;
        if (p + 1 >= opt_.min_n) {
            uint32_t & slot = latest_.try_emplace(hash_at(p), NONE).first->second;
            before = slot;
            slot = static_cast<uint32_t>(p);
        }
        prev_.push_back(before);
    }
}

std::vector<int32_t> ngram_proposer::propose(const std::vector<int32_t> & tokens, int32_t last, uint32_t max) {
    std::vector<int32_t> out;
    if (tokens.size() < seq_.size()) {
        sync(tokens);
    }
    append(tokens);
    const size_t end = seq_.size();  // the position of `last` in s = tokens + [last]
    if (max == 0 || end < opt_.min_n) {
        return out;
    }
    seq_.push_back(last);
    const auto it = latest_.find(hash_at(end));
    size_t best = 0, best_len = 0;
    uint32_t p = it == latest_.end() ? NONE : it->second;
    for (uint32_t k = 0; p != NONE && k < opt_.max_candidates; ++k, p = prev_[p]) {
        // how far back s matches before `end` and before p (a hash collision matches less than min_n)
        size_t len = 0;
        while (len < opt_.max_n && len <= p && seq_[p - len] == seq_[end - len]) {
            ++len;
        }
        if (len >= opt_.min_n && len > best_len) {
            best = p, best_len = len;
            if (len == opt_.max_n) {
                break;
            }
        }
    }
    if (best_len > 0) {
        // as many proposals as the match is long, rounded up to a verify width of 4, 8 or 16 tokens
        // (few shapes: each is a graph of its own), at most `max`
        size_t n = 3;
        while (n < best_len && n < 15) n = 2 * n + 1;
        n = std::min<size_t>(n, max);
        // proposal i is s[best + 1 + i] of s extended by the proposals before it: what followed the
        // occurrence, and where that runs into the suffix itself, the repetition continued
        for (size_t i = 0; i < n; ++i) {
            out.push_back(seq_[best + 1 + i]);
            seq_.push_back(out.back());
        }
    }
    seq_.resize(end);
    return out;
}

}  // namespace lucebox::spec
