#include "tensor_parallel.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>

#include "ggml-cpu.h"
#include "graph/builders.h"
#include "lucebox/errors.h"
#include "lucebox/tensor_spec.h"
#include "placement.h"

// ggml's internal backend header (pinned tree): the meta backend's simple backends, and the device
// and buffer-type structs wrapped below.
#include "ggml-backend-impl.h"

namespace lucebox {

namespace {

using graph::MAX_GRAPH_NODES;

// n units dealt over n_dev devices: the first (n % n_dev) devices get one more.
std::vector<int64_t> deal(int64_t n, size_t n_dev) {
    std::vector<int64_t> out(n_dev, n / int64_t(n_dev));
    for (size_t j = 0; j < size_t(n % int64_t(n_dev)); ++j) {
        out[j] += 1;
    }
    return out;
}

std::string sizes(const std::vector<int64_t> & v, int64_t scale) {
    std::string s;
    for (size_t j = 0; j < v.size(); ++j) {
        s += (j ? ", " : "") + std::to_string(v[j] * scale);
    }
    return s;
}

// "blk.<il>.<suffix>" -> suffix; "<prefix>-<il>" -> prefix; else the name.
std::string kind_of(const std::string & name) {
    if (name.compare(0, 4, "blk.") == 0) {
        const size_t dot = name.find('.', 4);
        return dot == std::string::npos ? name : name.substr(dot + 1);
    }
    const size_t dash = name.rfind('-');
    return dash == std::string::npos ? name : name.substr(0, dash);
}

ggml_backend_meta_split_state mirrored() {
    ggml_backend_meta_split_state s{};
    s.axis = GGML_BACKEND_SPLIT_AXIS_MIRRORED;
    s.nr[0] = 1;
    s.n_segments = 1;
    return s;
}

// One segment of `per_unit * units[j]` elements on device j along `axis`, repeated `nr` times.
ggml_backend_meta_split_state sliced(int axis, const std::vector<int64_t> & units, int64_t per_unit, uint32_t nr) {
    ggml_backend_meta_split_state s{};
    s.axis = ggml_backend_meta_split_axis(axis);
    for (size_t j = 0; j < units.size(); ++j) {
        s.ne[j] = units[j] * per_unit;
    }
    s.nr[0] = nr;
    s.n_segments = 1;
    return s;
}

ggml_backend_meta_split_state split_state_callback(const ggml_tensor * t, void * ud) {
    return static_cast<const tensor_split_plan *>(ud)->state_of(ggml_get_name(t));
}

// CPU slices of a meta device. The meta backend treats a view of a static tensor in a *host*
// buffer as a plain host tensor (the FIXME at ggml-backend-meta.cpp:2019 and :2191, meant for
// llama.cpp's s_copy_main), so over CPU devices every in-place write into a state tensor (a cpy or
// set_rows whose result views the cache) would run on the meta tensor, which has no memory of its
// own. A meta device over GPUs never meets this (their buffers are not host). So the CPU devices of
// a tensor split are given as this wrapper: the CPU device with a CPU buffer type that reports
// device (non-host) memory. The memory is the same host memory and the backends are plain CPU
// backends; only ggml's host shortcuts are off (copies go through get/set, which CPU buffers serve).
ggml_backend_buffer_type_t cpu_slice_buffer_type();

bool cpu_slice_supports_buft(ggml_backend_dev_t, ggml_backend_buffer_type_t buft) {
    return buft == cpu_slice_buffer_type() || ggml_backend_buft_is_host(buft);
}

ggml_backend_buffer_type_t cpu_slice_get_buffer_type(ggml_backend_dev_t);

ggml_backend_dev_t cpu_slice_device() {
    static ggml_backend_device dev = [] {
        ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        ggml_backend_device d = *cpu;
        d.iface.get_buffer_type = cpu_slice_get_buffer_type;
        d.iface.get_host_buffer_type = nullptr;
        d.iface.buffer_from_host_ptr = nullptr;
        d.iface.supports_buft = cpu_slice_supports_buft;
        return d;
    }();
    return &dev;
}

bool cpu_slice_is_host(ggml_backend_buffer_type_t) { return false; }

ggml_backend_buffer_type_t cpu_slice_buffer_type() {
    static ggml_backend_buffer_type buft = [] {
        ggml_backend_buffer_type b = *ggml_backend_cpu_buffer_type();
        b.iface.is_host = cpu_slice_is_host;
        b.device = cpu_slice_device();
        return b;
    }();
    return &buft;
}

ggml_backend_buffer_type_t cpu_slice_get_buffer_type(ggml_backend_dev_t) { return cpu_slice_buffer_type(); }

std::mutex & meta_device_mutex() {  // ggml_backend_meta_device keeps a static cache (not thread-safe)
    static std::mutex m;
    return m;
}

}  // namespace

tensor_split_plan tensor_split_plan::make(const qwen35_hparams & hp, size_t n_devices,
                                          const std::function<ggml_type(const std::string &)> & type_of,
                                          ggml_type type_k, ggml_type type_v) {
    tensor_split_plan p;
    p.hp = hp;
    p.n = n_devices;
    const int64_t n = int64_t(n_devices);
    auto need_units = [&](int64_t have, const std::string & what) {
        if (have < n) {
            throw config_error("split='tensor': " + what + " cannot be divided over " + std::to_string(n) +
                               " devices (each device needs at least one); use fewer devices or split='layer'");
        }
    };
    // a slice on a tensor's axis 0 (the input axis of a matrix, or a cache row) must hold whole blocks
    auto check_blocks = [&](const std::string & tensor, ggml_type type, const std::vector<int64_t> & units,
                            int64_t per_unit) {
        const int64_t blck = ggml_blck_size(type);
        for (int64_t u : units) {
            if ((u * per_unit) % blck != 0) {
                throw config_error("split='tensor': " + tensor + " (" + ggml_type_name(type) + ", blocks of " +
                                   std::to_string(blck) + ") would be cut into slices of " +
                                   sizes(units, per_unit) + " along its input axis, not whole blocks; "
                                   "use another device count, another weight type or split='layer'");
            }
        }
    };
    const int64_t dk = hp.ssm_d_state;
    const int64_t q_per_kv = hp.n_head_kv ? hp.n_head / hp.n_head_kv : 0;
    if (hp.n_recurrent_layers() > 0) {
        need_units(hp.ssm_n_k_heads, "the DeltaNet K heads (ssm.group_count = " + std::to_string(hp.ssm_n_k_heads) + ")");
        p.k_heads = deal(hp.ssm_n_k_heads, n_devices);
    }
    if (hp.n_attention_layers() > 0) {
        need_units(hp.n_head_kv, "the attention KV heads (head_count_kv = " + std::to_string(hp.n_head_kv) + ")");
        p.kv_heads = deal(hp.n_head_kv, n_devices);
        check_blocks("the KV cache K rows", type_k, p.kv_heads, hp.head_dim);
        check_blocks("the KV cache V rows", type_v, p.kv_heads, hp.head_dim);
    }
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        const int64_t blck = ggml_blck_size(type_of("blk." + std::to_string(il) + ".ffn_down.weight"));
        p.ff_block = std::lcm(p.ff_block, blck);
    }
    if (hp.n_ff % p.ff_block != 0) {
        throw config_error("split='tensor': n_ff " + std::to_string(hp.n_ff) + " is not a multiple of the ffn_down "
                           "block " + std::to_string(p.ff_block));
    }
    need_units(hp.n_ff / p.ff_block, "the FFN (" + std::to_string(hp.n_ff) + " channels in blocks of " +
                                         std::to_string(p.ff_block) + ")");
    p.ff_blocks = deal(hp.n_ff / p.ff_block, n_devices);
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        if (hp.is_recurrent[il]) {
            check_blocks(b + "ssm_out.weight", type_of(b + "ssm_out.weight"), p.k_heads, dk);
        } else {
            check_blocks(b + "attn_output.weight", type_of(b + "attn_output.weight"), p.kv_heads,
                         q_per_kv * hp.head_dim);
        }
    }
    return p;
}

