// The engine: a loaded qwen35 target on one device, and sessions (sequences) that evaluate and
// generate tokens on it. One call runs a whole prefill or generation in C++; committed tokens are
// streamed through a callback. Sessions of one engine share its compute scheduler, so calls into
// them are serialised by the engine.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lucebox/backend_buffers.h"
#include "lucebox/memory_plan.h"
#include "lucebox/models.h"
#include "lucebox/sampling.h"

namespace lucebox {

namespace spec {
struct draft_tree;  // cpp/src/spec/tree.h
struct draft_topk;
struct commit_plan;  // cpp/src/spec/chain.h
class ngram_proposer;  // cpp/src/spec/ngram.h
}  // namespace spec

struct engine_config {
    std::string model_path;
    uint32_t n_ctx = 4096;            // tokens per session; at most the model's trained context
    std::string kv_type_k = "f16";    // f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1
    std::string kv_type_v = "f16";
    std::string device = "auto";      // auto | cpu | cuda | cuda:N | a ggml device name (CUDA0)
    uint32_t n_ubatch = 512;          // prefill micro-batch (tokens per forward)
    int n_threads = 0;                // CPU threads (0: all hardware threads)
    std::vector<int32_t> capture_layers;  // layer inputs captured into the feature ring (n_layer: final hidden)
    std::string draft_path;           // DFlash draft GGUF (empty: none); validated against the target
    // off | chain: speculate every step | auto: speculate while it is faster than plain decoding
    // (measured; see cpp/src/spec/policy.h) | tree: DDTree, verify a best-first tree of the draft's
    // top-k continuations every step (greedy or sampled acceptance, fast rollback). chain, auto, tree need a draft.
    std::string spec = "off";
    uint32_t tree_budget = 22;  // spec tree: nodes per tree besides the root, in [1, 256]
    uint32_t tree_top_k = 8;    // spec tree: draft candidates per position, in [1, 64]
    // How a verify that is not fully accepted rolls the DeltaNet state back:
    //   fast   - the verify keeps every token's state (B checkpoints per layer); commit copies one
    //   replay - back up the state (one slot), verify normally, restore and re-run the kept tokens
    std::string rollback = "fast";
    // Placement over several devices of one host (cpp/src/placement.h, cpp/src/tensor_parallel.h;
    // docs/multi-gpu.md):
    //   none   - the target on `device` (or on the one entry of `devices`)
    //   layer  - contiguous layer ranges, one per entry of `devices` (>= 2, no duplicates, <= 16),
    //            sized by layer_proportions (one positive weight per device; empty: even)
    //   tensor - tensor parallel over the ggml meta backend: every layer's heads and FFN channels
    //            dealt over `devices` (cuda:N, or cpu:N for tests)
    // Device specs are those of `device`, plus cpu:N (a distinct CPU backend instance).
    std::vector<std::string> devices;
    std::string split = "none";
    std::vector<float> layer_proportions;
    std::string draft_device;  // the draft's device (empty: the last device of the placement)

    void validate() const;  // throws config_error
};

struct generate_params {
    uint32_t max_tokens = 256;
    sampling_params sampling;
    std::vector<int32_t> stop_tokens;  // generation ends (without emitting it) at any of these
    progress_callback on_prefill;      // (tokens done, tokens total) after each prefill micro-batch
    // Test hook: replaces the draft's proposals. Called with (context tokens, last token, n) and
    // must return n token ids; enables speculative decoding even without a draft model.
    std::function<std::vector<int32_t>(const std::vector<int32_t> &, int32_t, uint32_t)> propose;
    uint32_t block_size = 0;           // verify width with `propose` and no draft (0: 16)
    // Test hook for tree verification: replaces the draft's tree. Called with (context tokens, last
    // token, max nodes) and returns the non-root nodes as (tokens, parents): node i+1 has token
    // tokens[i] and parent parents[i] in [0, i] (0 = the root, the last token). Validated like a
    // drafted tree; verified greedily or by sampled acceptance. Works without a draft model.
    std::function<std::pair<std::vector<int32_t>, std::vector<int32_t>>(const std::vector<int32_t> &, int32_t, uint32_t)>
        propose_tree;
    bool phase_timings = false;        // measure draft / verify / commit time (adds device syncs)
    // -1: no logprobs. 0..MAX_TOP_LOGPROBS: each emitted token comes with its log probability under the
    // model's distribution and this many most likely alternatives (token_logprobs). The tokens are
    // those of a generation without logprobs (greedy ones then go through the sampler's candidates).
    int32_t logprobs = -1;
    // Restricts the emitted tokens (a grammar; sampling.h): every token, plain or speculative, is
    // chosen among the ids it allows and reported to it, in emission order. Tokens a step chooses
    // past the generation's end (max_tokens, a stop token, a cancel) are reported too; the
    // constraint is of no use after the call. Null: none.
    std::shared_ptr<token_constraint> constraint;
    // The output the caller expects (OpenAI's predicted outputs: e.g. the file being rewritten), as
    // token ids: proposals are looked up in it (and in the context; spec/ngram.h) and verified as a
    // chain, on any engine but a tree's steps; where it has no match, the draft (if any) proposes.
    // It changes the speed only: the tokens are those of a generation without it.
    std::vector<int32_t> prediction;

