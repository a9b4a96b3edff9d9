// Read-only view of a GGUF file's metadata and tensor directory (ggml's gguf parser), with typed
// accessors that throw gguf_error naming the file and key instead of asserting. Tensor data is
// not read here; open() only checks that every tensor's bytes lie inside the file.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ggml.h"

struct gguf_context;

namespace lucebox {

struct gguf_tensor_entry {
    std::string name;
    ggml_type type;
    int n_dims;                    // number of meaningful dimensions in ne
    std::array<int64_t, 4> ne;     // ggml order: ne[0] is the contiguous (input) dimension
    uint64_t offset;               // absolute byte offset of the data in the file
    uint64_t nbytes;

    std::string shape_string() const;  // e.g. "[5120, 248320]"
};

class gguf_file {
  public:
    // Parses the header, metadata and tensor directory. Throws gguf_error for a missing or
    // unreadable file, a malformed or truncated header, or tensor data beyond the end of file.
    static gguf_file open(const std::string & path);

    gguf_file(gguf_file &&) noexcept;
    gguf_file & operator=(gguf_file &&) noexcept;
    ~gguf_file();

    const std::string & path() const { return path_; }
    uint64_t file_size() const { return file_size_; }
    uint64_t data_offset() const;
    gguf_context * raw() const { return ctx_; }

    // Metadata. The get_* accessors throw gguf_error if the key is missing or has another type;
    // integer accessors accept any GGUF integer type whose value fits the result.
    bool has_key(const std::string & key) const;
    std::string get_string(const std::string & key) const;
    uint32_t get_u32(const std::string & key) const;
    float get_f32(const std::string & key) const;  // accepts f32 and f64
    bool get_bool(const std::string & key) const;
    std::vector<int64_t> get_int_array(const std::string & key) const;
    std::vector<bool> get_bool_array(const std::string & key) const;
    size_t get_array_size(const std::string & key) const;  // any array type

    std::optional<uint32_t> find_u32(const std::string & key) const;
    std::optional<float> find_f32(const std::string & key) const;
    std::optional<std::string> find_string(const std::string & key) const;

    // Tensor directory.
    const std::vector<gguf_tensor_entry> & tensors() const { return tensors_; }
    const gguf_tensor_entry * find_tensor(const std::string & name) const;

    // "file 'x.gguf': " prefix for messages.
    std::string where() const;

  private:
    gguf_file() = default;
    int64_t key_id(const std::string & key) const;  // throws if missing
    [[noreturn]] void fail_type(const std::string & key, const char * expected) const;

    std::string path_;
    uint64_t file_size_ = 0;
    gguf_context * ctx_ = nullptr;
    std::vector<gguf_tensor_entry> tensors_;
    std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace lucebox
