#include "lucebox/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <thread>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "lucebox/errors.h"
#include "lucebox/log.h"
#include "lucebox/model_files.h"
#include "models/qwen35_model.h"

namespace lucebox {

namespace {

constexpr uint32_t KV_PAD = 256;         // cache rows are viewed in multiples of this (FA kernels)
constexpr size_t MAX_GRAPH_NODES = 16384;

uint32_t pad_to(uint32_t n, uint32_t m) { return (n + m - 1) / m * m; }

std::string available_devices() {
    std::string names;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        names += (i ? ", " : "") + std::string(ggml_backend_dev_name(ggml_backend_dev_get(i)));
    }
    return names;
}

ggml_backend_dev_t resolve_device(const std::string & spec) {
    std::vector<ggml_backend_dev_t> gpus;
    ggml_backend_dev_t cpu = nullptr;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        const auto type = ggml_backend_dev_type(d);
        if (type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU) {
            gpus.push_back(d);
        } else if (type == GGML_BACKEND_DEVICE_TYPE_CPU && cpu == nullptr) {
            cpu = d;
        }
    }
    std::string s = spec;
    std::transform(s.begin(), s.end(), s.begin(), ::tolower);
    if (s == "auto") {
        return gpus.empty() ? cpu : gpus[0];
    }
    if (s == "cpu") {
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
        const size_t n = std::strlen(prefix);
        if (s.compare(0, n, prefix) == 0) {
            char * end = nullptr;
            const long idx = std::strtol(s.c_str() + n, &end, 10);
            if (end == s.c_str() + n || *end != '\0' || idx < 0) {
                throw config_error("device '" + spec + "': expected " + std::string(prefix) + "N");
            }
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
    throw config_error("device '" + spec + "' not found (expected auto, cpu, cuda, cuda:N or one of: " +
                       available_devices() + ")");
}

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
}

struct engine::impl {
    engine_config cfg;
    target_model_file target;
    ggml_type type_k = GGML_TYPE_F16, type_v = GGML_TYPE_F16;
    uint32_t kv_size = 0;
    ggml_backend_dev_t dev = nullptr;
    ggml_backend_t backend = nullptr;      // the device's backend
    ggml_backend_t cpu_backend = nullptr;  // fallback for ops the device lacks (same as backend on CPU)
    ggml_backend_sched_t sched = nullptr;
    tensor_store weights;
    qwen35_weights w;
    std::vector<uint8_t> graph_meta;
    std::mutex compute_mutex;

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
        plan();  // validates KV row sizes against the types' block sizes

        dev = resolve_device(cfg.device);
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
        ggml_backend_cpu_set_n_threads(cpu_backend, threads);

        weights = tensor_store::load(target.file, qwen35_used_tensors(hp, target.file),
                                     ggml_backend_dev_buffer_type(dev), dev, progress);
        w = bind_qwen35_weights(hp, weights);

        std::vector<ggml_backend_t> backends{backend};
        if (cpu_backend != backend) {
            backends.push_back(cpu_backend);
        }
        sched = ggml_backend_sched_new(backends.data(), nullptr, static_cast<int>(backends.size()), MAX_GRAPH_NODES,
                                       false, true);
        graph_meta.resize(ggml_tensor_overhead() * MAX_GRAPH_NODES + ggml_graph_overhead_custom(MAX_GRAPH_NODES, false));
    }

    ~impl() {
        if (sched) {
            ggml_backend_sched_free(sched);
        }
        weights = tensor_store();
        if (cpu_backend && cpu_backend != backend) {
            ggml_backend_free(cpu_backend);
        }
        if (backend) {
            ggml_backend_free(backend);
        }
    }

    memory_plan plan() const {
        memory_request req;
        req.n_ctx = cfg.n_ctx;
        req.kv_type_k = type_k;
        req.kv_type_v = type_v;
        req.ubatch = cfg.n_ubatch;
        memory_plan p = plan_memory(target.hparams, nullptr, req);
        p.target_weight_bytes = target.weight_bytes;
        return p;
    }
};

engine::engine(const engine_config & cfg, const progress_callback & progress)
    : impl_(std::make_unique<impl>(cfg, progress)) {}

engine::~engine() = default;

const engine_config & engine::config() const { return impl_->cfg; }
const qwen35_hparams & engine::hparams() const { return impl_->target.hparams; }
memory_plan engine::plan() const { return impl_->plan(); }
std::string engine::device_name() const { return ggml_backend_dev_name(impl_->dev); }
std::string engine::device_description() const { return ggml_backend_dev_description(impl_->dev); }

// ---------------------------------------------------------------------------------------------
// session
// ---------------------------------------------------------------------------------------------

struct session::state {
    qwen35_state model_state;
};

