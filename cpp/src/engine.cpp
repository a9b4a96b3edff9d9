#include "lucebox/engine.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "cuda_kernels.h"
#include "lucebox/errors.h"
#include "lucebox/log.h"
#include "lucebox/model_files.h"
#include "models/dflash_model.h"
#include "models/qwen35_model.h"
#include "graph/builders.h"
#include "graph/candidates.h"
#include "graph/inputs.h"
#include "placement.h"
#include "tensor_parallel.h"
#include "spec/chain.h"
#include "spec/ngram.h"
#include "spec/policy.h"
#include "spec/tree.h"
#include "state/snapshot.h"

namespace lucebox {

namespace {

constexpr uint32_t KV_PAD = 256;         // cache rows are viewed in multiples of this (FA kernels)
using graph::MAX_GRAPH_NODES;
constexpr uint32_t MAX_FORCED_BLOCK = 16;  // verify width available to forced proposals without a draft

uint32_t pad_to(uint32_t n, uint32_t m) { return (n + m - 1) / m * m; }

// Refuses ids outside [0, V): "<what>token id X at index i is outside the vocabulary [0, V)".
void check_token_ids(const std::vector<int32_t> & ids, uint32_t V, const std::string & what) {
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || static_cast<uint32_t>(ids[i]) >= V) {
            throw config_error(what + "token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                               " is outside the vocabulary [0, " + std::to_string(V) + ")");
        }
    }
}

// The target's key view for a forward whose last token sits at position end - 1: cache rows [0, n),
// n = end padded to KV_PAD rows, or to kernels::k_fattn_long_view_pad rows once that reaches
// kernels::fattn_long_keys() (a long view: CUDA's fixed-split attention, ggml patch 0008, then takes a
// wider query tile and longer key pieces, both dividing the pad), clipped at kv_size (a multiple of
// KV_PAD; of the long pad too where the cache reached long views when the engine was made). Every
// backend takes the same views.
uint32_t kv_view_rows(uint32_t end, uint32_t kv_size) {
    const int64_t long_keys = kernels::fattn_long_keys();
    const uint32_t n = pad_to(end, KV_PAD);
    const bool is_long = long_keys > 0 && int64_t(n) >= long_keys;
    return std::min(kv_size, is_long ? pad_to(end, static_cast<uint32_t>(kernels::k_fattn_long_view_pad)) : n);
}

// Tokens (at least 1) one target forward from position n_past may hold so that each gets the
// attention of its own decode step. The attention's split (query tile width, key pieces) is a
// function of the key view: one for views below fattn_long_keys(), one for long views that are whole
// long pads, and ggml's KV-tile cuts for the one long view that is not, a view clipped at a kv_size
// that is not a multiple of the long pad. A decode step of the token at position q sees
// kv_view_rows(q + 1), a verify from p kv_view_rows(p + T); the view class changes as the view's end
// passes first_long = pad_to(long_keys, KV_PAD) - KV_PAD and, past it, clip = kv_size rounded down
// to the long pad, so a verify block that starts below one of them must end below it too (only blocks
// that would reach past it are shortened; every backend keeps the rule, so a session's tokens do not
// depend on its device).
uint32_t split_safe_tokens(uint32_t n_past, uint32_t kv_size) {
    const int64_t long_keys = kernels::fattn_long_keys();
    if (long_keys <= 0 || long_keys > int64_t(kv_size)) {
        return UINT32_MAX;
    }
    const uint32_t first_long = pad_to(static_cast<uint32_t>(long_keys), KV_PAD) - KV_PAD;
    const uint32_t long_pad = static_cast<uint32_t>(kernels::k_fattn_long_view_pad);
    const uint32_t clip = kv_size % long_pad != 0 ? kv_size / long_pad * long_pad : UINT32_MAX;
    for (uint32_t bound : {first_long, clip}) {
        if (n_past < bound) {
            return bound - n_past;
        }
    }
    return UINT32_MAX;
}

using clock = std::chrono::steady_clock;
double seconds_since(clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); }

}  // namespace

void engine_config::validate() const {
    if (model_path.empty()) {
        throw config_error("engine: model path is empty");
    }
    if (n_ctx == 0) {
        throw config_error("engine: ctx must be > 0");
    }
    if (n_ubatch == 0 || n_ubatch > 8192) {
        throw config_error("engine: ubatch " + std::to_string(n_ubatch) + " must be in [1, 8192]");
    }
    if (n_threads < 0) {
        throw config_error("engine: n_threads must be >= 0");
    }
    parse_kv_type(kv_type_k);
    parse_kv_type(kv_type_v);
    validate_placement(*this);
    if (spec != "off" && spec != "chain" && spec != "auto" && spec != "tree" && spec != "ngram") {
        throw config_error("engine: spec '" + spec + "' must be off, chain, auto, tree or ngram");
    }
    if (tree_budget < 1 || tree_budget > 256) {
        throw config_error("engine: tree_budget " + std::to_string(tree_budget) + " must be in [1, 256]");
    }
    if (tree_top_k < 1 || tree_top_k > 64) {
        throw config_error("engine: tree_top_k " + std::to_string(tree_top_k) + " must be in [1, 64]");
    }
    if (spec == "tree" && rollback != "fast") {
        throw config_error("engine: spec 'tree' needs rollback 'fast' (a tree commits from its verify checkpoints)");
    }
    if (spec != "off" && spec != "ngram" && draft_path.empty()) {
        throw config_error("engine: spec '" + spec + "' needs a draft model");
    }
    if (spec == "ngram" && !draft_path.empty()) {
        throw config_error("engine: spec 'ngram' proposes from the context and takes no draft model (with a draft: "
                           "auto, chain or tree)");
    }
    if (rollback != "fast" && rollback != "replay") {
        throw config_error("engine: rollback '" + rollback + "' must be fast or replay");
    }
}

struct engine::impl {
    engine_config cfg;
    target_model_file target;
    ggml_type type_k = GGML_TYPE_F16, type_v = GGML_TYPE_F16;
    uint32_t kv_size = 0;
    ggml_backend_dev_t dev = nullptr;
    ggml_backend_t backend = nullptr;      // the device's backend
    ggml_backend_t cpu_backend = nullptr;  // fallback for ops the device lacks (same as backend on CPU)
    ggml_backend_sched_t sched = nullptr;      // target forward passes (graph reused while shapes repeat)
    ggml_backend_sched_t sched_aux = nullptr;  // draft context updates, commit and state-backup graphs
    uint64_t sched_graph_id = 0;               // id of the cached graph allocated in `sched` (0: none)
    ggml_backend_sched_t sched_draft = nullptr;  // the draft's proposal block (graph reused while shapes repeat)
    uint64_t sched_draft_graph_id = 0;           // id of the kept draft block graph allocated there (0: none)
    tensor_store weights;
    qwen35_weights w;
    std::unique_ptr<layer_split> split;    // split "layer": the target over several devices (dev: the draft's)
    std::unique_ptr<tensor_split> tsplit;  // split "tensor": the target on a meta device (dev: the draft's)
    // The schedulers of the target's graphs: forward passes (graph reused while shapes repeat) and
    // commit / state backup. sched and sched_aux on one device; the meta device's on a tensor split.
    ggml_backend_sched_t target_sched = nullptr;
    ggml_backend_sched_t state_sched = nullptr;
    // Tensor split: counts graph allocations on the meta backend. A meta buffer keeps the device
    // slices of its compute tensors and of views into its state in two rotating sets, the older
    // one dropped whenever another graph is computed, and a re-allocation does not renew them for
    // tensors that already have memory; so a cached forward graph is rebuilt (fresh tensors) when
    // any other meta graph was allocated since it was.
    uint64_t meta_epoch = 0;
    // DFlash draft (optional)
    std::unique_ptr<draft_model_file> draft;
    tensor_store draft_weights;
    dflash_weights dw;
    std::vector<int32_t> capture;          // target layers captured into feature rings
    std::vector<size_t> draft_ring_index;  // per draft target layer: index into `capture`
    std::vector<uint8_t> graph_meta;
    std::mutex compute_mutex;
    spec::step_costs step_costs;  // measured by spec "auto" generations (guarded by compute_mutex)

    uint32_t block_size() const { return draft ? draft->hparams.block_size : 0; }
    // tokens one verify forward may hold: the draft block, forced proposals, or a tree with its root
    uint32_t verify_width() const {
        return std::max({block_size(), MAX_FORCED_BLOCK, cfg.spec == "tree" ? cfg.tree_budget + 1 : 0u});
    }
    // Whether verifies keep every token's whole DeltaNet state (lucebox::keeps_states): trees, the
    // replay rollback's backup, verifies longer than the fused step takes, and (for now) a split
    // over devices. Otherwise a one-device session allocates those of layers that replay their
    // commits only when a tree is asked for (generate_params::propose_tree:
    // qwen35_state::add_state_checkpoints).
    bool keeps_states() const {
        memory_request req;
        req.verify_tokens = verify_width();
        req.keep_states = cfg.rollback == "replay" || cfg.spec == "tree" || cfg.split != "none";
        return lucebox::keeps_states(req);
    }

    // Allocates the graph's tensors; the caller then sets inputs and calls compute().
    void alloc(ggml_backend_sched_t s, ggml_cgraph * gf, const std::string & what) {
        if (s == target_sched) {
            sched_graph_id = 0;
        }
        if (tsplit && (s == target_sched || s == state_sched)) {
            ++meta_epoch;
        }
        ggml_backend_sched_reset(s);
        if (tsplit && (s == target_sched || s == state_sched)) {
            tsplit->assign(s, gf);
        } else {
            graph::place_on_device(s, gf, backend);  // (every scheduler but the tensor split's has `backend`)
        }
        if (!ggml_backend_sched_alloc_graph(s, gf)) {
            throw out_of_memory_error("out of memory allocating compute buffers for " + what + " on " +
                                      (tsplit && s != sched_aux ? tsplit->device_names() : ggml_backend_dev_name(dev)) +
                                      "; try a smaller ubatch");
        }
    }
    void compute(ggml_backend_sched_t s, ggml_cgraph * gf, const std::string & what) {
        check_status(ggml_backend_sched_graph_compute(s, gf), what);
    }
    // A graph allocated by its own allocator on this device (the kept commit graphs), computed
    // straight on the device's backend.
    void compute_on_device(ggml_cgraph * gf, const std::string & what) {
        check_status(ggml_backend_graph_compute(backend, gf), what);
    }
    // The same, queued on the backend's stream without waiting for it: the device runs it before
    // whatever is queued there next (the next forward pass), while the host moves on. Whoever reads
    // device memory outside that stream afterwards synchronizes the backend first.
    void queue_on_device(ggml_cgraph * gf, const std::string & what) {
        check_status(ggml_backend_graph_compute_async(backend, gf), what);
    }
    void check_status(ggml_status status, const std::string & what) const {
        if (status != GGML_STATUS_SUCCESS) {
            throw error(what + " failed on " + ggml_backend_dev_name(dev) + " (ggml status " +
                        std::to_string(int(status)) + ")");
        }
    }