ggml_backend_meta_split_state tensor_split_plan::state_of(const std::string & name) const {
    const std::string k = kind_of(name);
    const int64_t dk = hp.ssm_d_state, hd = hp.head_dim;
    const uint32_t ratio = hp.ssm_n_k_heads ? hp.ssm_n_v_heads / hp.ssm_n_k_heads : 1;  // V blocks
    const int64_t q_per_kv = hp.n_head_kv ? hp.n_head / hp.n_head_kv : 0;
    // DeltaNet: [q | k | V blocks] channels and V-head tensors, a K-head slice repeated
    if (k == "attn_qkv.weight" || k == "ssm_conv1d.weight" || k == "cache_conv" || k == "ckpt_conv") {
        return sliced(1, k_heads, dk, 2 + ratio);  // [E | d_conv | time, conv_dim]
    }
    if (k == "attn_gate.weight") {
        return sliced(1, k_heads, dk, ratio);  // [E, value_dim]
    }
    if (k == "ssm_out.weight") {
        return sliced(0, k_heads, dk, ratio);  // [value_dim, E]: partial sums
    }
    if (k == "ssm_alpha.weight" || k == "ssm_beta.weight" || k == "cache_ssm") {
        return sliced(1, k_heads, 1, ratio);  // [E | dk*dk, Hv]
    }
    if (k == "ssm_dt.bias" || k == "ssm_a") {
        return sliced(0, k_heads, 1, ratio);  // [Hv]
    }
    if (k == "ckpt_ssm") {
        return sliced(0, k_heads, dk * dk, ratio);  // [dk*dk*Hv, n_checkpoints]
    }
    // attention: whole KV-head groups (q+gate of the group's query heads)
    if (k == "attn_q.weight") {
        return sliced(1, kv_heads, 2 * hd * q_per_kv, 1);  // [E, 2*H*hd]
    }
    if (k == "attn_k.weight" || k == "attn_v.weight") {
        return sliced(1, kv_heads, hd, 1);  // [E, Hkv*hd]
    }
    if (k == "cache_k" || k == "cache_v") {
        return sliced(0, kv_heads, hd, 1);  // [Hkv*hd, kv_size]
    }
    if (k == "attn_output.weight") {
        return sliced(0, kv_heads, hd * q_per_kv, 1);  // [H*hd, E]: partial sums
    }
    if (k == "ffn_gate.weight" || k == "ffn_up.weight") {
        return sliced(1, ff_blocks, ff_block, 1);  // [E, n_ff]
    }
    if (k == "ffn_down.weight") {
        return sliced(0, ff_blocks, ff_block, 1);  // [n_ff, E]: partial sums
    }
    return mirrored();  // embedding, LM head, norms, feature rings
}

