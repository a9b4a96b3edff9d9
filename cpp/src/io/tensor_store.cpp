#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <unordered_set>

#include "../graph/builders.h"
#include "cuda_kernels.h"
#include "lucebox/backend_buffers.h"
#include "lucebox/errors.h"
#include "lucebox/gguf_file.h"
#include "q8_0_ggml_args.h"
#include "weight_tiles.h"

namespace lucebox {

namespace {
std::string gib(uint64_t n) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f GiB", n / 1073741824.0);
    return buf;
}
}  // namespace

tensor_store::tensor_store(tensor_store && o) noexcept
    : ctx_(o.ctx_), buffer_(o.buffer_), by_name_(std::move(o.by_name_)), tiled_(o.tiled_) {
    o.ctx_ = nullptr;
    o.buffer_ = nullptr;
    o.tiled_ = false;
}

tensor_store & tensor_store::operator=(tensor_store && o) noexcept {
    if (this != &o) {
        release();
        ctx_ = o.ctx_;
        buffer_ = o.buffer_;
        by_name_ = std::move(o.by_name_);
        tiled_ = o.tiled_;
        o.ctx_ = nullptr;
        o.buffer_ = nullptr;
        o.tiled_ = false;
    }
    return *this;
}

tensor_store::~tensor_store() { release(); }

void tensor_store::release() {
    by_name_.clear();
    if (buffer_) {
        if (tiled_) {  // before the memory can be handed out again
            kernels::tiles::remove_within(ggml_backend_buffer_get_base(buffer_), ggml_backend_buffer_get_size(buffer_));
            tiled_ = false;
        }
        ggml_backend_buffer_free(buffer_);
        buffer_ = nullptr;
    }
    if (ctx_) {
        ggml_free(ctx_);
        ctx_ = nullptr;
    }
}

tensor_store tensor_store::allocate(ggml_backend_buffer_type_t buft, ggml_backend_dev_t dev, size_t max_tensors,
                                    const std::function<void(ggml_context *)> & define, const std::string & what) {
    tensor_store s;
    ggml_init_params ip{ggml_tensor_overhead() * (max_tensors + 1), nullptr, /*no_alloc=*/true};
    s.ctx_ = ggml_init(ip);
    if (s.ctx_ == nullptr) {
        throw out_of_memory_error("could not create a ggml context for " + what);
    }
    define(s.ctx_);
    size_t needed = 0;
    for (ggml_tensor * t = ggml_get_first_tensor(s.ctx_); t != nullptr; t = ggml_get_next_tensor(s.ctx_, t)) {
        if (t->view_src == nullptr) {
            needed += ggml_backend_buft_get_alloc_size(buft, t);
        }
        s.by_name_[ggml_get_name(t)] = t;
    }
    if (needed == 0) {
        return s;
    }
    s.buffer_ = ggml_backend_alloc_ctx_tensors_from_buft(s.ctx_, buft);
    if (s.buffer_ == nullptr) {
        size_t free = 0, total = 0;
        if (dev != nullptr) {
            ggml_backend_dev_memory(dev, &free, &total);
        }
        throw out_of_memory_error("out of memory allocating " + what + ": needed " + gib(needed) + " on " +
                                  ggml_backend_buft_name(buft) + " (device free: " + gib(free) + " of " + gib(total) +
                                  ")");
    }
    ggml_backend_buffer_set_usage(s.buffer_, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    return s;
}

namespace {
// The stacks of `group`: its runs of at least two consecutive members (in the group's order) that
// are found in the file, wanted, two-dimensional, in no earlier stack (`taken`) and of one type and
// row length. A member that breaks a run starts the next one, so a group whose first member has
// another type (a real Q4_K_M file's Q6_K attn_qkv before Q4_K attn_gate, ssm_beta, ssm_alpha) still
// stacks the rest.
std::vector<std::vector<const gguf_tensor_entry *>> stackable_runs(const gguf_file & file, const std::vector<std::string> & group,
                                                                   const std::unordered_set<std::string> & wanted,
                                                                   const std::unordered_set<std::string> & taken) {
    std::vector<std::vector<const gguf_tensor_entry *>> runs;
    std::vector<const gguf_tensor_entry *> run;
    auto close = [&] {
        if (run.size() >= 2) runs.push_back(run);
        run.clear();
    };
    for (const std::string & n : group) {
        const gguf_tensor_entry * e = wanted.count(n) && !taken.count(n) ? file.find_tensor(n) : nullptr;
        const bool matrix = e != nullptr && e->ne[2] == 1 && e->ne[3] == 1;
        if (!matrix || (!run.empty() && (e->type != run[0]->type || e->ne[0] != run[0]->ne[0]))) close();
        if (matrix) run.push_back(e);
    }
    close();
    return runs;
}
}  // namespace

// Whether `dev`'s backend runs a DeltaNet layer's causal conv of `width` taps. ggml's CUDA backend
// (registered as "ROCm" / "MUSA" where the same source is built for those) has kernels for a few widths
// (graph::cuda_conv_kernel); on one device the graph runs a narrower width as the next of those with zero
// taps (graph::ssm_conv), so only widths above 15 are out of its reach, while a tensor split runs the conv
// as it is. Other backends run any width.
static bool runs_conv_width(ggml_backend_dev_t dev, int64_t width, bool split) {
    const char * backend = ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev));
    const bool cuda_source = std::strcmp(backend, "CUDA") == 0 || std::strcmp(backend, "ROCm") == 0 ||
                             std::strcmp(backend, "MUSA") == 0;
    return !cuda_source || (split ? graph::cuda_conv_kernel(width) : width <= 15);
}