    impl(const engine_config & c, const progress_callback & progress)
        : cfg(c), target(open_target((c.validate(), c.model_path))) {
        install_ggml_logger();
        const qwen35_hparams & hp = target.hparams;
        if (cfg.n_ctx > hp.n_ctx_train) {
            throw config_error("engine: ctx " + std::to_string(cfg.n_ctx) + " exceeds the model's trained context " +
                               std::to_string(hp.n_ctx_train));
        }
        for (int32_t l : cfg.capture_layers) {
            if (l < 0 || static_cast<uint32_t>(l) > hp.n_layer) {
                throw config_error("engine: capture layer " + std::to_string(l) + " is outside [0, " +
                                   std::to_string(hp.n_layer) + "]");
            }
        }
        type_k = parse_kv_type(cfg.kv_type_k);
        type_v = parse_kv_type(cfg.kv_type_v);
        kv_size = pad_to(cfg.n_ctx, KV_PAD);
        if (const int64_t long_keys = kernels::fattn_long_keys(); long_keys > 0 && kv_size >= long_keys) {
            // whole long pads: no long view is clipped to a length the long pieces do not divide
            kv_size = pad_to(kv_size, static_cast<uint32_t>(kernels::k_fattn_long_view_pad));
        }
        capture = cfg.capture_layers;
        if (!cfg.draft_path.empty()) {
            draft = std::make_unique<draft_model_file>(open_draft(cfg.draft_path));
            validate_draft_for_target(target.file, hp, draft->file, draft->hparams);
            for (int32_t l : draft->hparams.target_layers) {
                auto it = std::find(capture.begin(), capture.end(), l);
                if (it == capture.end()) {
                    capture.push_back(l);
                    it = capture.end() - 1;
                }
                draft_ring_index.push_back(static_cast<size_t>(it - capture.begin()));
            }
        }
        plan();  // validates KV row sizes against the types' block sizes

        const std::string draft_spec = !cfg.draft_device.empty() ? cfg.draft_device
                                       : !cfg.devices.empty()    ? cfg.devices.back()
                                                                 : cfg.device;
        dev = resolve_device(cfg.split != "none" ? draft_spec : cfg.devices.empty() ? cfg.device : cfg.devices[0]);
        backend = ggml_backend_dev_init(dev, nullptr);
        if (backend == nullptr) {
            throw unsupported_error(std::string("could not initialise device ") + ggml_backend_dev_name(dev));
        }
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            cpu_backend = backend;
        } else {
            cpu_backend = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
        }
        const int threads = cfg.n_threads > 0 ? cfg.n_threads
                                              : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
        configure_cpu_backend(cpu_backend, threads);

        if (cfg.split == "layer") {
            split = std::make_unique<layer_split>(cfg, target, threads, draft_spec, draft ? dev : nullptr, progress);
            w = split->weights();
        } else if (cfg.split == "tensor") {
            tsplit = std::make_unique<tensor_split>(cfg, target, type_k, type_v, threads, draft ? dev : nullptr,
                                                    progress);
            w = tsplit->weights();
        } else {
            weights = tensor_store::load(target.file, tensors_to_load(target.file, qwen35_tensor_specs(hp)),
                                         ggml_backend_dev_buffer_type(dev), dev, progress, qwen35_projection_stacks(hp));
            w = bind_qwen35_weights(hp, weights);
        }
        if (draft) {
            draft_weights = tensor_store::load(draft->file, tensors_to_load(draft->file, dflash_tensor_specs(draft->hparams)),
                                               ggml_backend_dev_buffer_type(dev), dev, {});
            dw = bind_dflash_weights(draft->hparams, draft_weights,
                                     split    ? split->draft_side_weights()
                                     : tsplit ? tsplit->draft_side_weights()
                                              : w);
        }

        std::vector<ggml_backend_t> backends{backend};
        if (cpu_backend != backend) {
            backends.push_back(cpu_backend);
        }
        sched = ggml_backend_sched_new(backends.data(), nullptr, static_cast<int>(backends.size()), MAX_GRAPH_NODES,
                                       false, true);
        sched_aux = ggml_backend_sched_new(backends.data(), nullptr, static_cast<int>(backends.size()),
                                           MAX_GRAPH_NODES, false, true);
        if (draft) {
            sched_draft = ggml_backend_sched_new(backends.data(), nullptr, static_cast<int>(backends.size()),
                                                 MAX_GRAPH_NODES, false, true);
        }
        graph_meta.resize(graph::graph_meta_bytes());
        target_sched = tsplit ? tsplit->sched() : sched;
        state_sched = tsplit ? tsplit->sched_aux() : sched_aux;
    }

    ~impl() {
        if (sched) {
            ggml_backend_sched_free(sched);
        }
        if (sched_aux) {
            ggml_backend_sched_free(sched_aux);
        }
        if (sched_draft) {
            ggml_backend_sched_free(sched_draft);
        }
        draft_weights = tensor_store();
        weights = tensor_store();
        split.reset();
        tsplit.reset();
        if (cpu_backend && cpu_backend != backend) {
            ggml_backend_free(cpu_backend);
        }
        if (backend) {
            ggml_backend_free(backend);
        }
    }

    memory_plan plan() const {
        memory_request req;
        req.n_ctx = kv_size;  // the cache rows it allocates: the context padded (kv_view_rows)
        req.kv_type_k = type_k;
        req.kv_type_v = type_v;
        req.ubatch = cfg.n_ubatch;
        if (draft) {  // checkpoint slots; spec tree: one per tree node (checkpoint_bytes_per_token each)
            req.verify_tokens = cfg.rollback == "replay" ? 1
                                : cfg.spec == "tree"   ? std::max(draft->hparams.block_size, cfg.tree_budget + 1)
                                                       : draft->hparams.block_size;
        }
        req.keep_states = keeps_states();
        memory_plan p = plan_memory(target.hparams, draft ? &draft->hparams : nullptr, req);
        p.target_weight_bytes = target.weight_bytes;
        p.draft_weight_bytes = draft ? draft->weight_bytes : 0;
        return p;
    }
};

engine::engine(const engine_config & cfg, const progress_callback & progress)
    : impl_(std::make_unique<impl>(cfg, progress)) {}

engine::~engine() = default;

void generate_stats::count_step(uint32_t n_drafted, uint32_t n_accepted) {
    ++steps;
    drafted += n_drafted;
    accepted += n_accepted;
    if (accept_histogram.size() <= n_accepted) {
        accept_histogram.resize(n_accepted + 1, 0);
    }
    accept_histogram[n_accepted] += 1;
}

const engine_config & engine::config() const { return impl_->cfg; }
const qwen35_hparams & engine::hparams() const { return impl_->target.hparams; }
memory_plan engine::plan() const { return impl_->plan(); }
std::string engine::device_name() const {
    return impl_->split    ? impl_->split->device_names()
           : impl_->tsplit ? impl_->tsplit->device_names()
                           : ggml_backend_dev_name(impl_->dev);
}
std::string engine::device_description() const { return ggml_backend_dev_description(impl_->dev); }

// ---------------------------------------------------------------------------------------------
// session
// ---------------------------------------------------------------------------------------------

namespace {
// A target graph kept between calls: rebuilt only when its shape key changes, and re-allocated
// only when another graph used the scheduler since. Repeating shapes (decode, verify) then cost
// no graph construction or allocation, and backends can replay their own captured graphs.
struct kept_graph {
    std::vector<uint8_t> meta;
    ggml_context * ctx = nullptr;
    std::array<uint32_t, 9> key{};
    uint64_t id = 0;  // unique per build (over all kept graphs), 0 = empty

    kept_graph() = default;
    kept_graph(const kept_graph &) = delete;
    kept_graph & operator=(const kept_graph &) = delete;
    ~kept_graph() {
        if (ctx) {
            ggml_free(ctx);
        }
    }
    ggml_context * rebuild() {
        static std::atomic<uint64_t> next_id{1};
        if (ctx) {
            ggml_free(ctx);
        }
        if (meta.empty()) {
            meta.resize(graph::graph_meta_bytes());
        }
        ggml_init_params ip{meta.size(), meta.data(), /*no_alloc=*/true};
        ctx = ggml_init(ip);
        id = next_id++;
        return ctx;
    }
    // before allocating it again where another graph was allocated since (see graph::forget_allocation)
    void forget_allocation() { graph::forget_allocation(ctx); }
};

struct graph_cache : kept_graph {
    uint64_t meta_epoch = 0;  // tensor split: engine::impl::meta_epoch after this graph's allocation
    qwen35_graph graph;
    graph::candidate_outputs cand;  // sampling candidates of the output rows (when requested)
};

// The draft's proposal-block graph (build_dflash_graph with no context rows), kept like the target's:
// its shape is (block, n_kv, top_k), the same step after step, while the context update before it
// varies with the accepted length and is built per step.
struct draft_block_cache : kept_graph {
    dflash_graph graph;
    std::vector<ggml_fp16_t> mask_staging;  // dflash_block_mask's output, kept from step to step
};

// Metadata memory, context and allocator of graphs a session builds once and keeps (own allocator:
// the shared schedulers never re-allocate them).
struct own_graph_memory {
    std::vector<uint8_t> meta;
    ggml_context * ctx = nullptr;
    ggml_gallocr_t galloc = nullptr;

    own_graph_memory() = default;
    own_graph_memory(const own_graph_memory &) = delete;
    own_graph_memory & operator=(const own_graph_memory &) = delete;
    ~own_graph_memory() { free_memory(); }
    // A fresh context of `meta_bytes` of tensor/graph metadata and an allocator for buffers of `dev`.
    ggml_context * start(size_t meta_bytes, ggml_backend_dev_t dev) {
        free_memory();
        meta.resize(meta_bytes);
        ggml_init_params ip{meta.size(), meta.data(), /*no_alloc=*/true};
        ctx = ggml_init(ip);
        galloc = ggml_gallocr_new(ggml_backend_dev_buffer_type(dev));
        return ctx;
    }
    void free_memory() {
        if (galloc) {
            ggml_gallocr_free(galloc);
            galloc = nullptr;
        }
        if (ctx) {
            ggml_free(ctx);
            ctx = nullptr;
        }
    }
};

// A session's tree commit graph (build_qwen35_tree_commit_graph): built and allocated on its first
// tree commit, then reused by every commit, which only uploads the moves and computes. It runs on
// the device backend alone (every op is a row gather/scatter or copy) with its own allocator, so
// the draft and forward graphs sharing the schedulers never force a re-allocation.
struct tree_commit_cache : own_graph_memory {
    qwen35_tree_commit graph;  // graph.gf null after a build: the copy-graph fallback serves
    bool built = false;

