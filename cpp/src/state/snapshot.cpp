// session_snapshot: size and the versioned on-disk format
//   "LBXSNAP1", u64 fingerprint length, fingerprint, u64 n_tokens, int32 tokens, u64 pending,
//   u64 n_blobs, then per blob: u64 size, bytes. All integers little-endian (host order).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "lucebox/engine.h"
#include "lucebox/errors.h"

namespace lucebox {

namespace {
constexpr char SNAPSHOT_MAGIC[8] = {'L', 'B', 'X', 'S', 'N', 'A', 'P', '1'};
}  // namespace

uint64_t session_snapshot::bytes() const {
    uint64_t n = tokens.size() * sizeof(int32_t);
    for (const auto & b : blobs) {
        n += b.size();
    }
    return n;
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
    put_u64(blobs.size());
    for (const auto & b : blobs) {
        put_u64(b.size());
        put(b.data(), b.size());
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
    for (uint64_t i = 0; i < nb; ++i) {
        const uint64_t n = get_u64("a tensor size");
        if (n > left) {
            throw config_error("snapshot '" + path + "' is truncated or corrupt (tensor " + std::to_string(i) + ")");
        }
        std::vector<uint8_t> blob(n);
        get(blob.data(), n, "tensor data");
        s.blobs.push_back(std::move(blob));
    }
    if (left != 0) {
        throw config_error("snapshot '" + path + "' has " + std::to_string(left) + " unexpected trailing bytes");
    }
    return s;
}

}  // namespace lucebox