std::unique_ptr<session> engine::new_session() {
    impl & e = *impl_;
    auto st = std::make_unique<session::state>();
    const uint32_t ring = std::max(e.cfg.n_ubatch, 64u);
    st->model_state = qwen35_state::allocate(e.target.hparams, e.kv_size, e.type_k, e.type_v, e.cfg.capture_layers,
                                             ring, ggml_backend_dev_buffer_type(e.dev), e.dev);
    return std::unique_ptr<session>(new session(impl_.get(), std::move(st)));
}

session::session(engine::impl * eng, std::unique_ptr<state> st) : eng_(eng), st_(std::move(st)) {}
session::~session() = default;

uint32_t session::n_ctx() const { return eng_->cfg.n_ctx; }
uint32_t session::n_vocab() const { return eng_->target.hparams.n_vocab; }

void session::reset() {
    std::lock_guard<std::mutex> lock(eng_->compute_mutex);
    st_->model_state.store.clear();
    tokens_.clear();
    pending_ = -1;
}

void session::check_fits(size_t n_new) const {
    n_new += pending_ >= 0 ? 1 : 0;
    if (tokens_.size() + n_new > eng_->cfg.n_ctx) {
        throw config_error("context overflow: " + std::to_string(n_new) + " new tokens + " +
                           std::to_string(tokens_.size()) + " already in the session exceed the context length " +
                           std::to_string(eng_->cfg.n_ctx));
    }
}

std::vector<float> session::forward(const int32_t * tokens, uint32_t n, bool all_logits, int32_t * argmax,
                                    const progress_callback & progress) {
    engine::impl & e = *eng_;
    const qwen35_hparams & hp = e.target.hparams;
    const qwen35_state & st = st_->model_state;
    const uint32_t V = hp.n_vocab;
    std::vector<float> logits;
    if (all_logits) {
        logits.resize(size_t(n) * V);
    }
    std::lock_guard<std::mutex> lock(e.compute_mutex);
    for (uint32_t done = 0; done < n;) {
        const uint32_t T = std::min(e.cfg.n_ubatch, n - done);
        const bool last_chunk = done + T == n;
        const uint32_t n_out = all_logits ? T : (last_chunk ? 1 : 0);
        const uint32_t n_past = static_cast<uint32_t>(tokens_.size());
        const uint32_t n_kv = std::min(e.kv_size, pad_to(n_past + T, KV_PAD));

        ggml_init_params ip{e.graph_meta.size(), e.graph_meta.data(), /*no_alloc=*/true};
        ggml_context * ctx = ggml_init(ip);
        struct ctx_guard {
            ggml_context * c;
            ~ctx_guard() { ggml_free(c); }
        } guard{ctx};
        const bool want_argmax = argmax != nullptr && n_out == 1 && !all_logits;
        qwen35_graph g = build_qwen35_graph(ctx, hp, e.w, st, T, n_kv, std::max(n_out, 1u), want_argmax);

        ggml_backend_sched_reset(e.sched);
        if (!ggml_backend_sched_alloc_graph(e.sched, g.gf)) {
            throw out_of_memory_error("out of memory allocating compute buffers for a batch of " + std::to_string(T) +
                                      " tokens on " + ggml_backend_dev_name(e.dev) + "; try a smaller ubatch");
        }

        // inputs
        ggml_backend_tensor_set(g.in.tokens, tokens + done, 0, sizeof(int32_t) * T);
        std::vector<int32_t> pos(4 * size_t(T), 0);
        std::vector<int64_t> rows(T);
        for (uint32_t i = 0; i < T; ++i) {
            pos[i] = pos[T + i] = pos[2 * T + i] = static_cast<int32_t>(n_past + i);
            rows[i] = n_past + i;
        }
        if (g.in.pos != nullptr) {
            ggml_backend_tensor_set(g.in.pos, pos.data(), 0, sizeof(int32_t) * pos.size());
            ggml_backend_tensor_set(g.in.kv_rows, rows.data(), 0, sizeof(int64_t) * T);
        }
        if (g.in.ring_rows != nullptr) {
            std::vector<int64_t> ring_rows(T);
            for (uint32_t i = 0; i < T; ++i) {
                ring_rows[i] = (n_past + i) % st.ring_size;
            }
            ggml_backend_tensor_set(g.in.ring_rows, ring_rows.data(), 0, sizeof(int64_t) * T);
        }
        std::vector<int32_t> out_rows(std::max(n_out, 1u));
        for (uint32_t i = 0; i < out_rows.size(); ++i) {
            out_rows[i] = static_cast<int32_t>(all_logits ? i : T - 1);
        }
        if (g.in.out_rows != nullptr) {
            ggml_backend_tensor_set(g.in.out_rows, out_rows.data(), 0, sizeof(int32_t) * out_rows.size());
        }
        if (g.in.kq_mask != nullptr) {
            const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), ninf = ggml_fp32_to_fp16(-INFINITY);
            std::vector<ggml_fp16_t> mask(size_t(n_kv) * T, ninf);
            for (uint32_t i = 0; i < T; ++i) {
                std::fill_n(mask.begin() + size_t(i) * n_kv, n_past + i + 1, zero);  // causal
            }
            ggml_backend_tensor_set(g.in.kq_mask, mask.data(), 0, sizeof(ggml_fp16_t) * mask.size());
        }

        const ggml_status status = ggml_backend_sched_graph_compute(e.sched, g.gf);
        if (status != GGML_STATUS_SUCCESS) {
            throw error(std::string("forward pass failed on ") + ggml_backend_dev_name(e.dev) + " (ggml status " +
                        std::to_string(int(status)) + ")");
        }
        tokens_.insert(tokens_.end(), tokens + done, tokens + done + T);

        if (all_logits) {
            ggml_backend_tensor_get(g.logits, logits.data() + size_t(done) * V, 0, sizeof(float) * size_t(T) * V);
        } else if (last_chunk) {
            if (want_argmax) {
                ggml_backend_tensor_get(g.argmax, argmax, 0, sizeof(int32_t));
            } else {
                logits.resize(V);
                ggml_backend_tensor_get(g.logits, logits.data(), 0, sizeof(float) * V);
            }
        }
        done += T;
        if (progress) {
            progress(done, n);
        }
    }
    return logits;
}