tensor_split::tensor_split(const engine_config & cfg, const target_model_file & target, ggml_type type_k,
                           ggml_type type_v, int n_threads, ggml_backend_dev_t draft_dev,
                           const progress_callback & progress) {
    const qwen35_hparams & hp = target.hparams;
    auto type_of = [&](const std::string & n) {
        const gguf_tensor_entry * e = target.file.find_tensor(n);
        if (e == nullptr) {
            throw gguf_error(target.file.where() + "missing tensor '" + n + "'");
        }
        return e->type;
    };
    plan_ = std::make_unique<tensor_split_plan>(
        tensor_split_plan::make(hp, cfg.devices.size(), type_of, type_k, type_v));
    try {
        std::vector<ggml_backend_dev_t> devs;
        names_ = "Meta(";  // (the pinned ggml names a meta device "Meta()": it reads a moved-from list)
        for (const std::string & d : cfg.devices) {
            ggml_backend_dev_t dev = resolve_device(d);  // cpu:N are all the CPU device: one slice each
            names_ += (devs.empty() ? "" : ",") + std::string(ggml_backend_dev_name(dev));
            devs.push_back(ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU ? cpu_slice_device() : dev);
        }
        names_ += ")";
        const std::vector<std::string> names = tensors_to_load(target.file, qwen35_tensor_specs(hp));
        for (ggml_backend_dev_t dev : devs) {
            check_weights_runnable(target.file, names, dev, /*split=*/true);
        }
        {
            std::lock_guard<std::mutex> lock(meta_device_mutex());
            meta_dev_ = ggml_backend_meta_device(devs.data(), devs.size(), split_state_callback, plan_.get());
        }
        meta_ = ggml_backend_dev_init(meta_dev_, nullptr);
        if (meta_ == nullptr) {
            throw unsupported_error("could not initialise the meta backend over " + device_names());
        }
        for (size_t j = 0; j < ggml_backend_meta_n_backends(meta_); ++j) {
            ggml_backend_t simple = ggml_backend_meta_simple_backend(meta_, j);
            if (ggml_backend_dev_type(ggml_backend_get_device(simple)) == GGML_BACKEND_DEVICE_TYPE_CPU) {
                configure_cpu_backend(simple, n_threads);
            }
        }
        cpu_ = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
        configure_cpu_backend(cpu_, n_threads);

        weights_ = tensor_store::load(target.file, names, buffer_type(), meta_dev_, progress);
        w_ = bind_qwen35_weights(hp, weights_);
        draft_w_ = w_;
        if (draft_dev != nullptr) {  // the draft's plain copies of the shared tensors
            std::vector<std::string> shared{"token_embd.weight"};
            if (hp.has_output) {
                shared.push_back("output.weight");
            }
            draft_side_store_ = tensor_store::load(target.file, shared, ggml_backend_dev_buffer_type(draft_dev),
                                                   draft_dev, {});
            draft_w_.token_embd = draft_side_store_.get("token_embd.weight");
            draft_w_.output = hp.has_output ? draft_side_store_.get("output.weight") : draft_w_.token_embd;
        }
        ggml_backend_t backends[2] = {meta_, cpu_};
        sched_ = ggml_backend_sched_new(backends, nullptr, 2, MAX_GRAPH_NODES, false, true);
        sched_aux_ = ggml_backend_sched_new(backends, nullptr, 2, MAX_GRAPH_NODES, false, true);
    } catch (...) {
        release();  // the destructor does not run for a constructor that throws
        throw;
    }
}

tensor_split::~tensor_split() { release(); }

void tensor_split::release() {
    if (sched_) {
        ggml_backend_sched_free(sched_);
        sched_ = nullptr;
    }
    if (sched_aux_) {
        ggml_backend_sched_free(sched_aux_);
        sched_aux_ = nullptr;
    }
    weights_ = tensor_store();
    draft_side_store_ = tensor_store();
    if (meta_) {
        ggml_backend_free(meta_);
        meta_ = nullptr;
    }
    if (cpu_) {
        ggml_backend_free(cpu_);
        cpu_ = nullptr;
    }
}

void tensor_split::assign(ggml_backend_sched_t s, ggml_cgraph * gf) const {
    for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {
        ggml_backend_sched_set_tensor_backend(s, ggml_graph_node(gf, i), meta_);
    }
}

std::string tensor_split::device_names() const {
    return names_;
}

}  // namespace lucebox