    // Rows need only their argmax (computed on the device): greedy, no penalty, bias, constraint or
    // logprobs.
    bool argmax_only() const {
        return sampling.is_greedy() && !sampling.has_penalties() && constraint == nullptr && logprobs < 0;
    }
};

struct generate_stats {
    uint32_t n_prompt = 0;      // tokens prefilled by this call
    uint32_t n_generated = 0;   // tokens emitted
    double prefill_seconds = 0;
    double decode_seconds = 0;  // from the first generated token to the last
    // speculative decoding (all zero when it did not run)
    bool speculative = false;
    uint32_t steps = 0;            // draft + verify rounds
    uint32_t plain_steps = 0;      // one-token steps taken by spec "auto" when speculation did not pay
    uint32_t drafted = 0;          // proposals verified (tree: nodes besides the root)
    uint32_t accepted = 0;         // proposals accepted
    uint32_t predicted_accepted = 0;  // of them, proposals taken from generate_params::prediction
    std::vector<uint32_t> accept_histogram;  // [a] = steps that accepted a proposals
    uint32_t fast_rollbacks = 0;   // steps whose state was set from a verify checkpoint
    uint32_t replays = 0;          // steps that restored and replayed instead (none yet)
    double draft_seconds = 0, verify_seconds = 0, commit_seconds = 0;  // with phase_timings

    // one speculative step that verified `n_drafted` proposals and accepted `n_accepted` of them
    void count_step(uint32_t n_drafted, uint32_t n_accepted);
};

struct generate_result {
    std::vector<int32_t> tokens;  // generated ids (stop token excluded)
    std::vector<token_logprobs> logprobs;  // with generate_params::logprobs >= 0: one per token, in order
    std::string finish_reason;    // "stop" | "length" | "context" | "cancelled"
    generate_stats stats;
};

// Receives each committed token and, when logprobs were asked for, its token_logprobs (else null);
// return false to stop generating. Called on the generating thread, possibly while the engine is
// busy: it must not call into the same engine.
using token_callback = std::function<bool(int32_t, const token_logprobs *)>;

class session;

// Where a snapshot keeps its tensor data, chosen when it is taken:
//   host   - host memory: pinned (page-locked) when the engine's device offers a host buffer type
//            (CUDA does), so copies to and from the device run at full bus speed; plain memory else
//   device - a buffer on the engine's device, so restore is a device-to-device copy. On a CPU
//            engine the device is the CPU: the same (plain) memory as host, still reported "device".
enum class snapshot_location { host, device };
const char * snapshot_location_name(snapshot_location where);        // "host" | "device"
snapshot_location parse_snapshot_location(const std::string & name);  // throws config_error

// The tensor data of a snapshot: regions of given byte sizes, back to back (aligned) in one backend
// buffer. Defined in src/state/snapshot.h; immutable once filled, shared by copies of a snapshot.
class snapshot_data;

// A copy of a session's full state: the evaluated tokens, the pending token, the attention KV rows
// [0, n_past), the DeltaNet conv and ssm state, and the draft's KV rows (the regions, in the order of
// session::snapshot). Restoring it into a session of an engine with the same layout continues
// token-identically. Copies share the data (copying a snapshot copies no tensor bytes).
struct session_snapshot {
    std::string fingerprint;  // layout of the model, KV types and draft; restore refuses a mismatch
    std::vector<int32_t> tokens;
    int32_t pending = -1;
    std::shared_ptr<const snapshot_data> data;  // null only in a default-constructed snapshot

    snapshot_location location() const;
    uint64_t bytes() const;                      // tensor data + tokens
    std::vector<uint64_t> region_sizes() const;  // bytes of each region, in order
    // This snapshot with its data in host memory (itself when its location is host; else a copy,
    // pinned when its device offers pinned memory). Throws out_of_memory_error when that does not fit.
    session_snapshot to_host() const;
    // Versioned binary file ("LBXSNAP1"); a device snapshot is copied to host in chunks on the way.
    void save(const std::string & path) const;
    // Reads a file written by save() into plain host memory. Throws config_error on a bad file.
    // (engine::load_snapshot places it in an engine's pinned host or device memory instead.)
    static session_snapshot load(const std::string & path);
};

class engine {
  public:
    explicit engine(const engine_config & cfg, const progress_callback & progress = {});
    ~engine();
    engine(const engine &) = delete;
    engine & operator=(const engine &) = delete;