    void release() {
        free_memory();
        graph = {};
        built = false;
    }
};

// A session's chain commit graphs (build_qwen35_commit_graph), one per (verified, kept) shape,
// built on first use and kept: a commit then only computes. Every node is a view into the session's
// state (checkpoint slot -> state, conv window -> conv state), so nothing is allocated, and each
// shape keeps its own nodes, so the CUDA backend can capture and replay it (its CUDA-graph cache is
// keyed by a graph's first node). One device only (a split commits through its own graphs).
struct chain_commit_cache : own_graph_memory {
    static constexpr size_t MAX_GRAPHS = 32;  // shapes seen: accept lengths of one block size; beyond: start over
    std::map<uint64_t, ggml_cgraph *> graphs;  // the allocator only sets the views' data pointers

    void release() {
        free_memory();
        graphs.clear();
    }
};
}  // namespace

struct session::state {
    graph_cache target_graph;
    std::vector<ggml_fp16_t> mask_staging;  // set_qwen35_inputs' host staging of the attention mask
    tree_commit_cache tree_commit;
    chain_commit_cache chain_commit;
    draft_block_cache draft_block;
    qwen35_state model_state;
    dflash_state draft_state;
    std::vector<ggml_tensor *> draft_rings;  // target feature rings in draft target_layers order
    std::unique_ptr<layer_split_session> split;  // a layer split's per-device views and graphs
    // tensor split: the draft's copies (on its device) of the rings it reads, by capture index
    // (null: not read by the draft), kept equal to the meta rings after every target forward
    std::vector<ggml_tensor *> ring_mirror;
    tensor_store ring_mirror_store;
};

std::unique_ptr<session> engine::new_session() {
    impl & e = *impl_;
    auto st = std::make_unique<session::state>();
    const uint32_t ring = std::max({e.cfg.n_ubatch, 64u, e.verify_width()});
    const uint32_t checkpoints = e.cfg.rollback == "replay" ? 1 : e.verify_width();
    if (e.split) {  // the draft (on e.dev) reads mirrors of the rings it needs
        st->split = e.split->new_session(st->model_state, e.kv_size, e.type_k, e.type_v, e.capture, ring, checkpoints,
                                         e.draft_ring_index, ggml_backend_dev_buffer_type(e.dev), e.dev);
    } else if (e.tsplit) {
        st->model_state = qwen35_state::allocate(e.target.hparams, e.kv_size, e.type_k, e.type_v, e.capture, ring,
                                                 checkpoints, e.tsplit->buffer_type(), e.tsplit->device());
        st->ring_mirror.assign(e.capture.size(), nullptr);
        if (e.draft) {
            std::vector<size_t> idx(e.draft_ring_index);
            std::sort(idx.begin(), idx.end());
            idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
            const int64_t E = e.target.hparams.n_embd, rows = st->model_state.ring_size;
            st->ring_mirror_store = tensor_store::allocate(
                ggml_backend_dev_buffer_type(e.dev), e.dev, idx.size(), [&](ggml_context * ctx) {
                    for (size_t i : idx) {
                        st->ring_mirror[i] = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, E, rows);
                        ggml_format_name(st->ring_mirror[i], "feature_mirror-%d", e.capture[i]);
                    }
                }, "the draft's copies of the feature rings");
        }
    } else {
        const std::vector<bool> fused = qwen35_fused_layers(e.target.hparams, e.w);
        st->model_state = qwen35_state::allocate(e.target.hparams, e.kv_size, e.type_k, e.type_v, e.capture, ring,
                                                 checkpoints, ggml_backend_dev_buffer_type(e.dev), e.dev, nullptr, &fused,
                                                 e.keeps_states());
    }
    if (e.draft) {
        st->draft_state = dflash_state::allocate(e.draft->hparams, e.kv_size, e.type_k, e.type_v,
                                                 ggml_backend_dev_buffer_type(e.dev), e.dev);
        for (size_t i : e.draft_ring_index) {
            st->draft_rings.push_back(st->split            ? st->split->mirror[i]
                                      : e.tsplit ? st->ring_mirror[i]
                                                 : st->model_state.ring[i]);
        }
    }
    return std::unique_ptr<session>(new session(impl_.get(), std::move(st)));
}

session::session(engine::impl * eng, std::unique_ptr<state> st) : eng_(eng), st_(std::move(st)) {}
session::~session() = default;

uint32_t session::n_ctx() const { return eng_->cfg.n_ctx; }
uint32_t session::n_vocab() const { return eng_->target.hparams.n_vocab; }

void session::reset() {
    std::lock_guard<std::mutex> lock(eng_->compute_mutex);
    st_->model_state.clear();
    st_->draft_state.store.clear();
    st_->ring_mirror_store.clear();
    tokens_.clear();
    pending_ = -1;
    n_draft_ctx_ = 0;
}

void session::check_fits(size_t n_new) const {
    n_new += pending_ >= 0 ? 1 : 0;
    if (tokens_.size() + n_new > eng_->cfg.n_ctx) {
        throw config_error("context overflow: " + std::to_string(n_new) + " new tokens + " +
                           std::to_string(tokens_.size()) + " already in the session exceed the context length " +
                           std::to_string(eng_->cfg.n_ctx));
    }
}

namespace {
struct ctx_guard {
    ggml_context * ctx;
    explicit ctx_guard(std::vector<uint8_t> & meta) {
        ggml_init_params ip{meta.size(), meta.data(), /*no_alloc=*/true};
        ctx = ggml_init(ip);
    }
    ~ctx_guard() { ggml_free(ctx); }
};

// Waits for the backend's stream when it goes out of scope, however the scope is left: a
// generation queues its commits (session::commit) without waiting, and no one may read the
// session's state outside that stream before they have landed.
struct stream_drain {
    ggml_backend_t backend;
    ~stream_drain() { ggml_backend_synchronize(backend); }
};

// Tensor split: the rows [n_past, n_past + T) mod ring_size that a forward wrote into the
// (mirrored) meta rings, copied into the draft's plain copies through host memory (the draft
// runs on its own backend, which cannot read a meta tensor).
void mirror_ring_rows(const qwen35_state & st, const std::vector<ggml_tensor *> & mirror, uint32_t n_past,
                      uint32_t T) {
    std::vector<float> rows;
    for (size_t i = 0; i < mirror.size(); ++i) {
        if (mirror[i] == nullptr) {
            continue;
        }
        ggml_tensor * ring = st.ring[i];
        for (uint32_t done = 0; done < T;) {
            const uint32_t row = (n_past + done) % st.ring_size;
            const uint32_t len = std::min(T - done, st.ring_size - row);
            const size_t off = size_t(row) * ring->nb[1], n = size_t(len) * ring->nb[1];
            rows.resize(n / sizeof(float));
            ggml_backend_tensor_get(ring, rows.data(), off, n);
            ggml_backend_tensor_set(mirror[i], rows.data(), off, n);
            done += len;
        }
    }
}

}  // namespace

std::vector<float> session::run_target(const int32_t * tokens, uint32_t T, bool all_logits, int32_t * argmax_last,
                                       bool verify, std::vector<int32_t> * argmax_rows, const spec::draft_tree * tree,
                                       row_candidates * cands) {
    engine::impl & e = *eng_;
    const qwen35_hparams & hp = e.target.hparams;
    const qwen35_state & st = st_->model_state;
    const uint32_t V = hp.n_vocab;
    const uint32_t n_past = static_cast<uint32_t>(tokens_.size());
    const uint32_t n_kv = kv_view_rows(n_past + T, e.kv_size);
    const bool rows_out = all_logits || argmax_rows != nullptr || (cands != nullptr && cands->all_rows);
    const uint32_t n_out = rows_out ? T : 1;
    // candidates: top-C (at most the vocabulary) and the extra ids padded to a power of two >= 16,
    // so that a growing penalty window rebuilds the graph only a few times
    const uint32_t n_cand = cands != nullptr ? std::min(cands->n_cand, V) : 0;
    uint32_t n_extra = 0;
    if (cands != nullptr && !cands->row_ids.empty()) {
        if (!cands->extra_ids.empty() || cands->row_ids.size() != T || !cands->all_rows) {
            throw error("internal: per-row candidate ids need every row and no shared ids");
        }
        n_extra = 16;  // the row's id, repeated (the shape of a short penalty window: no new graph)
    } else if (cands != nullptr && !cands->extra_ids.empty()) {
        n_extra = 16;
        while (n_extra < cands->extra_ids.size()) {
            n_extra *= 2;
        }
    }

    if (st_->split) {
        if (cands != nullptr) {
            throw error("internal: sampling candidates requested on a layer split");
        }
        return e.split->forward(*st_->split, tokens, n_past, T, n_kv, all_logits, argmax_last, verify, argmax_rows);
    }
    const bool want_argmax = argmax_last != nullptr || argmax_rows != nullptr;
    const bool log_norm = n_cand > 0 && cands->log_norm;
    graph_cache & cache = st_->target_graph;
    const std::array<uint32_t, 9> key{T,      n_kv,   n_out,  uint32_t(want_argmax), uint32_t(verify),
                                      uint32_t(tree != nullptr), n_cand, n_extra, uint32_t(log_norm)};
    if (cache.id == 0 || cache.key != key || (e.tsplit && cache.meta_epoch != e.meta_epoch)) {
        ggml_context * ctx = cache.rebuild();
        cache.graph = build_qwen35_graph(ctx, hp, e.w, st, T, n_kv, n_out, want_argmax, verify, tree != nullptr);
        cache.cand = n_cand > 0 ? graph::build_candidates(ctx, cache.graph.gf, cache.graph.logits, n_cand, n_extra,
                                                          log_norm)
                                : graph::candidate_outputs{};
        cache.key = key;
    }
    const qwen35_graph & g = cache.graph;
    if (e.sched_graph_id != cache.id) {
        cache.forget_allocation();
        e.alloc(e.target_sched, g.gf, "a batch of " + std::to_string(T) + " tokens");
        e.sched_graph_id = cache.id;
        cache.meta_epoch = e.meta_epoch;
    }

    set_qwen35_inputs(e.target_sched, g, hp, tokens, n_past, T, n_kv, st.ring_size, tree ? &tree->parents : nullptr,
                      st_->mask_staging);
    if (cache.cand.extra_ids != nullptr) {  // the same ids for every row, padded with the first; or each row's own
        std::vector<int32_t> ids(size_t(n_extra) * n_out);
        for (uint32_t r = 0; r < n_out; ++r) {
            const auto row = ids.begin() + size_t(r) * n_extra;
            if (!cands->row_ids.empty()) {
                std::fill(row, row + n_extra, cands->row_ids[r]);
            } else {
                std::fill(row, row + n_extra, cands->extra_ids[0]);
                std::copy(cands->extra_ids.begin(), cands->extra_ids.end(), row);
            }
        }
        graph::set(e.target_sched, cache.cand.extra_ids, ids.data(), sizeof(int32_t) * ids.size());
    }
    e.compute(e.target_sched, g.gf, "the target forward pass");
    if (e.tsplit) {
        mirror_ring_rows(st, st_->ring_mirror, n_past, T);
    }

    if (n_cand > 0) {
        std::vector<int32_t> top_ids(size_t(n_cand) * n_out);
        std::vector<float> top_logits(top_ids.size()), extra_logits(size_t(n_extra) * n_out);
        ggml_backend_tensor_get(cache.cand.top_ids, top_ids.data(), 0, sizeof(int32_t) * top_ids.size());
        ggml_backend_tensor_get(cache.cand.top_logits, top_logits.data(), 0, sizeof(float) * top_logits.size());
        if (n_extra > 0) {
            ggml_backend_tensor_get(cache.cand.extra_logits, extra_logits.data(), 0,
                                    sizeof(float) * extra_logits.size());
        }
        std::vector<float> row_max, sum_exp;
        if (log_norm) {
            row_max.resize(n_out);
            sum_exp.resize(n_out);
            ggml_backend_tensor_get(cache.cand.row_max, row_max.data(), 0, sizeof(float) * n_out);
            ggml_backend_tensor_get(cache.cand.sum_exp, sum_exp.data(), 0, sizeof(float) * n_out);
        }
        const size_t n_ext = cands->row_ids.empty() ? cands->extra_ids.size() : 1;
        cands->rows.assign(n_out, {});
        for (uint32_t r = 0; r < n_out; ++r) {
            candidate_row & row = cands->rows[r];
            const auto top = top_ids.begin() + size_t(r) * n_cand;
            const auto top_l = top_logits.begin() + size_t(r) * n_cand;
            row.ids.assign(top, top + n_cand);
            row.logits.assign(top_l, top_l + n_cand);
            row.floor = *std::min_element(top_l, top_l + n_cand);
            if (cands->row_ids.empty()) {
                row.ids.insert(row.ids.end(), cands->extra_ids.begin(), cands->extra_ids.end());
            } else {
                row.ids.push_back(cands->row_ids[r]);
            }
            const auto ext_l = extra_logits.begin() + size_t(r) * n_extra;
            row.logits.insert(row.logits.end(), ext_l, ext_l + n_ext);
            if (log_norm) {
                row.log_norm = float(double(row_max[r]) + std::log(double(sum_exp[r])));
            }
        }
    }

    return read_qwen35_outputs(g, T, all_logits, /*last_logits=*/n_cand == 0, argmax_last, argmax_rows);
}

