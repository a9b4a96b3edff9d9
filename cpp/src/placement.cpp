#include "placement.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <set>

#include "ggml-cpu.h"
#include "cuda_kernels.h"
#include "graph/builders.h"
#include "lucebox/errors.h"
#include "lucebox/tensor_spec.h"

namespace lucebox {

namespace {

using graph::MAX_GRAPH_NODES;

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), ::tolower);
    return s;
}

// N of "<prefix>N" (s lower case), -1 when s does not start with prefix; throws when N is malformed.
long indexed(const std::string & s, const char * prefix, const std::string & spec) {
    const size_t n = std::strlen(prefix);
    if (s.compare(0, n, prefix) != 0) {
        return -1;
    }
    char * end = nullptr;
    const long idx = std::strtol(s.c_str() + n, &end, 10);
    if (end == s.c_str() + n || *end != '\0' || idx < 0) {
        throw config_error("device '" + spec + "': expected " + std::string(prefix) + "N");
    }
    return idx;
}

std::vector<ggml_backend_dev_t> gpu_devices() {
    std::vector<ggml_backend_dev_t> gpus;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        const auto type = ggml_backend_dev_type(d);
        if (type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU) {
            gpus.push_back(d);
        }
    }
    return gpus;
}

std::string join(const std::vector<std::string> & v, const char * sep) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) {
        out += (i ? sep : "") + v[i];
    }
    return out;
}

}  // namespace

std::string available_devices() {
    std::string names;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        names += (i ? ", " : "") + std::string(ggml_backend_dev_name(ggml_backend_dev_get(i)));
    }
    return names;
}