    const engine_config & config() const;
    const qwen35_hparams & hparams() const;
    memory_plan plan() const;
    std::string device_name() const;         // e.g. "CUDA0", "CPU"; a layer split: "CUDA0+CUDA1"
    std::string device_description() const;  // e.g. "NVIDIA H200"

    std::unique_ptr<session> new_session();

    // A copy of `snap` with its data at `where` for this engine (device: this engine's device;
    // host: pinned memory of this device if it offers it). Returns `snap` itself when its data is
    // already in that buffer type. Throws out_of_memory_error naming the bytes when it does not fit.
    session_snapshot copy_snapshot(const session_snapshot & snap, snapshot_location where) const;
    // session_snapshot::load straight into this engine's memory at `where`.
    session_snapshot load_snapshot(const std::string & path, snapshot_location where) const;

    struct impl;

  private:
    std::unique_ptr<impl> impl_;
};

class session {
  public:
    ~session();
    session(const session &) = delete;
    session & operator=(const session &) = delete;

    // Appends `tokens` to the context and returns their logits, row-major [n_rows, n_vocab]:
    // every position when all_logits, else only the last. Throws config_error if the tokens do not
    // fit in the context or are outside the vocabulary; the session is unchanged then.
    std::vector<float> eval(const std::vector<int32_t> & tokens, bool all_logits);

    // Appends `tokens` like eval and returns the logprobs (token_logprobs with n_top alternatives,
    // n_top <= MAX_TOP_LOGPROBS) of tokens[1..] each after everything before it, then, if next >= 0,
    // of `next` after all of them (not appended): tokens.size() - 1 (+1) entries. The rows' normalizers
    // and alternatives come from the device's candidates, so no vocabulary row crosses to the host
    // (but on a layer split). Throws config_error like eval; the session is unchanged then.
    std::vector<token_logprobs> score(const std::vector<int32_t> & tokens, uint32_t n_top, int32_t next = -1);

    // Appends `prompt` and generates. The last emitted token is not evaluated until the next call
    // (which feeds it first), so a one-shot generation costs no extra forward; `prompt` may be empty
    // when such a pending token exists.
    generate_result generate(const std::vector<int32_t> & prompt, const generate_params & params,
                             const token_callback & on_token);

    // What the draft proposes after the session's context followed by `last` (not evaluated):
    // block_size - 1 token ids. The context is unchanged (the draft only catches up on features).
    std::vector<int32_t> draft_proposals(int32_t last);

    // Copies the state into a new snapshot whose data lives at `where`. Throws out_of_memory_error
    // (naming the bytes needed) when that memory is short; the session is unchanged then.
    session_snapshot snapshot(snapshot_location where = snapshot_location::host);
    uint64_t snapshot_bytes() const;  // what snapshot().bytes() would be now, without copying anything
    // Bytes of the memory this session holds for its state: KV caches, recurrent state, verify
    // checkpoints, feature rings, the draft's caches (not the engine's weights or compute buffers).
    uint64_t state_bytes() const;
    // Replaces the state by `snap` (from host or device memory). Throws config_error on a layout
    // mismatch or a snapshot longer than the context; the session is unchanged then.
    void restore(const session_snapshot & snap);

    void reset();  // empty context
    uint32_t n_past() const { return static_cast<uint32_t>(tokens_.size()); }  // evaluated tokens
    const std::vector<int32_t> & tokens() const { return tokens_; }
    int32_t pending_token() const { return pending_; }  // -1 if none
    uint32_t n_ctx() const;
    uint32_t n_vocab() const;