logit_row session::sampling_row(row_candidates & cands, uint32_t r) {
    logit_row row;
    if (r < cands.rows.size()) {
        row.candidates = &cands.rows[r];
    }
    row.full = [this, r, &cands] {
        const qwen35_graph & g = st_->target_graph.graph;
        const uint32_t V = n_vocab();
        if (g.logits == nullptr || r >= g.logits->ne[1]) {
            throw error("internal: logits row " + std::to_string(r) + " of the last target batch is not available");
        }
        cands.logits.resize(V);
        ggml_backend_tensor_get(g.logits, cands.logits.data(), size_t(r) * V * sizeof(float), V * sizeof(float));
        return static_cast<const float *>(cands.logits.data());
    };
    return row;
}

namespace {
// More penalized ids than this (a long penalty_last_n = -1 window) and whole rows are cheaper.
constexpr size_t MAX_EXTRA_IDS = 1024;
}  // namespace

session::row_candidates session::candidates_for(const sampler & smp, int32_t n_top) const {
    row_candidates c;
    if (eng_->split) {
        return c;  // a layer split returns whole rows
    }
    c.n_cand = static_cast<uint32_t>(smp.wanted_candidates());
    if (n_top >= 0) {  // logprobs: the top alternatives and the token itself, usually among 64
        c.n_cand = std::max<uint32_t>(c.n_cand, 64);
        c.log_norm = true;
    }
    return c;
}

bool session::plan_candidates(row_candidates & cands, const sampler & smp, const std::vector<int32_t> & history,
                              const int32_t * batch, uint32_t n_batch) const {
    if (cands.n_cand == 0) {
        return false;
    }
    cands.extra_ids = smp.penalty_ids(history);
    if (smp.params().has_window_penalties() && n_batch > 0) {
        cands.extra_ids.insert(cands.extra_ids.end(), batch, batch + n_batch);
        std::sort(cands.extra_ids.begin(), cands.extra_ids.end());
        cands.extra_ids.erase(std::unique(cands.extra_ids.begin(), cands.extra_ids.end()), cands.extra_ids.end());
    }
    return cands.extra_ids.size() <= MAX_EXTRA_IDS;
}

int32_t session::forward_and_sample(const int32_t * tokens, uint32_t n, sampler & smp,
                                    const std::vector<int32_t> & history, row_candidates & cands,
                                    const progress_callback & progress, token_logprobs * lp, uint32_t n_top) {
    const int32_t V = static_cast<int32_t>(n_vocab());
    logit_row row;
    if (plan_candidates(cands, smp, history, nullptr, 0)) {
        cands.all_rows = false;
        forward(tokens, n, false, nullptr, progress, &cands);
        row = sampling_row(cands, 0);
    } else {
        cands.logits = forward(tokens, n, false, nullptr, progress);
        row.full = [&cands] { return static_cast<const float *>(cands.logits.data()); };
    }
    const int32_t tok = smp.sample(row, V, history);
    if (lp != nullptr) {
        *lp = logprobs_of(row, tok, n_top, V);
    }
    return tok;
}

std::function<logit_row(size_t)> session::run_target_sampled(const int32_t * tokens, uint32_t n, bool verify,
                                                             const spec::draft_tree * tree, const sampler & smp,
                                                             row_candidates & cands) {
    if (plan_candidates(cands, smp, tokens_, tokens, n)) {  // later rows' windows hold batch tokens
        cands.all_rows = true;
        run_target(tokens, n, false, nullptr, verify, nullptr, tree, &cands);
        return [this, &cands](size_t r) { return sampling_row(cands, uint32_t(r)); };
    }
    cands.logits = run_target(tokens, n, true, nullptr, verify, nullptr, tree);
    const size_t V = n_vocab();
    return [&cands, V](size_t r) {
        logit_row row;
        row.full = [&cands, r, V] { return static_cast<const float *>(cands.logits.data() + r * V); };
        return row;
    };
}

std::vector<int32_t> session::run_draft(int32_t last, uint32_t block, spec::draft_topk * topk) {
    engine::impl & e = *eng_;
    if (!e.draft) {
        throw error("internal: a draft forward on an engine without a draft");
    }
    const dflash_hparams & dh = e.draft->hparams;
    const uint32_t n_past = static_cast<uint32_t>(tokens_.size());
    const uint32_t n_inject = n_past - n_draft_ctx_;
    if (n_inject > st_->model_state.ring_size) {
        throw error("internal: " + std::to_string(n_inject) + " positions to inject exceed the feature ring");
    }
    if (n_inject == 0 && block == 0) {
        return {};
    }
    const uint32_t n_kv = std::min(e.kv_size, pad_to(n_past + block, KV_PAD));
    const uint32_t top_k = topk != nullptr && block > 1 ? std::min(topk->k, e.target.hparams.n_vocab) : 0;
    if (n_inject > 0) {  // the context update: K/V of the newly committed positions (a graph per step)
        ctx_guard g_ctx(e.graph_meta);
        dflash_graph gc = build_dflash_graph(g_ctx.ctx, dh, e.dw, st_->draft_state, st_->draft_rings, n_inject, 0,
                                             n_kv, e.target.hparams.n_ctx_train, 0);
        e.alloc(e.sched_aux, gc.gf, "the draft context update");
        std::vector<int64_t> kv_rows(n_inject);
        std::vector<int32_t> pos(n_inject), ring_rows(n_inject);
        for (uint32_t i = 0; i < n_inject; ++i) {
            const uint32_t p = n_draft_ctx_ + i;
            ring_rows[i] = static_cast<int32_t>(p % st_->model_state.ring_size);
            kv_rows[i] = p;
            pos[i] = static_cast<int32_t>(p);
        }
        graph::set(e.sched_aux, gc.in.ctx_ring_rows, ring_rows.data(), sizeof(int32_t) * n_inject);
        graph::set(e.sched_aux, gc.in.ctx_kv_rows, kv_rows.data(), sizeof(int64_t) * n_inject);
        graph::set(e.sched_aux, gc.in.ctx_pos, pos.data(), sizeof(int32_t) * n_inject);
        e.compute(e.sched_aux, gc.gf, "the draft context update");
        n_draft_ctx_ = n_past;
    }
    if (block == 0) {
        return {};
    }
    // the proposal block [last, MASK x (block-1)] at positions n_past..: a kept graph (only its
    // inputs change from step to step)
    draft_block_cache & cache = st_->draft_block;
    const std::array<uint32_t, 9> key{block, n_kv, top_k, 0, 0, 0, 0, 0, 0};
    if (cache.id == 0 || cache.key != key) {
        ggml_context * ctx = cache.rebuild();
        cache.graph = build_dflash_graph(ctx, dh, e.dw, st_->draft_state, st_->draft_rings, 0, block, n_kv,
                                         e.target.hparams.n_ctx_train, top_k);
        cache.key = key;
    }
    const dflash_graph & g = cache.graph;
    if (e.sched_draft_graph_id != cache.id) {
        cache.forget_allocation();
        e.alloc(e.sched_draft, g.gf, "the draft block");
        e.sched_draft_graph_id = cache.id;
    }
    {
        std::vector<int32_t> toks(block, static_cast<int32_t>(dh.mask_token_id)), pos(block);
        std::vector<int64_t> rows(block);
        toks[0] = last;
        for (uint32_t i = 0; i < block; ++i) {
            pos[i] = static_cast<int32_t>(n_past + i);
            rows[i] = n_past + i;
        }
        graph::set(e.sched_draft, g.in.block_tokens, toks.data(), sizeof(int32_t) * block);
        graph::set(e.sched_draft, g.in.block_pos, pos.data(), sizeof(int32_t) * block);
        graph::set(e.sched_draft, g.in.block_kv_rows, rows.data(), sizeof(int64_t) * block);
        // context rows [0, n_past) then the block (models/dflash_model.h: dflash_block_mask), as each
        // row's key range where the graph builds the mask, else the mask itself
        std::vector<ggml_fp16_t> & mask = cache.mask_staging;
        for (const bool swa : {false, true}) {
            ggml_tensor * ranges = swa ? g.in.kq_ranges_swa : g.in.kq_ranges;
            ggml_tensor * host_mask = swa ? g.in.kq_mask_swa : g.in.kq_mask;
            if (ranges != nullptr) {
                const std::vector<int32_t> r = dflash_block_ranges(dh, swa, n_past, block);
                graph::set(e.sched_draft, ranges, r.data(), sizeof(int32_t) * r.size());
            } else if (host_mask != nullptr) {
                dflash_block_mask(dh, swa, n_past, block, n_kv, mask);
                graph::set(e.sched_draft, host_mask, mask.data(), sizeof(ggml_fp16_t) * mask.size());
            }
        }
    }
    e.compute(e.sched_draft, g.gf, "the draft forward pass");
    std::vector<int32_t> proposals(block - 1);
    ggml_backend_tensor_get(g.argmax, proposals.data(), 0, sizeof(int32_t) * (block - 1));
    for (uint32_t d = 0; d + 1 < block; ++d) {  // (-1: a row of NaN logits on CUDA; qwen35.cpp, check_argmax)
        if (proposals[d] < 0 || proposals[d] >= int32_t(g.logits->ne[0])) {
            throw error("the draft's logits at block position " + std::to_string(d + 1) +
                        " are not finite (NaN): the draft's weights hold NaN or its computation overflowed");
        }
    }
    if (top_k > 0) {  // per position: the top_k candidates sorted best first (ties: lower id), log-probs
        const size_t n = size_t(top_k) * (block - 1);
        std::vector<int32_t> ids(n);
        std::vector<float> probs(n);
        ggml_backend_tensor_get(g.topk_ids, ids.data(), 0, sizeof(int32_t) * n);
        ggml_backend_tensor_get(g.topk_probs, probs.data(), 0, sizeof(float) * n);
        topk->depth = block - 1;
        topk->k = top_k;
        topk->tokens.resize(n);
        topk->logp.resize(n);
        std::vector<uint32_t> order(top_k);
        for (uint32_t d = 0; d + 1 < block; ++d) {
            const size_t base = size_t(d) * top_k;
            for (uint32_t r = 0; r < top_k; ++r) order[r] = r;
            std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
                const float pa = probs[base + a], pb = probs[base + b];
                return pa != pb ? pa > pb : ids[base + a] < ids[base + b];
            });
            for (uint32_t r = 0; r < top_k; ++r) {
                topk->tokens[base + r] = ids[base + order[r]];
                // an underflowed probability still ranks last with a finite score
                topk->logp[base + r] = std::max(std::log(probs[base + order[r]]), -1e30f);
            }
        }
    }
    return proposals;
}