std::vector<float> session::eval(const std::vector<int32_t> & tokens, bool all_logits) {
    if (tokens.empty()) {
        throw config_error("eval: no tokens given");
    }
    if (pending_ >= 0) {
        throw config_error("eval: the session has a pending generated token; pass it first or reset");
    }
    check_fits(tokens.size());
    const uint32_t V = n_vocab();
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] < 0 || static_cast<uint32_t>(tokens[i]) >= V) {
            throw config_error("token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                               " is outside the vocabulary [0, " + std::to_string(V) + ")");
        }
    }
    return forward(tokens.data(), static_cast<uint32_t>(tokens.size()), all_logits, nullptr);
}

generate_result session::generate(const std::vector<int32_t> & prompt, const generate_params & params,
                                  const token_callback & on_token) {
    using clock = std::chrono::steady_clock;
    params.sampling.validate();
    if (prompt.empty() && pending_ < 0) {
        throw config_error("generate: the prompt is empty and the session has no pending token to continue from");
    }
    check_fits(prompt.size());
    const uint32_t V = n_vocab();
    for (size_t i = 0; i < prompt.size(); ++i) {
        if (prompt[i] < 0 || static_cast<uint32_t>(prompt[i]) >= V) {
            throw config_error("prompt token id " + std::to_string(prompt[i]) + " at index " + std::to_string(i) +
                               " is outside the vocabulary [0, " + std::to_string(V) + ")");
        }
    }

    generate_result res;
    sampler smp(params.sampling);
    const sampling_params & sp = params.sampling;
    const bool device_argmax = sp.is_greedy() && sp.presence_penalty == 0.0f && sp.frequency_penalty == 0.0f &&
                               sp.repetition_penalty == 1.0f;
    auto is_stop = [&](int32_t t) {
        return std::find(params.stop_tokens.begin(), params.stop_tokens.end(), t) != params.stop_tokens.end();
    };

    // Feed the previous call's last token (emitted but not yet evaluated), then the prompt.
    std::vector<int32_t> pending;
    if (pending_ >= 0) {
        pending.push_back(pending_);
    }
    pending.insert(pending.end(), prompt.begin(), prompt.end());
    const auto t0 = clock::now();
    int32_t next = -1;
    std::vector<float> logits = forward(pending.data(), static_cast<uint32_t>(pending.size()), false,
                                        device_argmax ? &next : nullptr, params.on_prefill);
    pending_ = -1;
    res.stats.n_prompt = static_cast<uint32_t>(pending.size());
    const auto t1 = clock::now();
    res.stats.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

    std::vector<int32_t> history(tokens_);
    res.finish_reason = "length";
    while (res.tokens.size() < params.max_tokens) {
        if (!device_argmax) {
            next = smp.sample(logits.data(), static_cast<int32_t>(V), history);
        }
        if (is_stop(next)) {
            res.finish_reason = "stop";
            break;
        }
        res.tokens.push_back(next);
        history.push_back(next);
        if (on_token && !on_token(next)) {
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
        logits = forward(&next, 1, false, device_argmax ? &next : nullptr);
    }
    if (res.finish_reason != "stop" && !res.tokens.empty()) {
        pending_ = res.tokens.back();  // emitted, evaluated by the next call
    }
    res.stats.n_generated = static_cast<uint32_t>(res.tokens.size());
    res.stats.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
    return res;
}

}  // namespace lucebox
