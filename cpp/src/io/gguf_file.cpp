#include "lucebox/gguf_file.h"

#include <cerrno>
#include <cstring>
#include <limits>
#include <sstream>
#include <sys/stat.h>

#include "gguf.h"
#include "lucebox/errors.h"
#include "lucebox/log.h"

namespace lucebox {

std::string gguf_tensor_entry::shape_string() const {
    std::ostringstream os;
    os << '[';
    for (int i = 0; i < n_dims; ++i) {
        os << (i ? ", " : "") << ne[i];
    }
    os << ']';
    return os.str();
}

gguf_file gguf_file::open(const std::string & path) {
    gguf_file f;
    f.path_ = path;

    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        throw gguf_error("file '" + path + "': cannot open (" + std::strerror(errno) + ")");
    }
    if (!S_ISREG(st.st_mode)) {
        throw gguf_error("file '" + path + "': not a regular file");
    }
    f.file_size_ = static_cast<uint64_t>(st.st_size);

    {
        log_capture capture;
        gguf_init_params params{/*no_alloc =*/true, /*ctx =*/nullptr};
        f.ctx_ = gguf_init_from_file(path.c_str(), params);
        if (f.ctx_ == nullptr) {
            std::string reason = capture.last_line();
            if (reason.empty()) {
                reason = "not a valid GGUF file";
            }
            throw gguf_error(f.where() + "malformed or truncated GGUF (" + reason + "; the file has " +
                             std::to_string(f.file_size_) + " bytes)");
        }
    }

    const int64_t n = gguf_get_n_tensors(f.ctx_);
    const uint64_t data_start = gguf_get_data_offset(f.ctx_);
    f.tensors_.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
        gguf_tensor_entry t;
        t.name = gguf_get_tensor_name(f.ctx_, i);
        t.type = gguf_get_tensor_type(f.ctx_, i);
        const int64_t * ne = gguf_get_tensor_ne(f.ctx_, i);
        t.n_dims = 1;
        for (int d = 0; d < 4; ++d) {
            t.ne[d] = ne[d];
            if (ne[d] != 1) {
                t.n_dims = d + 1;
            }
        }
        t.offset = data_start + gguf_get_tensor_offset(f.ctx_, i);
        t.nbytes = gguf_get_tensor_size(f.ctx_, i);
        if (t.offset > f.file_size_ || t.nbytes > f.file_size_ - t.offset) {
            std::ostringstream os;
            os << f.where() << "truncated: tensor '" << t.name << "' needs bytes [" << t.offset << ", "
               << t.offset + t.nbytes << ") but the file has " << f.file_size_ << " bytes";
            throw gguf_error(os.str());
        }
        f.tensor_index_.emplace(t.name, f.tensors_.size());
        f.tensors_.push_back(std::move(t));
    }
    return f;
}

gguf_file::gguf_file(gguf_file && o) noexcept
    : path_(std::move(o.path_)),
      file_size_(o.file_size_),
      ctx_(o.ctx_),
      tensors_(std::move(o.tensors_)),
      tensor_index_(std::move(o.tensor_index_)) {
    o.ctx_ = nullptr;
}

gguf_file & gguf_file::operator=(gguf_file && o) noexcept {
    if (this != &o) {
        if (ctx_) {
            gguf_free(ctx_);
        }
        path_ = std::move(o.path_);
        file_size_ = o.file_size_;
        ctx_ = o.ctx_;
        tensors_ = std::move(o.tensors_);
        tensor_index_ = std::move(o.tensor_index_);
        o.ctx_ = nullptr;
    }
    return *this;
}

gguf_file::~gguf_file() {
    if (ctx_) {
        gguf_free(ctx_);
    }
}

uint64_t gguf_file::data_offset() const { return gguf_get_data_offset(ctx_); }

std::string gguf_file::where() const { return "file '" + path_ + "': "; }

bool gguf_file::has_key(const std::string & key) const { return gguf_find_key(ctx_, key.c_str()) >= 0; }

int64_t gguf_file::key_id(const std::string & key) const {
    const int64_t id = gguf_find_key(ctx_, key.c_str());
    if (id < 0) {
        throw gguf_error(where() + "missing required key '" + key + "'");
    }
    return id;
}

void gguf_file::fail_type(const std::string & key, const char * expected) const {
    const int64_t id = gguf_find_key(ctx_, key.c_str());
    std::string found = gguf_type_name(gguf_get_kv_type(ctx_, id));
    if (gguf_get_kv_type(ctx_, id) == GGUF_TYPE_ARRAY) {
        found += " of " + std::string(gguf_type_name(gguf_get_arr_type(ctx_, id)));
    }
    throw gguf_error(where() + "key '" + key + "' has type " + found + ", expected " + expected);
}