std::vector<int32_t> session::draft_proposals(int32_t last) {
    if (!eng_->draft) {
        throw config_error("draft_proposals: the engine has no draft model");
    }
    if (last < 0 || static_cast<uint32_t>(last) >= n_vocab()) {
        throw config_error("draft_proposals: token id " + std::to_string(last) + " is outside the vocabulary");
    }
    if (pending_ >= 0) {
        throw config_error("draft_proposals: the session has a pending generated token");
    }
    const uint32_t block = std::min(eng_->block_size(), eng_->cfg.n_ctx - n_past());
    if (block < 2) {
        throw config_error("draft_proposals: no room left in the context for a proposal block");
    }
    std::lock_guard<std::mutex> lock(eng_->compute_mutex);
    return run_draft(last, block);
}

namespace {

std::string layout_fingerprint(const engine::impl & e) {
    const qwen35_hparams & hp = e.target.hparams;
    std::string f = "qwen35 E" + std::to_string(hp.n_embd) + " L" + std::to_string(hp.n_layer) + " V" +
                    std::to_string(hp.n_vocab) + " kv" + std::to_string(hp.n_head_kv) + "x" + std::to_string(hp.head_dim) +
                    " ssm" + std::to_string(hp.ssm_d_conv) + "/" + std::to_string(hp.ssm_d_state) + "/" +
                    std::to_string(hp.ssm_n_k_heads) + "/" + std::to_string(hp.ssm_n_v_heads) + " pattern ";
    for (bool r : hp.is_recurrent) {
        f += r ? 'R' : 'A';
    }
    f += std::string(" K ") + ggml_type_name(e.type_k) + " V " + ggml_type_name(e.type_v);
    if (e.draft) {
        const dflash_hparams & d = e.draft->hparams;
        f += " dflash L" + std::to_string(d.n_layer) + " kv" + std::to_string(d.n_head_kv) + "x" + std::to_string(d.head_dim);
        for (int32_t l : d.target_layers) {
            f += "," + std::to_string(l);
        }
    }
    return f;
}

// The tensors a snapshot holds, in order, with the bytes of each that are saved.
std::vector<std::pair<ggml_tensor *, size_t>> snapshot_layout(const engine::impl & e, const qwen35_state & st,
                                                              const dflash_state * ds, uint32_t n_past) {
    std::vector<std::pair<ggml_tensor *, size_t>> out;
    const qwen35_hparams & hp = e.target.hparams;
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        if (hp.is_recurrent[il]) {
            out.emplace_back(st.conv[il], ggml_nbytes(st.conv[il]));
            out.emplace_back(st.ssm[il], ggml_nbytes(st.ssm[il]));
        } else {
            out.emplace_back(st.k[il], st.k[il]->nb[1] * n_past);  // rows [0, n_past) are contiguous
            out.emplace_back(st.v[il], st.v[il]->nb[1] * n_past);
        }
    }
    if (ds != nullptr) {
        for (size_t il = 0; il < ds->k.size(); ++il) {
            out.emplace_back(ds->k[il], ds->k[il]->nb[1] * n_past);
            out.emplace_back(ds->v[il], ds->v[il]->nb[1] * n_past);
        }
    }
    return out;
}

// Copies every region between the session state and `data` (to_snapshot: state -> data, else
// data -> state), queued on the engine's backend, then waits once. Host data (pinned or plain) is
// read and written with tensor_get/set_async (direct DMA from pinned memory on CUDA); device data
// with device-to-device tensor copies between 1-D I8 byte views of the state tensors' leading
// bytes and the data's regions. Region i is the first layout[i].second bytes of layout[i].first.
void copy_regions(engine::impl & e, const std::vector<std::pair<ggml_tensor *, size_t>> & layout,
                  const snapshot_data & data, bool to_snapshot) {
    // Byte views first (the only step that can fail), so nothing is queued when it does.
    std::vector<ggml_tensor *> views(layout.size(), nullptr);
    std::vector<uint8_t> meta;
    std::unique_ptr<ggml_context, void (*)(ggml_context *)> ctx(nullptr, [](ggml_context * c) { ggml_free(c); });
    if (!data.is_host() && !e.tsplit) {
        meta.resize(ggml_tensor_overhead() * (layout.size() + 1));
        ggml_init_params ip{meta.size(), meta.data(), /*no_alloc=*/true};
        ctx.reset(ggml_init(ip));
        for (size_t i = 0; i < layout.size(); ++i) {
            ggml_tensor * state = layout[i].first;
            if (layout[i].second == 0) {
                continue;
            }
            views[i] = ggml_new_tensor_1d(ctx.get(), GGML_TYPE_I8, static_cast<int64_t>(layout[i].second));
            if (ggml_backend_tensor_alloc(state->buffer, views[i], state->data) != GGML_STATUS_SUCCESS) {
                throw error("internal: could not view the state tensor " + std::string(ggml_get_name(state)));
            }
        }
    }
    for (size_t i = 0; i < layout.size(); ++i) {
        ggml_tensor * state = layout[i].first;
        const size_t n = layout[i].second;
        ggml_tensor * region = data.region(i);
        if (n == 0) {
            continue;
        }
        if (e.tsplit) {
            // meta tensors: ggml gathers (get) or deals (set) the devices' slices in the tensor's
            // one-device layout, so a snapshot is the same bytes as on one device. Device data goes
            // through host memory (synchronous; a meta tensor has no device address to copy from).
            if (data.is_host()) {
                if (to_snapshot) {
                    ggml_backend_tensor_get(state, region->data, 0, n);
                } else {
                    ggml_backend_tensor_set(state, region->data, 0, n);
                }
            } else {
                std::vector<uint8_t> staging(n);
                ggml_tensor * from = to_snapshot ? state : region;
                ggml_tensor * to = to_snapshot ? region : state;
                ggml_backend_tensor_get(from, staging.data(), 0, n);
                ggml_backend_tensor_set(to, staging.data(), 0, n);
            }
        } else if (e.split) {  // the state spans devices: synchronous copies, each on its tensor's own device
            if (data.is_host() && to_snapshot) {
                ggml_backend_tensor_get(state, region->data, 0, n);
            } else if (data.is_host()) {
                ggml_backend_tensor_set(state, region->data, 0, n);
            } else if (to_snapshot) {
                ggml_backend_tensor_copy(views[i], region);
            } else {
                ggml_backend_tensor_copy(region, views[i]);
            }
        } else if (data.is_host()) {
            if (to_snapshot) {
                ggml_backend_tensor_get_async(e.backend, state, region->data, 0, n);
            } else {
                ggml_backend_tensor_set_async(e.backend, state, region->data, 0, n);
            }
        } else if (to_snapshot) {
            ggml_backend_tensor_copy_async(e.backend, e.backend, views[i], region);
        } else {
            ggml_backend_tensor_copy_async(e.backend, e.backend, region, views[i]);
        }
    }
    ggml_backend_synchronize(e.backend);
}
}  // namespace

session_snapshot session::snapshot(snapshot_location where) {
    engine::impl & e = *eng_;
    std::lock_guard<std::mutex> lock(e.compute_mutex);
    if (e.draft && n_draft_ctx_ < tokens_.size()) {
        run_draft(-1, 0);  // the draft catches up, so its KV rows cover every evaluated position
    }
    const uint32_t n_past = static_cast<uint32_t>(tokens_.size());
    const auto layout = snapshot_layout(e, st_->model_state, e.draft ? &st_->draft_state : nullptr, n_past);
    std::vector<uint64_t> sizes;
    for (const auto & region : layout) {
        sizes.push_back(region.second);
    }
    // Allocated before anything is copied: out of memory here leaves nothing changed.
    auto data = std::make_shared<snapshot_data>(sizes, snapshot_buffer_type(e.dev, where), where);
    copy_regions(e, layout, *data, /*to_snapshot=*/true);
    session_snapshot snap;
    snap.fingerprint = layout_fingerprint(e);
    snap.tokens = tokens_;
    snap.pending = pending_;
    snap.data = std::move(data);
    return snap;
}

uint64_t session::state_bytes() const {
    const qwen35_state & ms = st_->model_state;
    uint64_t n = ms.store.size_bytes() + st_->draft_state.store.size_bytes() + st_->ring_mirror_store.size_bytes();
    for (const tensor_store & more : ms.more_stores) {
        n += more.size_bytes();
    }
    return n;
}