std::string canonical_device(const std::string & spec) {
    const std::string s = lower(spec);
    if (s == "cpu") {
        return "cpu:0";
    }
    if (s == "cuda" || s == "gpu") {
        return "cuda:0";
    }
    for (const char * prefix : {"cuda:", "gpu:"}) {
        if (long i = indexed(s, prefix, spec); i >= 0) {
            return "cuda:" + std::to_string(i);
        }
    }
    if (long i = indexed(s, "cpu:", spec); i >= 0) {
        return "cpu:" + std::to_string(i);
    }
    if (s.size() > 4 && s.compare(0, 4, "cuda") == 0 &&
        std::all_of(s.begin() + 4, s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return "cuda:" + s.substr(4);  // ggml's name CUDAn
    }
    return s;
}

void configure_cpu_backend(ggml_backend_t cpu, int n_threads) {
    ggml_backend_cpu_set_n_threads(cpu, n_threads);
    ggml_backend_cpu_set_use_ref(cpu, true);
}

ggml_backend_dev_t resolve_device(const std::string & spec) {
    kernels::install_cuda_kernels();  // before any CUDA backend computes (a no-op without CUDA)
    std::vector<ggml_backend_dev_t> gpus = gpu_devices();
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    const std::string s = lower(spec);
    if (s == "auto") {
        return gpus.empty() ? cpu : gpus[0];
    }
    if (s == "cpu") {
        return cpu;
    }
    if (long i = indexed(s, "cpu:", spec); i >= 0) {
        if (static_cast<size_t>(i) >= MAX_PLACEMENT_DEVICES) {
            throw config_error("device '" + spec + "': CPU backend instances are cpu:0 .. cpu:" +
                               std::to_string(MAX_PLACEMENT_DEVICES - 1));
        }
        return cpu;
    }
    if (s == "cuda" || s == "gpu") {
        if (gpus.empty()) {
            throw config_error("device '" + spec + "': no GPU is visible to this build (available: " +
                               available_devices() + ")");
        }
        return gpus[0];
    }
    for (const char * prefix : {"cuda:", "gpu:"}) {
        if (long idx = indexed(s, prefix, spec); idx >= 0) {
            if (static_cast<size_t>(idx) >= gpus.size()) {
                throw config_error("device '" + spec + "': only " + std::to_string(gpus.size()) +
                                   " GPU(s) visible (available: " + available_devices() + ")");
            }
            return gpus[idx];
        }
    }
    if (ggml_backend_dev_t d = ggml_backend_dev_by_name(spec.c_str())) {
        return d;
    }
    throw config_error("device '" + spec + "' not found (expected auto, cpu, cpu:N, cuda, cuda:N or one of: " +
                       available_devices() + ")");
}

void validate_placement(const engine_config & c) {
    if (c.split != "none" && c.split != "layer" && c.split != "tensor") {
        throw config_error("engine: split '" + c.split + "' must be none, layer or tensor");
    }
    if (c.devices.size() > MAX_PLACEMENT_DEVICES) {
        throw config_error("engine: " + std::to_string(c.devices.size()) + " devices given; at most " +
                           std::to_string(MAX_PLACEMENT_DEVICES) + " are supported");
    }
    if (!c.devices.empty() && lower(c.device) != "auto") {
        throw config_error("engine: give either device ('" + c.device + "') or devices, not both");
    }
    std::set<std::string> seen;
    for (const std::string & d : c.devices) {
        if (d.empty()) {
            throw config_error("engine: devices entries must be non-empty strings");
        }
        if (lower(d) == "auto") {
            throw config_error("engine: devices must name each device ('auto' is not allowed in a list)");
        }
        if (!seen.insert(canonical_device(d)).second) {
            throw config_error("engine: device '" + d + "' appears twice in devices (" + join(c.devices, ", ") + ")");
        }
    }
    if (c.split == "none") {
        if (c.devices.size() > 1) {
            throw config_error("engine: " + std::to_string(c.devices.size()) +
                               " devices need split='layer' or split='tensor'");
        }
        if (!c.layer_proportions.empty()) {
            throw config_error("engine: layer_proportions need split='layer'");
        }
        if (!c.draft_device.empty()) {
            const std::string target = c.devices.empty() ? c.device : c.devices[0];
            if (canonical_device(c.draft_device) != canonical_device(target)) {
                throw config_error("engine: draft_device '" + c.draft_device + "' differs from the target's device '" +
                                   target + "'; a draft on its own device needs split='layer'");
            }
        }
        return;
    }
    if (c.devices.size() < 2) {
        throw config_error("engine: split '" + c.split + "' needs at least 2 devices, got " +
                           std::to_string(c.devices.size()));
    }
    if (!c.layer_proportions.empty()) {
        if (c.split != "layer") {
            throw config_error("engine: layer_proportions apply to split='layer' only");
        }
        if (c.layer_proportions.size() != c.devices.size()) {
            throw config_error("engine: layer_proportions has " + std::to_string(c.layer_proportions.size()) +
                               " entries, expected one per device (" + std::to_string(c.devices.size()) + ")");
        }
        for (float p : c.layer_proportions) {
            if (!std::isfinite(p) || p <= 0.0f) {
                throw config_error("engine: layer_proportions must be finite and > 0, got " + std::to_string(p));
            }
        }
    }
    if (!c.draft_device.empty() && lower(c.draft_device) == "auto") {
        throw config_error("engine: draft_device must name a device ('auto' is not allowed)");
    }
    const auto n_cpu = std::count_if(c.devices.begin(), c.devices.end(),
                                     [](const std::string & d) { return canonical_device(d).compare(0, 4, "cpu:") == 0; });
    if (c.split == "tensor" && n_cpu > 0 && size_t(n_cpu) < c.devices.size()) {
        throw config_error("engine: split='tensor' cannot mix CPU backend instances and GPUs (" + join(c.devices, ", ") +
                           "): the devices of a tensor split all-reduce with each other");
    }
    if (!c.draft_device.empty() && c.draft_path.empty()) {
        throw config_error("engine: draft_device is set but there is no draft model");
    }
    if (c.spec == "tree") {
        throw config_error("engine: spec 'tree' is not supported on split='" + c.split +
                           "' placements (tree verify is proven on one device only); use spec='chain'");
    }
}

std::vector<std::pair<uint32_t, uint32_t>> split_layers(uint32_t n_layer, size_t n_devices,
                                                        const std::vector<float> & proportions) {
    if (n_devices == 0 || n_devices > n_layer) {
        throw config_error("engine: a layer split over " + std::to_string(n_devices) + " devices needs at least as "
                           "many layers, the model has " + std::to_string(n_layer));
    }
    std::vector<double> w(n_devices, 1.0);
    if (!proportions.empty()) {
        w.assign(proportions.begin(), proportions.end());
    }
    double total = 0;
    for (double x : w) {
        total += x;
    }
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    double cum = 0;
    uint32_t begin = 0;
    for (size_t i = 0; i < n_devices; ++i) {
        cum += w[i];
        uint32_t end = i + 1 == n_devices ? n_layer : static_cast<uint32_t>(std::lround(n_layer * cum / total));
        const uint32_t lo = begin + 1;                                            // >= 1 layer here
        const uint32_t hi = n_layer - static_cast<uint32_t>(n_devices - 1 - i);  // >= 1 layer for each next
        end = std::clamp(end, lo, hi);
        ranges.emplace_back(begin, end);
        begin = end;
    }
    return ranges;
}

// ---------------------------------------------------------------------------------------------
// layer_split
// ---------------------------------------------------------------------------------------------

struct layer_split_session::range_graph {
    std::vector<uint8_t> meta;
    ggml_context * ctx = nullptr;
    std::array<uint32_t, 5> key{};
    uint64_t id = 0;  // unique per build, 0 = none
    qwen35_graph graph;
    ~range_graph() {
        if (ctx) {
            ggml_free(ctx);
        }
    }
};

layer_split_session::~layer_split_session() = default;

namespace {
struct scratch_ctx {
    ggml_context * ctx;
    explicit scratch_ctx(std::vector<uint8_t> & meta) {
        ggml_init_params ip{meta.size(), meta.data(), /*no_alloc=*/true};
        ctx = ggml_init(ip);
    }
    ~scratch_ctx() { ggml_free(ctx); }
};

// Layer index of a per-layer tensor name "blk.<il>.*", -1 for the others.
long layer_of(const std::string & name) {
    if (name.compare(0, 4, "blk.") != 0) {
        return -1;
    }
    return std::strtol(name.c_str() + 4, nullptr, 10);
}
}  // namespace

layer_split::layer_split(const engine_config & cfg, const target_model_file & target, int n_threads,
                         const std::string & draft_spec, ggml_backend_dev_t draft_dev,
                         const progress_callback & progress)
    : hp_(target.hparams) {
    const auto ranges = split_layers(hp_.n_layer, cfg.devices.size(), cfg.layer_proportions);
    shards_.resize(cfg.devices.size());
    try {
        for (size_t i = 0; i < shards_.size(); ++i) {
            shard & sh = shards_[i];
            sh.spec = canonical_device(cfg.devices[i]);
            sh.dev = resolve_device(cfg.devices[i]);
            sh.begin = ranges[i].first;
            sh.end = ranges[i].second;
            sh.backend = ggml_backend_dev_init(sh.dev, nullptr);
            if (sh.backend == nullptr) {
                throw unsupported_error("could not initialise device " + cfg.devices[i]);
            }
            if (ggml_backend_dev_type(sh.dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
                configure_cpu_backend(sh.backend, n_threads);
            } else if (cpu_fallback_ == nullptr) {
                cpu_fallback_ = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
                configure_cpu_backend(cpu_fallback_, n_threads);
            }
        }
        // Which tensors each shard loads.
        const std::vector<std::string> names = tensors_to_load(target.file, qwen35_tensor_specs(hp_));
        const size_t last = shards_.size() - 1;
        std::vector<std::vector<std::string>> per_shard(shards_.size());
        for (const std::string & n : names) {
            const long il = layer_of(n);
            if (il >= 0) {
                size_t s = last;
                for (size_t i = 0; i < shards_.size(); ++i) {
                    if (il >= long(shards_[i].begin) && il < long(shards_[i].end)) {
                        s = i;
                    }
                }
                per_shard[s].push_back(n);
            } else if (n == "token_embd.weight") {
                per_shard[0].push_back(n);
                if (!hp_.has_output && last != 0) {
                    per_shard[last].push_back(n);  // the tied LM head
                }
            } else {
                per_shard[last].push_back(n);  // output_norm, output
            }
        }
        uint64_t done_before = 0;
        const uint64_t total = target.weight_bytes;
        for (size_t i = 0; i < shards_.size(); ++i) {
            shard & sh = shards_[i];
            progress_callback p;
            if (progress) {
                p = [&, i](uint64_t done, uint64_t) { progress(std::min(total, done_before + done), total); };
            }
            sh.weights = tensor_store::load(target.file, per_shard[i], ggml_backend_dev_buffer_type(sh.dev), sh.dev, p,
                                            qwen35_projection_stacks(hp_));
            done_before += sh.weights.size_bytes();
            std::vector<ggml_backend_t> backends{sh.backend};
            if (ggml_backend_dev_type(sh.dev) != GGML_BACKEND_DEVICE_TYPE_CPU) {
                backends.push_back(cpu_fallback_);
            }
            sh.sched = ggml_backend_sched_new(backends.data(), nullptr, int(backends.size()), MAX_GRAPH_NODES, false, true);
            sh.sched_aux = ggml_backend_sched_new(backends.data(), nullptr, int(backends.size()), MAX_GRAPH_NODES, false, true);
        }
        auto shard_of_layer = [&](uint32_t il) -> const shard & {
            for (const shard & sh : shards_) {
                if (il >= sh.begin && il < sh.end) {
                    return sh;
                }
            }
            return shards_.back();
        };
        // Bind: layer tensors from their shard; token_embd from the first; head and norm from the last.
        w_ = bind_qwen35_weights(hp_, [&](const std::string & n) {
            const long il = layer_of(n);
            if (il >= 0) {
                return shard_of_layer(static_cast<uint32_t>(il)).weights.get(n);
            }
            return (n == "token_embd.weight" ? shards_.front() : shards_.back()).weights.get(n);
        }, [](uint32_t) { return true; });
        if (!hp_.has_output) {
            w_.output = shards_.back().weights.get("token_embd.weight");
        }

        // The draft's view of the shared target tensors: on its own device.
        draft_w_ = w_;
        if (draft_dev != nullptr) {
            const std::string ds = canonical_device(draft_spec);
            const bool embd_there = ds == shards_.front().spec || (!hp_.has_output && ds == shards_.back().spec);
            const bool head_there = ds == shards_.back().spec;
            std::vector<std::string> extra;
            if (!embd_there) {
                extra.push_back("token_embd.weight");
            }
            if (!head_there && hp_.has_output) {
                extra.push_back("output.weight");
            }
            if (!extra.empty()) {
                draft_side_store_ = tensor_store::load(target.file, extra, ggml_backend_dev_buffer_type(draft_dev),
                                                       draft_dev, {});
            }
            if (embd_there) {
                draft_w_.token_embd = ds == shards_.front().spec ? w_.token_embd
                                                                 : shards_.back().weights.get("token_embd.weight");
            } else {
                draft_w_.token_embd = draft_side_store_.get("token_embd.weight");
            }
            if (!hp_.has_output) {
                draft_w_.output = draft_w_.token_embd;
            } else {
                draft_w_.output = head_there ? w_.output : draft_side_store_.get("output.weight");
            }
        }
        graph_meta_.resize(graph::graph_meta_bytes());
    } catch (...) {
        release();  // the destructor does not run for a constructor that throws
        throw;
    }
}

layer_split::~layer_split() { release(); }

void layer_split::release() {
    for (shard & sh : shards_) {
        if (sh.sched) {
            ggml_backend_sched_free(sh.sched);
            sh.sched = nullptr;
        }
        if (sh.sched_aux) {
            ggml_backend_sched_free(sh.sched_aux);
            sh.sched_aux = nullptr;
        }
        sh.weights = tensor_store();
        if (sh.backend) {
            ggml_backend_free(sh.backend);
            sh.backend = nullptr;
        }
    }
    draft_side_store_ = tensor_store();
    if (cpu_fallback_) {
        ggml_backend_free(cpu_fallback_);
        cpu_fallback_ = nullptr;
    }
}

std::string layer_split::device_names() const {
    std::vector<std::string> names;
    for (const shard & sh : shards_) {
        names.emplace_back(ggml_backend_dev_name(sh.dev));
    }
    return join(names, "+");
}

std::unique_ptr<layer_split_session> layer_split::new_session(qwen35_state & full, uint32_t kv_size, ggml_type type_k,
                                                              ggml_type type_v, const std::vector<int32_t> & capture,
                                                              uint32_t ring_size, uint32_t n_checkpoints,
                                                              const std::vector<size_t> & mirrored,
                                                              ggml_backend_buffer_type_t draft_buft,
                                                              ggml_backend_dev_t draft_dev) const {
    auto ss = std::make_unique<layer_split_session>();
    std::vector<qwen35_state> parts;
    const std::vector<bool> fused = qwen35_fused_layers(hp_, w_);
    for (const shard & sh : shards_) {
        std::vector<bool> layers(hp_.n_layer, false);
        std::fill(layers.begin() + sh.begin, layers.begin() + sh.end, true);
        parts.push_back(qwen35_state::allocate(hp_, kv_size, type_k, type_v, capture, ring_size, n_checkpoints,
                                               ggml_backend_dev_buffer_type(sh.dev), sh.dev, &layers, &fused));
    }
    // The full state: every range's tensors in one per-layer view; the stores move into it.
    full = qwen35_state();
    full.kv_size = kv_size;
    full.capture_layers = capture;
    full.ring_size = parts[0].ring_size;
    full.n_checkpoints = n_checkpoints;
    for (auto * v : {&full.k, &full.v, &full.conv, &full.ssm, &full.ssm_ckpt, &full.conv_ckpt, &full.inputs_ckpt}) {
        v->assign(hp_.n_layer, nullptr);
    }
    full.ring.assign(capture.size(), nullptr);
    for (size_t s = 0; s < parts.size(); ++s) {
        qwen35_state & p = parts[s];
        for (uint32_t il = shards_[s].begin; il < shards_[s].end; ++il) {
            full.k[il] = p.k[il];
            full.v[il] = p.v[il];
            full.conv[il] = p.conv[il];
            full.ssm[il] = p.ssm[il];
            full.ssm_ckpt[il] = p.ssm_ckpt[il];
            full.conv_ckpt[il] = p.conv_ckpt[il];
            full.inputs_ckpt[il] = p.inputs_ckpt[il];
        }
        for (size_t i = 0; i < capture.size(); ++i) {
            if (p.ring[i] != nullptr) {
                full.ring[i] = p.ring[i];
            }
        }
    }
    // Per-range views (tensors of other ranges null), for the range graphs, commit and backup.
    for (size_t s = 0; s < parts.size(); ++s) {
        qwen35_state v;
        v.kv_size = kv_size;
        v.capture_layers = capture;
        v.ring_size = full.ring_size;
        v.n_checkpoints = n_checkpoints;
        v.k = parts[s].k;
        v.v = parts[s].v;
        v.conv = parts[s].conv;
        v.ssm = parts[s].ssm;
        v.ssm_ckpt = parts[s].ssm_ckpt;
        v.conv_ckpt = parts[s].conv_ckpt;
        v.inputs_ckpt = parts[s].inputs_ckpt;
        v.replay_table = parts[s].replay_table;
        v.ring = parts[s].ring;
        ss->views.push_back(std::move(v));
        ss->graphs.push_back(std::make_unique<layer_split_session::range_graph>());
    }
    full.store = std::move(parts[0].store);
    for (size_t s = 1; s < parts.size(); ++s) {
        full.more_stores.push_back(std::move(parts[s].store));
    }
    for (qwen35_state & p : parts) {
        for (tensor_store & t : p.table_stores) {
            full.table_stores.push_back(std::move(t));
        }
    }
    ss->ring_size = full.ring_size;
    ss->mirror.assign(capture.size(), nullptr);
    if (!mirrored.empty() && draft_buft != nullptr) {
        std::vector<size_t> idx(mirrored.begin(), mirrored.end());
        std::sort(idx.begin(), idx.end());
        idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
        ss->mirror_store = tensor_store::allocate(draft_buft, draft_dev, idx.size(), [&](ggml_context * ctx) {
            for (size_t i : idx) {
                ss->mirror[i] = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, hp_.n_embd, full.ring_size);
                ggml_format_name(ss->mirror[i], "feature_mirror-%d", capture[i]);
            }
        }, "the draft's copies of the feature rings");
    }
    return ss;
}

void layer_split::compute(shard & sh, ggml_backend_sched_t s, ggml_cgraph * gf, bool alloc, const std::string & what) {
    if (alloc) {
        if (s == sh.sched) {
            sh.sched_graph_id = 0;
        }
        ggml_backend_sched_reset(s);
        if (!ggml_backend_sched_alloc_graph(s, gf)) {
            throw out_of_memory_error("out of memory allocating compute buffers for " + what + " on " +
                                      ggml_backend_dev_name(sh.dev) + "; try a smaller ubatch");
        }
        return;
    }
    const ggml_status status = ggml_backend_sched_graph_compute(s, gf);
    if (status != GGML_STATUS_SUCCESS) {
        throw error(what + " failed on " + ggml_backend_dev_name(sh.dev) + " (ggml status " +
                    std::to_string(int(status)) + ")");
    }
}

namespace {
// Copies rows [first, first + n) mod ring_size of `src` into the same rows of `dst` (both [E, ring]).
void copy_ring_rows(ggml_context * ctx, ggml_tensor * src, ggml_tensor * dst, uint32_t first, uint32_t n,
                    uint32_t ring_size) {
    uint32_t done = 0;
    while (done < n) {
        const uint32_t row = (first + done) % ring_size;
        const uint32_t len = std::min(n - done, ring_size - row);
        ggml_tensor * a = ggml_view_2d(ctx, src, src->ne[0], len, src->nb[1], row * src->nb[1]);
        ggml_tensor * b = ggml_view_2d(ctx, dst, dst->ne[0], len, dst->nb[1], row * dst->nb[1]);
        if (ggml_backend_view_init(a) != GGML_STATUS_SUCCESS || ggml_backend_view_init(b) != GGML_STATUS_SUCCESS) {
            throw error("internal: could not view a feature ring");
        }
        ggml_backend_tensor_copy(a, b);
        done += len;
    }
}
}  // namespace

std::vector<float> layer_split::forward(layer_split_session & ss, const int32_t * tokens, uint32_t n_past, uint32_t T,
                                        uint32_t n_kv, bool all_logits, int32_t * argmax_last, bool verify,
                                        std::vector<int32_t> * argmax_rows) {
    static std::atomic<uint64_t> next_id{1};
    const bool rows_out = all_logits || argmax_rows != nullptr;
    const uint32_t n_out = rows_out ? T : 1;
    const bool want_argmax = argmax_last != nullptr || argmax_rows != nullptr;
    const std::array<uint32_t, 5> key{T, n_kv, n_out, uint32_t(want_argmax), uint32_t(verify)};

    const qwen35_graph * prev = nullptr;
    for (size_t s = 0; s < shards_.size(); ++s) {
        shard & sh = shards_[s];
        layer_split_session::range_graph & rg = *ss.graphs[s];
        if (rg.id == 0 || rg.key != key) {
            if (rg.ctx) {
                ggml_free(rg.ctx);
            }
            if (rg.meta.empty()) {
                rg.meta.resize(graph::graph_meta_bytes());
            }
            ggml_init_params ip{rg.meta.size(), rg.meta.data(), /*no_alloc=*/true};
            rg.ctx = ggml_init(ip);
            rg.graph = build_qwen35_graph(rg.ctx, hp_, w_, ss.views[s], T, n_kv, n_out, want_argmax, verify,
                                          false, qwen35_layer_range{sh.begin, sh.end});
            rg.key = key;
            rg.id = next_id++;
        }
        const qwen35_graph & g = rg.graph;
        const std::string what = "layers " + std::to_string(sh.begin) + "-" + std::to_string(sh.end - 1) +
                                 " of a batch of " + std::to_string(T) + " tokens";
        if (sh.sched_graph_id != rg.id) {
            graph::forget_allocation(rg.ctx);
            compute(sh, sh.sched, g.gf, /*alloc=*/true, what);
            sh.sched_graph_id = rg.id;
        }
        if (g.in.hidden != nullptr) {
            ggml_backend_tensor_copy(prev->hidden, g.in.hidden);  // [E, T] F32 across devices
        }
        set_qwen35_inputs(sh.sched, g, hp_, tokens, n_past, T, n_kv, ss.ring_size, nullptr, ss.mask_staging);
        compute(sh, sh.sched, g.gf, /*alloc=*/false, "the target forward pass (" + what + ")");
        // Rings this range wrote that the draft reads on its device: copy the new rows over.
        const qwen35_state & view = ss.views[s];
        scratch_ctx sc(graph_meta_);
        for (size_t i = 0; i < ss.mirror.size(); ++i) {
            if (ss.mirror[i] != nullptr && view.ring[i] != nullptr) {
                copy_ring_rows(sc.ctx, view.ring[i], ss.mirror[i], n_past, T, ss.ring_size);
            }
        }
        prev = &g;
    }

    return read_qwen35_outputs(*prev, T, all_logits, /*last_logits=*/true, argmax_last, argmax_rows);
}

void layer_split::commit(layer_split_session & ss, uint32_t n_verified, uint32_t last_kept) {
    for (size_t s = 0; s < shards_.size(); ++s) {
        scratch_ctx sc(graph_meta_);
        ggml_cgraph * gf = build_qwen35_commit_graph(sc.ctx, hp_, ss.views[s], n_verified, last_kept);
        if (ggml_graph_n_nodes(gf) == 0) {
            continue;  // no DeltaNet layers in this range
        }
        compute(shards_[s], shards_[s].sched_aux, gf, true, "the commit");
        compute(shards_[s], shards_[s].sched_aux, gf, false, "the commit");
    }
}

void layer_split::backup(layer_split_session & ss, bool backup) {
    for (size_t s = 0; s < shards_.size(); ++s) {
        scratch_ctx sc(graph_meta_);
        ggml_cgraph * gf = build_qwen35_backup_graph(sc.ctx, hp_, ss.views[s], backup);
        if (ggml_graph_n_nodes(gf) == 0) {
            continue;
        }
        compute(shards_[s], shards_[s].sched_aux, gf, true, "the state backup");
        compute(shards_[s], shards_[s].sched_aux, gf, false, "the state backup");
    }
}

}  // namespace lucebox