namespace {

bool is_integer(gguf_type t) {
    switch (t) {
        case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16:
        case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64:
            return true;
        default:
            return false;
    }
}

// Reads element i of an integer value or array as int64 (uint64 values above INT64_MAX saturate,
// which every range check downstream rejects).
int64_t integer_at(const void * data, gguf_type t, size_t i) {
    switch (t) {
        case GGUF_TYPE_UINT8: return static_cast<const uint8_t *>(data)[i];
        case GGUF_TYPE_INT8: return static_cast<const int8_t *>(data)[i];
        case GGUF_TYPE_UINT16: return static_cast<const uint16_t *>(data)[i];
        case GGUF_TYPE_INT16: return static_cast<const int16_t *>(data)[i];
        case GGUF_TYPE_UINT32: return static_cast<const uint32_t *>(data)[i];
        case GGUF_TYPE_INT32: return static_cast<const int32_t *>(data)[i];
        case GGUF_TYPE_UINT64: {
            const uint64_t v = static_cast<const uint64_t *>(data)[i];
            return v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                       ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(v);
        }
        case GGUF_TYPE_INT64: return static_cast<const int64_t *>(data)[i];
        default: return 0;
    }
}

}  // namespace

std::string gguf_file::get_string(const std::string & key) const {
    const int64_t id = key_id(key);
    if (gguf_get_kv_type(ctx_, id) != GGUF_TYPE_STRING) {
        fail_type(key, "string");
    }
    return gguf_get_val_str(ctx_, id);
}

uint32_t gguf_file::get_u32(const std::string & key) const {
    const int64_t id = key_id(key);
    const gguf_type t = gguf_get_kv_type(ctx_, id);
    if (!is_integer(t)) {
        fail_type(key, "an unsigned integer");
    }
    const int64_t v = integer_at(gguf_get_val_data(ctx_, id), t, 0);
    if (v < 0 || v > static_cast<int64_t>(std::numeric_limits<uint32_t>::max())) {
        throw gguf_error(where() + "key '" + key + "' = " + std::to_string(v) +
                         " is out of range, expected a value in [0, 4294967295]");
    }
    return static_cast<uint32_t>(v);
}

float gguf_file::get_f32(const std::string & key) const {
    const int64_t id = key_id(key);
    const gguf_type t = gguf_get_kv_type(ctx_, id);
    if (t == GGUF_TYPE_FLOAT32) {
        return gguf_get_val_f32(ctx_, id);
    }
    if (t == GGUF_TYPE_FLOAT64) {
        return static_cast<float>(gguf_get_val_f64(ctx_, id));
    }
    fail_type(key, "float32");
}

bool gguf_file::get_bool(const std::string & key) const {
    const int64_t id = key_id(key);
    if (gguf_get_kv_type(ctx_, id) != GGUF_TYPE_BOOL) {
        fail_type(key, "bool");
    }
    return gguf_get_val_bool(ctx_, id);
}

size_t gguf_file::get_array_size(const std::string & key) const {
    const int64_t id = key_id(key);
    if (gguf_get_kv_type(ctx_, id) != GGUF_TYPE_ARRAY) {
        fail_type(key, "an array");
    }
    return gguf_get_arr_n(ctx_, id);
}

std::vector<int64_t> gguf_file::get_int_array(const std::string & key) const {
    const int64_t id = key_id(key);
    if (gguf_get_kv_type(ctx_, id) != GGUF_TYPE_ARRAY || !is_integer(gguf_get_arr_type(ctx_, id))) {
        fail_type(key, "an array of integers");
    }
    const gguf_type t = gguf_get_arr_type(ctx_, id);
    const size_t n = gguf_get_arr_n(ctx_, id);
    const void * data = gguf_get_arr_data(ctx_, id);
    std::vector<int64_t> out(n);
    for (size_t i = 0; i < n; ++i) {
        out[i] = integer_at(data, t, i);
    }
    return out;
}

std::vector<bool> gguf_file::get_bool_array(const std::string & key) const {
    const int64_t id = key_id(key);
    if (gguf_get_kv_type(ctx_, id) != GGUF_TYPE_ARRAY || gguf_get_arr_type(ctx_, id) != GGUF_TYPE_BOOL) {
        fail_type(key, "an array of bool");
    }
    const size_t n = gguf_get_arr_n(ctx_, id);
    const auto * data = static_cast<const int8_t *>(gguf_get_arr_data(ctx_, id));
    std::vector<bool> out(n);
    for (size_t i = 0; i < n; ++i) {
        out[i] = data[i] != 0;
    }
    return out;
}

std::optional<uint32_t> gguf_file::find_u32(const std::string & key) const {
    if (!has_key(key)) {
        return std::nullopt;
    }
    return get_u32(key);
}

std::optional<float> gguf_file::find_f32(const std::string & key) const {
    if (!has_key(key)) {
        return std::nullopt;
    }
    return get_f32(key);
}

std::optional<std::string> gguf_file::find_string(const std::string & key) const {
    if (!has_key(key)) {
        return std::nullopt;
    }
    return get_string(key);
}

const gguf_tensor_entry * gguf_file::find_tensor(const std::string & name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace lucebox