uint64_t session::snapshot_bytes() const {
    uint64_t n = tokens_.size() * sizeof(int32_t);
    const uint32_t n_past = static_cast<uint32_t>(tokens_.size());
    const dflash_state * ds = eng_->draft ? &st_->draft_state : nullptr;
    for (const auto & region : snapshot_layout(*eng_, st_->model_state, ds, n_past)) {
        n += region.second;
    }
    return n;
}

void session::restore(const session_snapshot & snap) {
    engine::impl & e = *eng_;
    const std::string want = layout_fingerprint(e);
    if (snap.fingerprint != want) {
        throw config_error("snapshot does not fit this engine: it was taken with layout '" + snap.fingerprint +
                           "', this engine has '" + want + "'");
    }
    const size_t need = snap.tokens.size() + (snap.pending >= 0 ? 1 : 0);
    if (need > e.cfg.n_ctx) {
        throw config_error("snapshot holds " + std::to_string(need) + " tokens, more than this engine's context " +
                           std::to_string(e.cfg.n_ctx));
    }
    const uint32_t n_past = static_cast<uint32_t>(snap.tokens.size());
    const auto layout = snapshot_layout(e, st_->model_state, e.draft ? &st_->draft_state : nullptr, n_past);
    const std::vector<uint64_t> sizes = snap.region_sizes();
    if (!snap.data || layout.size() != sizes.size()) {
        throw config_error("snapshot has " + std::to_string(sizes.size()) + " tensors, expected " +
                           std::to_string(layout.size()));
    }
    for (size_t i = 0; i < layout.size(); ++i) {
        if (sizes[i] != layout[i].second) {
            throw config_error("snapshot tensor " + std::to_string(i) + " has " + std::to_string(sizes[i]) +
                               " bytes, expected " + std::to_string(layout[i].second));
        }
    }
    for (int32_t t : snap.tokens) {
        if (t < 0 || static_cast<uint32_t>(t) >= n_vocab()) {
            throw config_error("snapshot holds token id " + std::to_string(t) + " outside the vocabulary");
        }
    }
    std::lock_guard<std::mutex> lock(e.compute_mutex);
    st_->model_state.clear();
    st_->draft_state.store.clear();
    copy_regions(e, layout, *snap.data, /*to_snapshot=*/false);
    tokens_ = snap.tokens;
    pending_ = snap.pending;
    n_draft_ctx_ = e.draft ? n_past : 0;
}

session_snapshot engine::copy_snapshot(const session_snapshot & snap, snapshot_location where) const {
    ggml_backend_buffer_type_t buft = snapshot_buffer_type(impl_->dev, where);
    if (!snap.data || (snap.data->buffer_type() == buft && snap.data->location() == where)) {
        return snap;
    }
    session_snapshot s = snap;
    s.data = copy_snapshot_data(*snap.data, buft, where);
    return s;
}

session_snapshot engine::load_snapshot(const std::string & path, snapshot_location where) const {
    return load_snapshot_file(path, snapshot_buffer_type(impl_->dev, where), where);
}

void session::commit(uint32_t n_verified, uint32_t last_kept) {
    engine::impl & e = *eng_;
    if (st_->split) {
        e.split->commit(*st_->split, n_verified, last_kept);
        return;
    }
    const qwen35_hparams & hp = e.target.hparams;
    if (hp.n_recurrent_layers() == 0) {
        return;  // nothing to roll back
    }
    if (e.tsplit) {  // the meta device: through its scheduler
        ctx_guard g_ctx(e.graph_meta);
        ggml_cgraph * gf = build_qwen35_commit_graph(g_ctx.ctx, hp, st_->model_state, n_verified, last_kept);
        e.alloc(e.state_sched, gf, "the commit");
        e.compute(e.state_sched, gf, "the commit");
        return;
    }
    chain_commit_cache & c = st_->chain_commit;
    const uint64_t key = (uint64_t(n_verified) << 32) | last_kept;
    auto it = c.graphs.find(key);
    if (it == c.graphs.end()) {
        if (c.graphs.size() >= chain_commit_cache::MAX_GRAPHS || c.ctx == nullptr) {
            c.release();
            // per graph: 5 tensors (two views, a reshape, two copies) and 2 nodes per DeltaNet layer
            const size_t per_graph = ggml_tensor_overhead() * (5 * size_t(hp.n_layer) + 4) +
                                     ggml_graph_overhead_custom(4 * size_t(hp.n_layer) + 16, false);
            c.start(per_graph * chain_commit_cache::MAX_GRAPHS, e.dev);
        }
        ggml_cgraph * gf = build_qwen35_commit_graph(c.ctx, hp, st_->model_state, n_verified, last_kept);
        if (!ggml_gallocr_alloc_graph(c.galloc, gf)) {
            c.release();
            throw out_of_memory_error(std::string("out of memory setting up the commit on ") + ggml_backend_dev_name(e.dev));
        }
        it = c.graphs.emplace(key, gf).first;
    }
    // not waited for: the next forward pass (same stream) runs after it; generate() synchronizes
    // before it returns
    e.queue_on_device(it->second, "the commit");
}

void session::commit_tree(uint32_t n_verified, const std::vector<int32_t> & path) {
    engine::impl & e = *eng_;
    const qwen35_hparams & hp = e.target.hparams;
    const qwen35_state & st = st_->model_state;
    tree_commit_cache & c = st_->tree_commit;
    if (!c.built) {
        c.release();  // what a build that threw left
        c.start(ggml_tensor_overhead() * (32 * size_t(hp.n_layer) + 64) +
                    ggml_graph_overhead_custom(16 * size_t(hp.n_layer) + 4 * st.ring.size() + 32, false),
                e.dev);
        c.graph = build_qwen35_tree_commit_graph(c.ctx, hp, st);
        if (c.graph.gf != nullptr) {
            if (!ggml_gallocr_alloc_graph(c.galloc, c.graph.gf)) {
                throw out_of_memory_error(std::string("out of memory allocating the tree commit on ") +
                                          ggml_backend_dev_name(e.dev));
            }
        }
        c.built = true;
    }
    if (c.graph.gf == nullptr) {  // KV rows that cannot be aliased as words: a copy graph per commit
        ctx_guard g_ctx(e.graph_meta);
        ggml_cgraph * gf = build_qwen35_tree_commit_copy_graph(g_ctx.ctx, hp, st, n_verified, n_past(), path);
        if (ggml_graph_n_nodes(gf) > 0) {
            e.alloc(e.state_sched, gf, "the tree commit");
            e.compute(e.state_sched, gf, "the tree commit");
        }
        return;
    }
    const std::vector<int32_t> moves = qwen35_tree_commit_moves(c.graph, hp, st, n_verified, n_past(), path);
    ggml_backend_tensor_set(c.graph.moves, moves.data(), 0, sizeof(int32_t) * moves.size());
    e.compute_on_device(c.graph.gf, "the tree commit");
}

void session::backup_state(bool backup) {
    engine::impl & e = *eng_;
    if (st_->split) {
        e.split->backup(*st_->split, backup);
        return;
    }
    ctx_guard g_ctx(e.graph_meta);
    ggml_cgraph * gf = build_qwen35_backup_graph(g_ctx.ctx, e.target.hparams, st_->model_state, backup);
    if (ggml_graph_n_nodes(gf) == 0) {
        return;  // no DeltaNet layers
    }
    e.alloc(e.state_sched, gf, "the state backup");
    e.compute(e.state_sched, gf, "the state backup");
}

std::vector<float> session::forward(const int32_t * tokens, uint32_t n, bool all_logits, int32_t * argmax,
                                    const progress_callback & progress, row_candidates * cands) {
    engine::impl & e = *eng_;
    const uint32_t V = e.target.hparams.n_vocab;
    std::vector<float> logits;
    if (all_logits) {
        logits.reserve(size_t(n) * V);
    }
    for (uint32_t done = 0; done < n;) {
        const uint32_t T = std::min(e.cfg.n_ubatch, n - done);
        const bool last_chunk = done + T == n;
        std::vector<float> part = run_target(tokens + done, T, all_logits, last_chunk ? argmax : nullptr, false, nullptr,
                                             nullptr, last_chunk ? cands : nullptr);
        tokens_.insert(tokens_.end(), tokens + done, tokens + done + T);
        if (e.draft) {
            run_draft(-1, 0);  // keep the draft's context in step (the feature ring holds one micro-batch)
        }
        if (all_logits) {
            logits.insert(logits.end(), part.begin(), part.end());
        } else if (last_chunk && argmax == nullptr && cands == nullptr) {
            logits = std::move(part);
        }
        done += T;
        if (progress) {
            progress(done, n);
        }
    }
    return logits;
}

void session::check_appendable(const std::vector<int32_t> & tokens, const char * what) const {
    if (tokens.empty()) {
        throw config_error(std::string(what) + ": no tokens given");
    }
    if (pending_ >= 0) {
        throw config_error(std::string(what) + ": the session has a pending generated token; pass it first or reset");
    }
    check_fits(tokens.size());
    check_token_ids(tokens, n_vocab(), "");
}

std::vector<float> session::eval(const std::vector<int32_t> & tokens, bool all_logits) {
    check_appendable(tokens, "eval");
    std::lock_guard<std::mutex> lock(eng_->compute_mutex);
    return forward(tokens.data(), static_cast<uint32_t>(tokens.size()), all_logits, nullptr);
}

std::vector<token_logprobs> session::score(const std::vector<int32_t> & tokens, uint32_t n_top, int32_t next) {
    if (n_top > MAX_TOP_LOGPROBS) {
        throw config_error("score: " + std::to_string(n_top) + " alternatives asked, at most " +
                           std::to_string(MAX_TOP_LOGPROBS));
    }
    const uint32_t V = n_vocab();
    if (next >= 0 && static_cast<uint32_t>(next) >= V) {
        throw config_error("score: next token id " + std::to_string(next) + " is outside the vocabulary [0, " +
                           std::to_string(V) + ")");
    }
    check_appendable(tokens, "score");
    engine::impl & e = *eng_;
    std::lock_guard<std::mutex> lock(e.compute_mutex);
    const uint32_t n = static_cast<uint32_t>(tokens.size());
    std::vector<token_logprobs> out;
    out.reserve(n);
    row_candidates cands;
    cands.n_cand = e.split ? 0 : 64;  // a layer split returns whole rows
    cands.all_rows = true;
    cands.log_norm = true;
    for (uint32_t done = 0; done < n;) {
        const uint32_t T = std::min(e.cfg.n_ubatch, n - done);
        // row r scores the token after it: the next micro-batch's first, or `next` after the last row
        auto target = [&](uint32_t r) { return done + r + 1 < n ? tokens[done + r + 1] : next; };
        std::vector<float> whole;
        if (cands.n_cand > 0) {
            cands.row_ids.resize(T);
            for (uint32_t r = 0; r < T; ++r) {
                cands.row_ids[r] = std::max(target(r), 0);  // a row with nothing to score looks up id 0
            }
            run_target(tokens.data() + done, T, false, nullptr, false, nullptr, nullptr, &cands);
        } else {
            whole = run_target(tokens.data() + done, T, true, nullptr, false, nullptr);
        }
        for (uint32_t r = 0; r < T; ++r) {
            if (target(r) < 0) {
                continue;
            }
            logit_row row;
            if (cands.n_cand > 0) {
                row = sampling_row(cands, r);
            } else {
                row.full = [&whole, r, V] { return static_cast<const float *>(whole.data() + size_t(r) * V); };
            }
            out.push_back(logprobs_of(row, target(r), n_top, static_cast<int32_t>(V)));
        }
        tokens_.insert(tokens_.end(), tokens.begin() + done, tokens.begin() + done + T);
        if (e.draft) {
            run_draft(-1, 0);  // keep the draft's context in step (the feature ring holds one micro-batch)
        }
        done += T;
    }
    return out;
}