  private:
    friend class engine;
    struct state;
    session(engine::impl * eng, std::unique_ptr<state> st);
    // What a sampled target batch returns instead of whole logits rows: per output row (the last
    // row, or every row with all_rows) the device's top-n_cand candidates plus the logits of
    // extra_ids (graph/candidates.h). A full row stays readable from the device until the engine
    // runs another target batch, so callers keep the engine lock until they have sampled.
    struct row_candidates {
        uint32_t n_cand = 0;               // 0: whole rows (no candidates wanted, or a layer split)
        bool all_rows = false;
        bool log_norm = false;             // also each row's softmax normalizer (candidate_row::log_norm)
        std::vector<int32_t> extra_ids;
        std::vector<int32_t> row_ids;      // or one id per output row (score: each row's next token)
        std::vector<candidate_row> rows;  // filled by run_target
        std::vector<float> logits;        // whole rows, or the one row fetched when candidates cannot decide
    };
    // n_top: generate_params::logprobs (-1: none).
    row_candidates candidates_for(const sampler & smp, int32_t n_top) const;
    // The extra ids of a sampled batch: the logit_bias ids and the penalty window of `history` plus,
    // with window penalties, the batch's own tokens (they join later rows' windows). False: whole rows
    // this time (no candidates, or more penalized ids than are worth gathering).
    bool plan_candidates(row_candidates & cands, const sampler & smp, const std::vector<int32_t> & history,
                         const int32_t * batch, uint32_t n_batch) const;
    // Runs `n` tokens through forward() (the caller holds the engine lock) and samples the token
    // after them with `smp` over `history` (the evaluated tokens including these). With lp, also
    // fills its logprobs with n_top alternatives.
    int32_t forward_and_sample(const int32_t * tokens, uint32_t n, sampler & smp, const std::vector<int32_t> & history,
                               row_candidates & cands, const progress_callback & progress,
                               token_logprobs * lp = nullptr, uint32_t n_top = 0);
    // Runs a sampled verify batch (a chain, or `tree`) and returns the sampler's view of each row
    // (valid until the next target batch; the caller holds the engine lock).
    std::function<logit_row(size_t)> run_target_sampled(const int32_t * tokens, uint32_t n, bool verify,
                                                        const spec::draft_tree * tree, const sampler & smp,
                                                        row_candidates & cands);
    // Runs `n` tokens (already validated) through the model in micro-batches; the caller holds the
    // engine's compute lock. Returns logits of the requested rows; when `argmax` is set and only
    // the last row is wanted, returns its argmax instead; with `cands`, the last batch fills them
    // (and no logits are returned).
    std::vector<float> forward(const int32_t * tokens, uint32_t n, bool all_logits, int32_t * argmax,
                               const progress_callback & progress = {}, row_candidates * cands = nullptr);
    // One target batch at the current end of the context. verify: keep per-token checkpoints and
    // return every row's argmax in `argmax_rows` (the state is not advanced; commit() does that).
    // tree (n = its size, tokens = its tokens): a tree verify (positions n_past + depth, ancestor-only
    // attention, DeltaNet/conv state from the parent); argmax_rows gets every node's choice.
    std::vector<float> run_target(const int32_t * tokens, uint32_t n, bool all_logits, int32_t * argmax_last,
                                  bool verify, std::vector<int32_t> * argmax_rows,
                                  const spec::draft_tree * tree = nullptr, row_candidates * cands = nullptr);
    // A sampler's view of output row r of the last target batch: its candidates, and the full row
    // on demand (copied from the device into cands.logits).
    logit_row sampling_row(row_candidates & cands, uint32_t r);
    // Draft: inject features of positions [n_draft_ctx, n_past) and, if block > 0, propose block-1
    // tokens; with topk, also fill it with the top topk->k candidates per position (topk->k set).
    std::vector<int32_t> run_draft(int32_t last, uint32_t block, spec::draft_topk * topk = nullptr);
    void commit(uint32_t n_verified, uint32_t last_kept);
    // After a tree verify of n_verified nodes: commits the root path `path` (spec/tree.h path_to).
    void commit_tree(uint32_t n_verified, const std::vector<int32_t> & path);
    void backup_state(bool backup);  // replay rollback: state -> slot 0 (true) or back (false)
    generate_result generate_speculative(const std::vector<int32_t> & pending, const generate_params & params,
                                         const token_callback & on_token);
    // One tree-verification step of generate_speculative (spec tree or propose_tree); appends the
    // emitted tokens to res.tokens and returns the step's commit plan (spec/chain.h). Sampled
    // requests draw with smp (cands: generate_speculative's). With logprobs, step_lps[j] is filled
    // for the j-th token the step may emit before `emit` is called for any of them.
    spec::commit_plan tree_step(int32_t last, uint32_t room, const generate_params & params, generate_stats & stats,
                                generate_result & res, const std::function<bool(int32_t)> & is_stop,
                                const std::function<bool(int32_t)> & emit, sampler & smp, row_candidates & cands,
                                std::vector<token_logprobs> & step_lps);
    void check_fits(size_t n_new) const;
    // What eval and score require of `tokens` (throws config_error naming `what`): some tokens, no
    // pending token, room in the context, ids in the vocabulary.
    void check_appendable(const std::vector<int32_t> & tokens, const char * what) const;

    engine::impl * eng_;
    std::unique_ptr<state> st_;
    std::vector<int32_t> tokens_;  // evaluated tokens, in order
    uint32_t n_draft_ctx_ = 0;     // positions whose features the draft has injected
    std::unique_ptr<spec::ngram_proposer> ngram_;  // draftless proposals: the context's n-gram index
    int32_t pending_ = -1;         // emitted by generate() but not yet evaluated
};

}  // namespace lucebox