bool is_meta(ggml_backend_buffer_type_t buft) {
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    return dev != nullptr && ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_META;
}

void check_weights_runnable(const gguf_file & file, const std::vector<std::string> & names, ggml_backend_dev_t dev,
                            bool split) {
    ggml_init_params ip{ggml_tensor_overhead() * 8, nullptr, /*no_alloc=*/true};
    std::unique_ptr<ggml_context, void (*)(ggml_context *)> ctx(ggml_init(ip), &ggml_free);
    if (!ctx) {
        throw out_of_memory_error("could not create a ggml context to check the weights of '" + file.path() + "'");
    }
    // One probe per (type, row length, lookup or not): the shapes that ggml's support checks read.
    std::unordered_set<std::string> probed;
    for (const std::string & n : names) {
        const gguf_tensor_entry * e = file.find_tensor(n);
        if (e == nullptr || e->ne[1] == 1) {  // missing (load reports it) or 1-D: no product
            continue;
        }
        const std::string conv_suffix = ".ssm_conv1d.weight";  // [d_conv, conv_dim]
        if (n.size() > conv_suffix.size() && n.compare(n.size() - conv_suffix.size(), conv_suffix.size(), conv_suffix) == 0 &&
            !runs_conv_width(dev, e->ne[0], split)) {
            throw unsupported_error(file.where() + "tensor '" + n + "' is a convolution of width " + std::to_string(e->ne[0]) +
                                    " (ssm.conv_kernel), and ggml's " + ggml_backend_dev_name(dev) + " backend runs " +
                                    (split ? "widths 3, 4, 5, 9 and 15 only in a tensor split: split by layers"
                                           : "widths up to 15 only") + ", or run the model on another device");
        }
        const bool lookup = n == "token_embd.weight";
        if (!probed.insert(std::to_string(e->type) + ":" + std::to_string(e->ne[0]) + (lookup ? ":rows" : "")).second) {
            continue;
        }
        ggml_tensor * w = ggml_new_tensor_2d(ctx.get(), e->type, e->ne[0], e->ne[1]);
        ggml_tensor * x = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, e->ne[0], 1);
        ggml_tensor * ids = ggml_new_tensor_1d(ctx.get(), GGML_TYPE_I32, 1);
        const char * what = nullptr;
        if (!ggml_backend_dev_supports_op(dev, ggml_mul_mat(ctx.get(), w, x))) {
            what = "multiply";
        } else if (lookup && !ggml_backend_dev_supports_op(dev, ggml_get_rows(ctx.get(), w, ids))) {
            what = "look up rows of";
        }
        ggml_reset(ctx.get());
        if (what != nullptr) {
            throw unsupported_error(file.where() + "tensor '" + n + "' is " + ggml_type_name(e->type) + " with rows of " +
                                    std::to_string(e->ne[0]) + " values, and ggml's " + ggml_backend_dev_name(dev) +
                                    " backend cannot " + what + " such a tensor: requantize the model to a type that " +
                                    ggml_backend_dev_name(dev) + " supports (q8_0, q4_K, ...), or run it on another device");
        }
    }
}