generate_result session::generate(const std::vector<int32_t> & prompt, const generate_params & params,
                                  const token_callback & on_token) {
    params.sampling.validate();
    if (prompt.empty() && pending_ < 0) {
        throw config_error("generate: the prompt is empty and the session has no pending token to continue from");
    }
    check_fits(prompt.size());
    const uint32_t V = n_vocab();
    check_token_ids(prompt, V, "prompt ");
    if (params.block_size > MAX_FORCED_BLOCK) {
        throw config_error("generate: block_size " + std::to_string(params.block_size) + " exceeds " +
                           std::to_string(MAX_FORCED_BLOCK));
    }
    check_token_ids(params.prediction, V, "prediction ");
    for (const auto & [id, bias] : params.sampling.logit_bias) {
        if (static_cast<uint32_t>(id) >= V) {
            throw config_error("logit_bias token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                               std::to_string(V) + ")");
        }
    }
    if (params.logprobs < -1 || params.logprobs > int32_t(MAX_TOP_LOGPROBS)) {
        throw config_error("generate: logprobs " + std::to_string(params.logprobs) + " must be -1 (off) or in [0, " +
                           std::to_string(MAX_TOP_LOGPROBS) + "]");
    }

    if (params.propose && params.propose_tree) {
        throw config_error("generate: pass propose or propose_tree, not both");
    }
    const bool tree = params.propose_tree || (eng_->cfg.spec == "tree" && eng_->draft && !params.propose);
    if (tree && (eng_->split || eng_->tsplit)) {
        throw config_error(std::string("generate: tree verification is not supported on a ") +
                           (eng_->split ? "layer" : "tensor") + " split");
    }
    if (tree && eng_->cfg.rollback != "fast") {
        throw config_error("generate: tree verification needs rollback 'fast'");
    }

    // Feed the previous call's last token (emitted but not yet evaluated), then the prompt.
    std::vector<int32_t> pending;
    if (pending_ >= 0) {
        pending.push_back(pending_);
    }
    pending.insert(pending.end(), prompt.begin(), prompt.end());
    pending_ = -1;

    const bool with_logprobs = params.logprobs >= 0;  // then every row goes through the sampler's candidates
    const bool greedy = params.argmax_only();
    const bool spec_available =
        eng_->cfg.spec != "off" || params.propose || params.propose_tree || !params.prediction.empty();

    if (spec_available) {
        return generate_speculative(pending, params, on_token);
    }

    generate_result res;
    sampler smp(params.sampling, params.constraint);
    auto is_stop = [&](int32_t t) {
        return std::find(params.stop_tokens.begin(), params.stop_tokens.end(), t) != params.stop_tokens.end();
    };
    std::vector<int32_t> history(tokens_);
    history.insert(history.end(), pending.begin(), pending.end());
    // Sampling reads the device's candidates of the new row (the full row only when they cannot
    // decide), so each forward and its pick run under the engine lock; emission runs outside it.
    row_candidates cands = candidates_for(smp, params.logprobs);
    int32_t next = -1;
    token_logprobs next_lp;
    auto forward_and_pick = [&](const int32_t * toks, uint32_t n, const progress_callback & progress) {
        std::lock_guard<std::mutex> lock(eng_->compute_mutex);
        if (greedy) {
            forward(toks, n, false, &next, progress);
        } else {
            next = forward_and_sample(toks, n, smp, history, cands, progress, with_logprobs ? &next_lp : nullptr,
                                      uint32_t(std::max(params.logprobs, 0)));
        }
    };
    const auto t0 = clock::now();
    forward_and_pick(pending.data(), static_cast<uint32_t>(pending.size()), params.on_prefill);
    res.stats.n_prompt = static_cast<uint32_t>(pending.size());
    const auto t1 = clock::now();
    res.stats.prefill_seconds = seconds_since(t0);

    res.finish_reason = "length";
    while (res.tokens.size() < params.max_tokens) {
        if (is_stop(next)) {
            res.finish_reason = "stop";
            break;
        }
        res.tokens.push_back(next);
        history.push_back(next);
        if (with_logprobs) {
            res.logprobs.push_back(next_lp);
        }
        if (on_token && !on_token(next, with_logprobs ? &next_lp : nullptr)) {
            res.finish_reason = "cancelled";
            break;
        }
        if (res.tokens.size() >= params.max_tokens) {
            break;
        }
        if (tokens_.size() >= eng_->cfg.n_ctx) {
            res.finish_reason = "context";
            break;
        }
        const int32_t fed = next;  // `next` receives the new token; forward records `fed`
        forward_and_pick(&fed, 1, {});
    }
    if (res.finish_reason != "stop" && !res.tokens.empty()) {
        pending_ = res.tokens.back();  // emitted, evaluated by the next call
    }
    res.stats.n_generated = static_cast<uint32_t>(res.tokens.size());
    res.stats.decode_seconds = seconds_since(t1);
    return res;
}

