// session_snapshot: where its data lives (snapshot_data, see snapshot.h), its size, and the
// versioned on-disk format
//   "LBXSNAP1", u64 fingerprint length, fingerprint, u64 n_tokens, int32 tokens, u64 pending,
//   u64 n_blobs, then per blob: u64 size, bytes. All integers little-endian (host order).
// The file does not record where the data lived: a device snapshot is saved through host memory,
// and a file loads into plain host memory (or into an engine's memory, engine::load_snapshot).
#include "state/snapshot.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "lucebox/errors.h"

namespace lucebox {

namespace {
constexpr char SNAPSHOT_MAGIC[8] = {'L', 'B', 'X', 'S', 'N', 'A', 'P', '1'};
constexpr size_t STAGING_CHUNK = size_t(64) << 20;  // bytes staged per copy between a file and device memory

uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

// "1.65 GiB" / "3.2 MiB", and with exact: " (1771234567 bytes)" after it
std::string human_bytes(uint64_t n, bool exact = false) {
    char buf[64];
    if (n >= (uint64_t(1) << 30)) {
        std::snprintf(buf, sizeof buf, "%.2f GiB", n / 1073741824.0);
    } else {
        std::snprintf(buf, sizeof buf, "%.1f MiB", n / 1048576.0);
    }
    return exact ? std::string(buf) + " (" + std::to_string(n) + " bytes)" : std::string(buf);
}
}  // namespace

const char * snapshot_location_name(snapshot_location where) {
    return where == snapshot_location::device ? "device" : "host";
}

snapshot_location parse_snapshot_location(const std::string & name) {
    if (name == "host") {
        return snapshot_location::host;
    }
    if (name == "device") {
        return snapshot_location::device;
    }
    throw config_error("snapshot location '" + name + "' must be host or device");
}

ggml_backend_buffer_type_t snapshot_buffer_type(ggml_backend_dev_t dev, snapshot_location where) {
    if (dev != nullptr) {
        if (where == snapshot_location::device) {
            return ggml_backend_dev_buffer_type(dev);
        }
        if (ggml_backend_buffer_type_t pinned = ggml_backend_dev_host_buffer_type(dev)) {
            return pinned;
        }
    }
    return ggml_backend_cpu_buffer_type();
}

snapshot_data::snapshot_data(const std::vector<uint64_t> & sizes, ggml_backend_buffer_type_t buft,
                             snapshot_location where)
    : location_(where), buft_(buft), host_(ggml_backend_buft_is_host(buft)), sizes_(sizes),
      regions_(sizes.size(), nullptr) {
    ggml_init_params ip{ggml_tensor_overhead() * (sizes.size() + 1), nullptr, /*no_alloc=*/true};
    ctx_ = ggml_init(ip);
    if (ctx_ == nullptr) {
        throw out_of_memory_error("could not create a ggml context for a snapshot");
    }
    const uint64_t align = std::max<uint64_t>(1, ggml_backend_buft_get_alignment(buft));
    const uint64_t max_size = ggml_backend_buft_get_max_size(buft);
    // Group the regions into buffers of at most max_size bytes (a region larger than that gets its own).
    std::vector<std::pair<size_t, uint64_t>> groups;  // (first region, bytes)
    std::vector<uint64_t> offset(sizes.size(), 0);
    for (size_t i = 0; i < sizes.size(); ++i) {
        total_ += sizes[i];
        if (sizes[i] == 0) {
            continue;
        }
        if (groups.empty() || groups.back().second + align_up(sizes[i], align) > max_size) {
            groups.emplace_back(i, 0);
        }
        offset[i] = groups.back().second;
        groups.back().second += align_up(sizes[i], align);
    }
    try {
        place(groups, offset);
    } catch (...) {
        release();  // the destructor does not run for a constructor that throws
        throw;
    }
}

void snapshot_data::place(const std::vector<std::pair<size_t, uint64_t>> & groups,
                          const std::vector<uint64_t> & offset) {
    const std::vector<uint64_t> & sizes = sizes_;
    const ggml_backend_buffer_type_t buft = buft_;
    size_t g = 0;
    char * base = nullptr;
    for (size_t i = 0; i < sizes.size(); ++i) {
        if (sizes[i] == 0) {
            continue;
        }
        if (g < groups.size() && groups[g].first == i) {
            ggml_backend_buffer_t buf = ggml_backend_buft_alloc_buffer(buft, groups[g].second);
            if (buf == nullptr) {
                ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
                size_t free = 0, total = 0;
                if (dev != nullptr) {
                    ggml_backend_dev_memory(dev, &free, &total);
                }
                std::string where_free;
                if (dev != nullptr && total > 0) {
                    where_free = "; " + std::string(ggml_backend_dev_name(dev)) + " has " + human_bytes(free) +
                                 " free of " + human_bytes(total);
                }
                throw out_of_memory_error(std::string("out of memory for a ") + snapshot_location_name(location_) +
                                          " snapshot: it needs " + human_bytes(total_, true) + " of " +
                                          ggml_backend_buft_name(buft) + " memory" + where_free);
            }
            buffers_.push_back(buf);
            base = static_cast<char *>(ggml_backend_buffer_get_base(buf));
            ++g;
        }
        ggml_tensor * t = ggml_new_tensor_1d(ctx_, GGML_TYPE_I8, static_cast<int64_t>(sizes[i]));
        if (ggml_backend_tensor_alloc(buffers_.back(), t, base + offset[i]) != GGML_STATUS_SUCCESS) {
            throw error("internal: could not place snapshot region " + std::to_string(i));
        }
        regions_[i] = t;
    }
}

snapshot_data::~snapshot_data() { release(); }

void snapshot_data::release() {
    for (ggml_backend_buffer_t b : buffers_) {
        ggml_backend_buffer_free(b);
    }
    buffers_.clear();
    std::fill(regions_.begin(), regions_.end(), nullptr);
    if (ctx_ != nullptr) {
        ggml_free(ctx_);
        ctx_ = nullptr;
    }
}

std::shared_ptr<const snapshot_data> copy_snapshot_data(const snapshot_data & src, ggml_backend_buffer_type_t buft,
                                                        snapshot_location where) {
    auto dst = std::make_shared<snapshot_data>(src.sizes(), buft, where);
    for (size_t i = 0; i < src.n_regions(); ++i) {
        if (src.region(i) != nullptr) {
            ggml_backend_tensor_copy(src.region(i), dst->region(i));  // set, get or a device copy
        }
    }
    return dst;
}

// ---------------------------------------------------------------------------------------------
// session_snapshot
// ---------------------------------------------------------------------------------------------

snapshot_location session_snapshot::location() const {
    return data ? data->location() : snapshot_location::host;
}

uint64_t session_snapshot::bytes() const {
    return tokens.size() * sizeof(int32_t) + (data ? data->total() : 0);
}

std::vector<uint64_t> session_snapshot::region_sizes() const {
    return data ? data->sizes() : std::vector<uint64_t>{};
}

session_snapshot session_snapshot::to_host() const {
    if (!data || data->location() == snapshot_location::host) {
        return *this;
    }
    session_snapshot s = *this;
    s.data = copy_snapshot_data(*data, snapshot_buffer_type(ggml_backend_buft_get_device(data->buffer_type()),
                                                            snapshot_location::host),
                                snapshot_location::host);
    return s;
}

void session_snapshot::save(const std::string & path) const {
    std::unique_ptr<FILE, int (*)(FILE *)> f(std::fopen((path + ".partial").c_str(), "wb"), &std::fclose);
    if (!f) {
        throw config_error("cannot write snapshot '" + path + "': " + std::strerror(errno));
    }
    auto put = [&](const void * p, size_t n) {
        if (n > 0 && std::fwrite(p, 1, n, f.get()) != n) {
            throw config_error("writing snapshot '" + path + "' failed: " + std::strerror(errno));
        }
    };
    auto put_u64 = [&](uint64_t v) { put(&v, sizeof v); };
    put(SNAPSHOT_MAGIC, sizeof SNAPSHOT_MAGIC);
    put_u64(fingerprint.size());
    put(fingerprint.data(), fingerprint.size());
    put_u64(tokens.size());
    put(tokens.data(), tokens.size() * sizeof(int32_t));
    put_u64(static_cast<uint64_t>(static_cast<int64_t>(pending)));
    const size_t n_regions = data ? data->n_regions() : 0;
    put_u64(n_regions);
    std::vector<uint8_t> staging;  // device data passes through here, one chunk at a time
    for (size_t i = 0; i < n_regions; ++i) {
        const uint64_t n = data->sizes()[i];
        put_u64(n);
        ggml_tensor * r = data->region(i);
        if (r == nullptr) {
            continue;
        }
        if (data->is_host()) {
            put(r->data, n);
            continue;
        }
        staging.resize(static_cast<size_t>(std::min<uint64_t>(n, STAGING_CHUNK)));
        for (uint64_t off = 0; off < n; off += STAGING_CHUNK) {
            const size_t len = static_cast<size_t>(std::min<uint64_t>(STAGING_CHUNK, n - off));
            ggml_backend_tensor_get(r, staging.data(), off, len);
            put(staging.data(), len);
        }
    }
    if (std::fflush(f.get()) != 0) {
        throw config_error("writing snapshot '" + path + "' failed");
    }
    f.reset();
    if (std::rename((path + ".partial").c_str(), path.c_str()) != 0) {
        throw config_error("cannot move snapshot into place at '" + path + "': " + std::strerror(errno));
    }
}

session_snapshot session_snapshot::load(const std::string & path) {
    return load_snapshot_file(path, ggml_backend_cpu_buffer_type(), snapshot_location::host);
}

session_snapshot load_snapshot_file(const std::string & path, ggml_backend_buffer_type_t buft,
                                    snapshot_location where) {
    std::unique_ptr<FILE, int (*)(FILE *)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    if (!f) {
        throw config_error("cannot open snapshot '" + path + "': " + std::strerror(errno));
    }
    std::fseek(f.get(), 0, SEEK_END);
    const uint64_t size = static_cast<uint64_t>(std::ftell(f.get()));
    std::fseek(f.get(), 0, SEEK_SET);
    uint64_t left = size;
    auto get = [&](void * p, uint64_t n, const char * what) {
        if (n > left || (n > 0 && std::fread(p, 1, n, f.get()) != n)) {
            throw config_error("snapshot '" + path + "' is truncated or corrupt (reading " + what + ")");
        }
        left -= n;
    };
    auto get_u64 = [&](const char * what) {
        uint64_t v = 0;
        get(&v, sizeof v, what);
        return v;
    };
    char magic[8];
    get(magic, sizeof magic, "the header");
    if (std::memcmp(magic, SNAPSHOT_MAGIC, sizeof magic) != 0) {
        throw config_error("'" + path + "' is not a lucebox snapshot (or a different version)");
    }
    session_snapshot s;
    const uint64_t fp = get_u64("the fingerprint length");
    s.fingerprint.resize(fp <= left ? fp : 0);
    get(s.fingerprint.data(), fp, "the fingerprint");
    const uint64_t nt = get_u64("the token count");
    if (nt > left / sizeof(int32_t)) {
        throw config_error("snapshot '" + path + "' is truncated or corrupt (token count)");
    }
    s.tokens.resize(nt);
    get(s.tokens.data(), nt * sizeof(int32_t), "the tokens");
    s.pending = static_cast<int32_t>(static_cast<int64_t>(get_u64("the pending token")));
    const uint64_t nb = get_u64("the tensor count");
    if (nb > 4096) {
        throw config_error("snapshot '" + path + "' is corrupt (tensor count " + std::to_string(nb) + ")");
    }
    // First pass: the sizes (and file offsets) of the regions, so the data is allocated once.
    std::vector<uint64_t> sizes(nb);
    std::vector<long long> offsets(nb);
    for (uint64_t i = 0; i < nb; ++i) {
        const uint64_t n = get_u64("a tensor size");
        if (n > left) {
            throw config_error("snapshot '" + path + "' is truncated or corrupt (tensor " + std::to_string(i) + ")");
        }
        sizes[i] = n;
        offsets[i] = static_cast<long long>(size - left);
        if (fseeko(f.get(), static_cast<off_t>(n), SEEK_CUR) != 0) {
            throw config_error("snapshot '" + path + "': seek failed (" + std::strerror(errno) + ")");
        }
        left -= n;
    }
    if (left != 0) {
        throw config_error("snapshot '" + path + "' has " + std::to_string(left) + " unexpected trailing bytes");
    }
    // Second pass: the data, straight into host memory or staged in chunks to the device.
    auto data = std::make_shared<snapshot_data>(sizes, buft, where);
    std::vector<uint8_t> staging;
    for (uint64_t i = 0; i < nb; ++i) {
        ggml_tensor * r = data->region(i);
        if (r == nullptr) {
            continue;
        }
        if (fseeko(f.get(), static_cast<off_t>(offsets[i]), SEEK_SET) != 0) {
            throw config_error("snapshot '" + path + "': seek failed (" + std::strerror(errno) + ")");
        }
        const uint64_t n = sizes[i];
        for (uint64_t off = 0; off < n; off += STAGING_CHUNK) {
            const size_t len = static_cast<size_t>(std::min<uint64_t>(STAGING_CHUNK, n - off));
            uint8_t * dst = nullptr;
            if (data->is_host()) {
                dst = static_cast<uint8_t *>(r->data) + off;
            } else {
                staging.resize(std::max(staging.size(), len));
                dst = staging.data();
            }
            if (std::fread(dst, 1, len, f.get()) != len) {
                throw config_error("snapshot '" + path + "' is truncated or corrupt (reading tensor data)");
            }
            if (!data->is_host()) {
                ggml_backend_tensor_set(r, dst, off, len);
            }
        }
    }
    s.data = std::move(data);
    return s;
}

}  // namespace lucebox