tensor_store tensor_store::load(const gguf_file & file, const std::vector<std::string> & names,
                                ggml_backend_buffer_type_t buft, ggml_backend_dev_t dev, const progress_callback & progress,
                                const std::vector<std::vector<std::string>> & stacks) {
    std::vector<const gguf_tensor_entry *> entries;
    std::unordered_set<std::string> wanted;
    uint64_t total = 0;
    for (const std::string & n : names) {
        const gguf_tensor_entry * e = file.find_tensor(n);
        if (e == nullptr) {
            throw gguf_error(file.where() + "missing tensor '" + n + "'");
        }
        wanted.insert(n);
        entries.push_back(e);
        total += e->nbytes;
    }
    // A meta buffer (tensor parallel) may report host memory, but its tensors have no address of
    // their own: each is set whole, so ggml can deal its slices to the devices.
    const bool meta = is_meta(buft);
    if (!meta && dev != nullptr) {  // a tensor split checks each of its devices itself
        check_weights_runnable(file, names, dev);
    }
    std::vector<std::vector<const gguf_tensor_entry *>> stacked;
    std::unordered_set<std::string> in_stack;
    for (const auto & group : meta ? std::vector<std::vector<std::string>>{} : stacks) {
        for (auto & members : stackable_runs(file, group, wanted, in_stack)) {
            for (const gguf_tensor_entry * e : members) {
                in_stack.insert(e->name);
            }
            stacked.push_back(std::move(members));
        }
    }
    tensor_store s = allocate(buft, dev, entries.size() + stacked.size(), [&](ggml_context * ctx) {
        for (const auto & members : stacked) {
            int64_t rows = 0;
            for (const gguf_tensor_entry * e : members) {
                rows += e->ne[1];
            }
            ggml_tensor * stack = ggml_new_tensor_2d(ctx, members[0]->type, members[0]->ne[0], rows);
            ggml_format_name(stack, "stack:%s", members[0]->name.c_str());
            int64_t row = 0;
            for (const gguf_tensor_entry * e : members) {
                ggml_tensor * t = ggml_view_2d(ctx, stack, e->ne[0], e->ne[1], stack->nb[1], size_t(row) * stack->nb[1]);
                ggml_set_name(t, e->name.c_str());
                row += e->ne[1];
            }
        }
        for (const gguf_tensor_entry * e : entries) {
            if (!in_stack.count(e->name)) {
                ggml_tensor * t = ggml_new_tensor(ctx, e->type, 4, e->ne.data());
                ggml_set_name(t, e->name.c_str());
            }
        }
    }, "the weights of '" + file.path() + "'");

    std::unique_ptr<FILE, int (*)(FILE *)> fp(std::fopen(file.path().c_str(), "rb"), &std::fclose);
    if (!fp) {
        throw gguf_error(file.where() + "cannot open for reading (" + std::strerror(errno) + ")");
    }
    const bool host = !meta && ggml_backend_buffer_is_host(s.buffer_);
    // Row-tiled matrices (weight_tiles.h): which entries, and a stack only as a whole.
    std::unordered_set<const gguf_tensor_entry *> tiled;
    if (!meta && !host && kernels::tile_weights_in(s.buffer_)) {
        // Q6_K (210-byte chunks) only in whole 16-row tiles: the kernel stages a tile's chunk as 16 x 210
        // bytes of 16-byte vectors
        auto tileable = [](const gguf_tensor_entry * e) {
            kernels::q8_0::weight_type wt;
            return kernels::q8_0::kernel_weight_type(e->type, /*tiled =*/true, wt) &&
                   (wt != kernels::q8_0::weight_type::q6_k || e->ne[1] % kernels::tiles::TILE_ROWS == 0) &&
                   e->ne[2] == 1 && e->ne[3] == 1 &&
                   e->ne[0] % kernels::tiles::CHUNK_VALUES == 0 && e->ne[1] > 0 && e->name != "token_embd.weight";
        };
        for (const gguf_tensor_entry * e : entries)
            if (!in_stack.count(e->name) && tileable(e)) tiled.insert(e);
        for (const auto & members : stacked) {
            bool ok = true;
            for (size_t i = 0; i < members.size(); ++i)
                ok = ok && tileable(members[i]) && (i + 1 == members.size() || members[i]->ne[1] % kernels::tiles::TILE_ROWS == 0);
            if (ok) tiled.insert(members.begin(), members.end());
        }
    }
    std::vector<uint8_t> staging, tiles_staging;
    std::unordered_set<const ggml_tensor *> registered;
    uint64_t done = 0;
    for (const gguf_tensor_entry * e : entries) {
        ggml_tensor * t = s.get(e->name);
        if (fseeko(fp.get(), static_cast<off_t>(e->offset), SEEK_SET) != 0) {
            throw gguf_error(file.where() + "seek failed for tensor '" + e->name + "'");
        }
        const bool tile = tiled.count(e) != 0;
        const int64_t row_bytes = tile ? int64_t(e->nbytes / uint64_t(e->ne[1])) : 0;
        const int64_t chunk_bytes = tile ? row_bytes / (e->ne[0] / kernels::tiles::CHUNK_VALUES) : 0;  // of 256 values
        const int64_t tile_bytes = kernels::tiles::TILE_ROWS * row_bytes;
        size_t chunk = meta ? std::max<size_t>(e->nbytes, 1) : 64u << 20;
        if (tile) chunk = size_t(std::max<int64_t>(1, int64_t(chunk) / tile_bytes) * tile_bytes);  // whole tiles
        for (uint64_t off = 0; off < e->nbytes; off += chunk) {
            const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, e->nbytes - off));
            uint8_t * dst = nullptr;
            if (host) {
                dst = static_cast<uint8_t *>(t->data) + off;
            } else {
                staging.resize(std::max(staging.size(), n));
                dst = staging.data();
            }
            if (std::fread(dst, 1, n, fp.get()) != n) {
                throw gguf_error(file.where() + "truncated while reading tensor '" + e->name + "'");
            }
            if (tile) {  // these rows (whole tiles, or the matrix's last) in the tiled order
                tiles_staging.resize(std::max(tiles_staging.size(), n));
                kernels::tiles::to_tiles(dst, tiles_staging.data(), int64_t(n) / row_bytes, row_bytes, chunk_bytes);
                dst = tiles_staging.data();
            }
            if (!host) {
                ggml_backend_tensor_set(t, dst, off, n);
            }
            done += n;
            if (progress) {
                progress(done, total);
            }
        }
        if (tile) {  // the whole stack once (its members lie inside it), or the matrix
            const ggml_tensor * whole = t->view_src != nullptr ? t->view_src : t;
            if (registered.insert(whole).second) {
                kernels::tiles::add(whole->data, whole->ne[1], row_bytes);
                s.tiled_ = true;
            }
        }
    }
    return s;
}

ggml_tensor * tensor_store::find(const std::string & name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second;
}

ggml_tensor * tensor_store::get(const std::string & name) const {
    ggml_tensor * t = find(name);
    if (t == nullptr) {
        throw error("internal: tensor '" + name + "' was not loaded");
    }
    return t;
}

void tensor_store::clear() {
    if (buffer_) {
        ggml_backend_buffer_clear(buffer_, 0);
    }
}

}  // namespace lucebox
