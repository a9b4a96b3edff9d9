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

uint64_t ngram_proposer::hash(const int32_t * last_n, uint32_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (uint32_t i = 0; i < n; ++i) {
        h ^= static_cast<uint32_t>(last_n[i]);
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    return h;
}

void ngram_proposer::index::append(int32_t token, uint32_t min_n) {
    seq.push_back(token);
    const size_t p = seq.size() - 1;
    uint32_t before = NONE;
    if (p + 1 >= min_n) {
        uint32_t & slot = latest.try_emplace(hash(&seq[p + 1 - min_n], min_n), NONE).first->second;
        before = slot;
        slot = static_cast<uint32_t>(p);
    }
    prev.push_back(before);
}

void ngram_proposer::index::extend(const std::vector<int32_t> & tokens, uint32_t min_n) {
    for (size_t p = seq.size(); p < tokens.size(); ++p) {
        append(tokens[p], min_n);
    }
}

void ngram_proposer::index::pop(uint32_t min_n) {
    const size_t p = seq.size() - 1;
    if (p + 1 >= min_n) {  // its hash's latest end becomes the one before
        const auto it = latest.find(hash(&seq[p + 1 - min_n], min_n));
        if (prev[p] == NONE) {
            latest.erase(it);
        } else {
            it->second = prev[p];
        }
    }
    seq.pop_back();
    prev.pop_back();
}

void ngram_proposer::sync(const std::vector<int32_t> & tokens) {
    std::vector<int32_t> & seq = context_.seq;
    const size_t n = std::min(seq.size(), tokens.size());
    const size_t shared = static_cast<size_t>(std::mismatch(seq.begin(), seq.begin() + n, tokens.begin()).first -
                                              seq.begin());
    while (seq.size() > shared) {
        context_.pop(opt_.min_n);
    }
    context_.extend(tokens, opt_.min_n);
}

void ngram_proposer::set_reference(const std::vector<int32_t> & reference) {
    reference_ = index();
    reference_.extend(reference, opt_.min_n);
}

ngram_proposer::match ngram_proposer::best_match(const index & ix, const std::vector<int32_t> & s,
                                                 size_t end) const {
    match best;
    const auto it = ix.latest.find(hash(&s[end + 1 - opt_.min_n], opt_.min_n));
    uint32_t p = it == ix.latest.end() ? NONE : it->second;
    for (uint32_t k = 0; p != NONE && k < opt_.max_candidates; ++k, p = ix.prev[p]) {
        // how far back s before `end` and ix.seq before p agree (a hash collision: less than min_n)
        size_t len = 0;
        while (len < opt_.max_n && len <= p && len <= end && ix.seq[p - len] == s[end - len]) {
            ++len;
        }
        if (len >= opt_.min_n && len > best.len) {
            best = {p, len};
            if (len == opt_.max_n) {
                break;
            }
        }
    }
    return best;
}

std::vector<int32_t> ngram_proposer::propose(const std::vector<int32_t> & tokens, int32_t last, uint32_t max) {
    std::vector<int32_t> out;
    from_reference_ = false;
    if (tokens.size() < context_.seq.size()) {
        sync(tokens);
    }
    context_.extend(tokens, opt_.min_n);
    std::vector<int32_t> & s = context_.seq;  // s = tokens + [last] while proposing; `last` at `end`
    const size_t end = s.size();
    if (max == 0 || end < opt_.min_n) {
        return out;
    }
    s.push_back(last);
    match in_ref = reference_.seq.empty() ? match() : best_match(reference_, s, end);
    if (in_ref.end + 1 >= reference_.seq.size()) {
        in_ref = match();  // at the reference's end: nothing follows
    }
    const match in_ctx = best_match(context_, s, end);  // (positions below `end` only: indexed before)
    const match & m = in_ref.len >= in_ctx.len ? in_ref : in_ctx;
    if (m.len > 0) {
        from_reference_ = &m == &in_ref;
        size_t n = 3;  // the match's length rounded up to a verify width of 4, 8 or 16 tokens
        while (n < m.len && n < 15) n = 2 * n + 1;
        n = std::min<size_t>(n, max);
        // proposal i is what follows the occurrence: in the reference up to its end; in the context
        // s[m.end + 1 + i] of s extended by the proposals before it (a repetition that runs into
        // the suffix itself is continued)
        const std::vector<int32_t> & src = from_reference_ ? reference_.seq : s;
        for (size_t i = 0; i < n && (!from_reference_ || m.end + 1 + i < src.size()); ++i) {
            out.push_back(src[m.end + 1 + i]);
            if (!from_reference_) {
                s.push_back(out.back());
            }
        }
    }
    s.resize(end);
    return out;
}

}  // namespace lucebox::spec