generate_result session::generate_speculative(const std::vector<int32_t> & pending, const generate_params & params,
                                              const token_callback & on_token) {
    engine::impl & e = *eng_;
    generate_result res;
    generate_stats & stats = res.stats;
    stats.speculative = true;
    const uint32_t block = e.draft ? e.block_size() : (params.block_size ? params.block_size : MAX_FORCED_BLOCK);
    stats.accept_histogram.assign(block, 0);
    auto is_stop = [&](int32_t t) {
        return std::find(params.stop_tokens.begin(), params.stop_tokens.end(), t) != params.stop_tokens.end();
    };

    const bool with_logprobs = params.logprobs >= 0;  // then every row goes through the sampler's candidates
    const uint32_t n_top = uint32_t(std::max(params.logprobs, 0));
    const bool greedy = params.argmax_only();
    const stream_drain drain{e.backend};
    sampler smp(params.sampling, params.constraint);
    // sampled steps read the device's candidates of each row (the full row only when they cannot decide)
    row_candidates cands = candidates_for(smp, params.logprobs);
    // A step's tokens go out through emit_step in row order; with logprobs, step_lps[j] is the j-th's.
    std::vector<token_logprobs> step_lps(1);
    size_t step_emitted = 0;
    const std::function<bool(int32_t)> emit_step = [&](int32_t tok) {
        const token_logprobs * lp = nullptr;
        if (with_logprobs) {
            if (step_emitted >= step_lps.size()) {
                throw error("internal: a step emitted more tokens than it has logprobs for");
            }
            lp = &step_lps[step_emitted++];
            res.logprobs.push_back(*lp);
        }
        return !on_token || on_token(tok, lp);
    };
    const auto t0 = clock::now();
    int32_t last = -1;  // emitted, not yet evaluated
    {
        std::lock_guard<std::mutex> lock(e.compute_mutex);
        const uint32_t n_pending = static_cast<uint32_t>(pending.size());
        if (greedy) {
            forward(pending.data(), n_pending, false, &last, params.on_prefill);
        } else {
            std::vector<int32_t> history(tokens_);
            history.insert(history.end(), pending.begin(), pending.end());
            last = forward_and_sample(pending.data(), n_pending, smp, history, cands, params.on_prefill,
                                      with_logprobs ? &step_lps[0] : nullptr, n_top);
        }
    }
    stats.n_prompt = static_cast<uint32_t>(pending.size());
    stats.prefill_seconds = seconds_since(t0);
    const auto t1 = clock::now();

    res.finish_reason = "length";
    if (params.max_tokens == 0) {
        stats.decode_seconds = 0;
        return res;
    }
    if (is_stop(last)) {
        res.finish_reason = "stop";
        return res;
    }
    res.tokens.push_back(last);
    // (cancelled at the first token, e.g. by a stop string inside it: no step runs, and the end below
    // counts the token and leaves it pending)
    const bool cancelled_first = !emit_step(last);
    if (cancelled_first) {
        res.finish_reason = "cancelled";
    }

    // spec "auto": a step speculates only while that beats plain decoding (spec/policy.h); a plain
    // step is a verify of the last token alone, so state, rollback and sampling stay one path.
    const bool tree = params.propose_tree || (e.cfg.spec == "tree" && e.draft && !params.propose);
    // spec "ngram" (no draft), or a prediction: proposals looked up in the context and the prediction
    // (spec/ngram.h); where they find nothing, the draft's (if any), else a plain step
    const bool lookup = (e.cfg.spec == "ngram" || !params.prediction.empty()) && !params.propose && !tree;
    // spec "auto" and "ngram" speculate while it pays (spec/policy.h); so does "off" given a prediction
    const bool adaptive = e.cfg.spec != "chain" && !params.propose && !tree;
    if (lookup) {
        if (!ngram_) {
            ngram_ = std::make_unique<spec::ngram_proposer>();
        }
        ngram_->sync(tokens_);  // (the session's context may have been reset or restored since)
        ngram_->set_reference(params.prediction);
    }
    spec::adaptive_policy policy(e.step_costs);
    // after a step's tokens are emitted: the next step's last token, or false when generation ends
    auto next_step = [&](const spec::commit_plan & plan) {
        if (plan.stopped) {
            res.finish_reason = "stop";
            last = -1;
            return false;
        }
        last = plan.pending;
        if (plan.cancelled) {
            res.finish_reason = "cancelled";
            return false;
        }
        return true;
    };
    while (!cancelled_first && res.tokens.size() < params.max_tokens) {
        // one step at a time holds the engine, so other sessions interleave between steps
        std::lock_guard<std::mutex> lock(e.compute_mutex);
        const uint32_t room = e.cfg.n_ctx - static_cast<uint32_t>(tokens_.size());
        if (room == 0) {
            res.finish_reason = "context";
            break;
        }
        if (tree) {
            step_emitted = 0;
            if (!next_step(tree_step(last, room, params, stats, res, is_stop, emit_step, smp, cands, step_lps))) {
                break;
            }
            continue;
        }
        const auto t_step = clock::now();
        // the policy's choice; a prediction's proposals are verified even in a plain run (the caller
        // expects them: a win there brings the policy back to speculation)
        const bool policy_speculates = !adaptive || policy.speculate();
        // the most tokens one verify may take: last + block-1 proposals (fewer only at the end of the
        // context or where the attention's split changes: split_safe_tokens)
        const uint32_t width = std::min({block, room, split_safe_tokens(n_past(), e.kv_size)});
        auto tp = clock::now();
        std::vector<int32_t> verified{last};
        bool predicted = false;  // the proposals came from the prediction
        if (params.propose && policy_speculates) {
            if (e.draft) {
                run_draft(-1, 0);  // keep the draft context in step
            }
            std::vector<int32_t> forced = params.propose(tokens_, last, width - 1);
            if (forced.size() != width - 1) {
                throw config_error("propose returned " + std::to_string(forced.size()) + " tokens, expected " +
                                   std::to_string(width - 1));
            }
            verified.insert(verified.end(), forced.begin(), forced.end());
        } else if (policy_speculates || (lookup && !params.prediction.empty())) {
            std::vector<int32_t> proposals = lookup ? ngram_->propose(tokens_, last, width - 1) : std::vector<int32_t>();
            predicted = !proposals.empty() && ngram_->from_reference();
            if (!policy_speculates && !predicted) {
                proposals.clear();
            }
            if (!proposals.empty() && e.draft) {
                run_draft(-1, 0);  // keep the draft context in step
            } else if (proposals.empty() && policy_speculates && e.draft && width > 1) {
                proposals = run_draft(last, width);
            }
            verified.insert(verified.end(), proposals.begin(), proposals.end());
        }
        // tokens verified this step; 1: a plain step (the policy's, or nothing was proposed)
        const uint32_t n = static_cast<uint32_t>(verified.size());
        const bool speculating = n > 1;
        if (!speculating && e.draft && tokens_.size() - n_draft_ctx_ >= st_->model_state.ring_size / 2) {
            run_draft(-1, 0);  // the draft's context keeps up while it is not asked to propose
        }
        for (int32_t t : verified) {
            if (t < 0 || static_cast<uint32_t>(t) >= n_vocab()) {
                throw config_error("proposal token id " + std::to_string(t) + " is outside the vocabulary");
            }
        }
        if (params.phase_timings) {
            stats.draft_seconds += seconds_since(tp);
        }
        tp = clock::now();
        std::vector<int32_t> target;
        uint32_t a = 0;
        // one token (a plain step) is always kept: no checkpoints, no rollback
        const bool keep_all = n == 1;
        const bool replay = e.cfg.rollback == "replay" && !keep_all;
        const bool checkpoints = e.cfg.rollback != "replay" && !keep_all;
        if (replay) {
            backup_state(true);
        }
        if (greedy) {
            run_target(verified.data(), n, false, nullptr, /*verify=*/checkpoints, &target);
            a = spec::accept_greedy(verified, target);
        } else {
            const auto rows = run_target_sampled(verified.data(), n, checkpoints, nullptr, smp, cands);
            a = spec::accept_sampled(verified, rows, static_cast<int32_t>(n_vocab()), smp, tokens_, target);
            if (with_logprobs) {  // row j chose target[j], the j-th token the step may emit
                step_lps.resize(a + 1);
                for (uint32_t j = 0; j <= a; ++j) {
                    step_lps[j] = logprobs_of(rows(j), target[j], n_top, static_cast<int32_t>(n_vocab()));
                }
            }
        }
        if (params.phase_timings) {
            stats.verify_seconds += seconds_since(tp);
        }

        const uint32_t budget = params.max_tokens - static_cast<uint32_t>(res.tokens.size());
        step_emitted = 0;
        const spec::commit_plan plan = spec::plan_commit(verified, target, a, budget, is_stop, emit_step);
        if (speculating) {
            stats.count_step(n - 1, a);
            stats.predicted_accepted += predicted ? a : 0;
        } else {
            ++stats.plain_steps;
        }

        tp = clock::now();
        if (checkpoints) {
            commit(n, plan.last_kept);
            stats.fast_rollbacks += speculating;
        } else if (replay && plan.last_kept + 1 < n) {
            backup_state(false);  // the state before the verify, then re-run the kept tokens
            run_target(verified.data(), plan.last_kept + 1, false, nullptr, false, nullptr);
            stats.replays += speculating;
        }
        tokens_.insert(tokens_.end(), verified.begin(), verified.begin() + plan.last_kept + 1);
        if (params.phase_timings) {
            // the commit's own device work (a chain's replay of the kept tokens) counts here, not in the
            // next step's draft or verify, which would otherwise wait for it
            ggml_backend_synchronize(e.backend);
            stats.commit_seconds += seconds_since(tp);
        }
        if (adaptive && speculating) {
            policy.record_spec(static_cast<uint32_t>(plan.emitted.size()), seconds_since(t_step));
        } else if (adaptive) {
            policy.record_plain(seconds_since(t_step));
        }
        res.tokens.insert(res.tokens.end(), plan.emitted.begin(), plan.emitted.end());
        if (!next_step(plan)) {
            break;
        }
    }
    pending_ = last;
    ggml_backend_synchronize(e.backend);  // the last queued commit counts in the decode time
    stats.n_generated = static_cast<uint32_t>(res.tokens.size());
    stats.decode_seconds = seconds_since(t1);
    return res;
}

// One DDTree step: draft a tree (or take the forced one), verify it in one target forward, accept
// a root path (greedy: the longest the target agrees with; sampled: spec::accept_tree_sampled),
// commit it and emit its tokens plus the bonus token.
spec::commit_plan session::tree_step(int32_t last, uint32_t room, const generate_params & params,
                                     generate_stats & stats, generate_result & res,
                                     const std::function<bool(int32_t)> & is_stop,
                                     const std::function<bool(int32_t)> & emit, sampler & smp, row_candidates & cands,
                                     std::vector<token_logprobs> & step_lps) {
    engine::impl & e = *eng_;
    if (!st_->model_state.has_state_checkpoints()) {  // a tree (propose_tree) in a session allocated for chains
        st_->model_state.add_state_checkpoints(e.target.hparams, ggml_backend_dev_buffer_type(e.dev), e.dev);
    }
    const qwen35_state & st = st_->model_state;
    // nodes of one verify: checkpoint slots and feature-ring rows per node, context room, and where
    // the attention's split changes
    const uint32_t cap = std::min({st.n_checkpoints, st.ring.empty() ? st.n_checkpoints : st.ring_size, room,
                                   split_safe_tokens(n_past(), e.kv_size)});
    const int32_t V = static_cast<int32_t>(n_vocab());

    auto tp = clock::now();
    spec::draft_tree t;
    uint32_t max_depth = 0;
    if (params.propose_tree) {
        if (e.draft) {
            run_draft(-1, 0);  // keep the draft context in step
        }
        auto [toks, parents] = params.propose_tree(tokens_, last, cap - 1);
        if (toks.size() != parents.size()) {
            throw config_error("propose_tree returned " + std::to_string(toks.size()) + " tokens but " +
                               std::to_string(parents.size()) + " parents");
        }
        t.tokens = {last};
        t.parents = {-1};
        t.depths = {0};
        for (size_t i = 0; i < toks.size(); ++i) {
            const int32_t p = parents[i];
            t.tokens.push_back(toks[i]);
            t.parents.push_back(p);
            t.depths.push_back(p >= 0 && size_t(p) < t.depths.size() ? t.depths[size_t(p)] + 1 : 0);  // else rejected below
        }
        t.scores.assign(t.tokens.size(), 0.0f);
        max_depth = cap - 1;
    } else {
        const uint32_t block = std::min(e.block_size(), room);
        if (block >= 2 && cap >= 2) {
            spec::draft_topk topk;
            topk.k = e.cfg.tree_top_k;
            run_draft(last, block, &topk);
            spec::tree_options opt;
            opt.budget = std::min(e.cfg.tree_budget, cap - 1);
            t = spec::build_tree(last, topk, opt);
            max_depth = block - 1;
        } else {
            t.tokens = {last};
            t.parents = {-1};
            t.depths = {0};
            t.scores = {0.0f};
        }
    }
    spec::validate_tree(t, cap, max_depth, V);
    if (params.phase_timings) {
        stats.draft_seconds += seconds_since(tp);
    }

    tp = clock::now();
    const uint32_t n = t.size();
    spec::tree_acceptance acc;
    std::function<logit_row(size_t)> rows;  // sampled: the verify's rows, for logprobs
    if (params.argmax_only()) {
        std::vector<int32_t> target;
        run_target(t.tokens.data(), n, false, nullptr, /*verify=*/true, &target, &t);
        acc.path = spec::accept_tree_greedy(t, target);
        acc.bonus = target[size_t(acc.path.back())];
    } else {  // each node's history: the committed tokens, the root and its path (all in the batch)
        rows = run_target_sampled(t.tokens.data(), n, /*verify=*/true, &t, smp, cands);
        acc = spec::accept_tree_sampled(t, rows, V, smp, tokens_);
    }
    const std::vector<int32_t> & path = acc.path;
    if (params.phase_timings) {
        stats.verify_seconds += seconds_since(tp);
    }
    // the accepted path as a chain: verified = its tokens, chosen = the tokens emitted after each
    // (the next path token, then the bonus)
    std::vector<int32_t> verified, chosen;
    for (size_t j = 0; j < path.size(); ++j) {
        verified.push_back(t.tokens[size_t(path[j])]);
        chosen.push_back(j + 1 < path.size() ? t.tokens[size_t(path[j + 1])] : acc.bonus);
    }
    if (params.logprobs >= 0) {  // chosen[j] was the choice of node path[j]'s row
        step_lps.resize(path.size());
        for (size_t j = 0; j < path.size(); ++j) {
            step_lps[j] = logprobs_of(rows(size_t(path[j])), chosen[j], uint32_t(params.logprobs), V);
        }
    }
    const uint32_t a = static_cast<uint32_t>(path.size() - 1);
    const uint32_t budget = params.max_tokens - static_cast<uint32_t>(res.tokens.size());
    const spec::commit_plan plan = spec::plan_commit(verified, chosen, a, budget, is_stop, emit);
    stats.count_step(n - 1, a);

    tp = clock::now();
    const std::vector<int32_t> kept(path.begin(), path.begin() + plan.last_kept + 1);
    commit_tree(n, kept);
    stats.fast_rollbacks += 1;
    tokens_.insert(tokens_.end(), verified.begin(), verified.begin() + plan.last_kept + 1);
    if (params.phase_timings) {
        stats.commit_seconds += seconds_since(tp);
    }
    res.tokens.insert(res.tokens.end(), plan.emitted.begin(), plan.emitted.end());
    return plan;
}

}  // namespace lucebox
