// snapshot_data: the tensor bytes of a session snapshot, in host memory (pinned or plain) or in a
// device's memory. The snapshot is a list of regions of given byte sizes (the engine decides what
// they hold: see snapshot_layout in engine.cpp); here each non-empty region is a 1-D GGML_TYPE_I8
// tensor over its bytes in a backend buffer, so ggml's own copies (tensor_get/set and their async
// forms, tensor_copy) move it to and from the session state wherever either side lives.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "lucebox/engine.h"

namespace lucebox {

class snapshot_data {
  public:
    // Allocates the regions back to back (at the buffer type's alignment) in as few buffers of `buft`
    // as its maximum buffer size allows (one, on CPU and CUDA). Throws out_of_memory_error naming the
    // bytes needed, the memory asked for and the device's free memory when an allocation fails.
    snapshot_data(const std::vector<uint64_t> & sizes, ggml_backend_buffer_type_t buft, snapshot_location where);
    ~snapshot_data();
    snapshot_data(const snapshot_data &) = delete;
    snapshot_data & operator=(const snapshot_data &) = delete;

    snapshot_location location() const { return location_; }
    ggml_backend_buffer_type_t buffer_type() const { return buft_; }
    bool is_host() const { return host_; }  // region(i)->data is a CPU pointer (plain or pinned memory)
    size_t n_regions() const { return sizes_.size(); }
    const std::vector<uint64_t> & sizes() const { return sizes_; }
    uint64_t total() const { return total_; }
    ggml_tensor * region(size_t i) const { return regions_[i]; }  // I8 [sizes()[i]]; null when empty

  private:
    // Allocates the buffers (groups: first region and bytes of each) and places region i at offset[i]
    // of its group's buffer.
    void place(const std::vector<std::pair<size_t, uint64_t>> & groups, const std::vector<uint64_t> & offset);
    void release();
    snapshot_location location_;
    ggml_backend_buffer_type_t buft_;
    bool host_ = true;
    std::vector<uint64_t> sizes_;
    uint64_t total_ = 0;
    ggml_context * ctx_ = nullptr;
    std::vector<ggml_backend_buffer_t> buffers_;
    std::vector<ggml_tensor *> regions_;
};

// The buffer type snapshot data at `where` uses for an engine on `dev` (see snapshot_location):
// device -> the device's buffer type; host -> the device's pinned host type, else plain CPU memory.
ggml_backend_buffer_type_t snapshot_buffer_type(ggml_backend_dev_t dev, snapshot_location where);

// A copy of `src` on (`buft`, `where`), by synchronous ggml copies (host<->device, device<->device).
std::shared_ptr<const snapshot_data> copy_snapshot_data(const snapshot_data & src, ggml_backend_buffer_type_t buft,
                                                        snapshot_location where);

// session_snapshot::load into (`buft`, `where`).
session_snapshot load_snapshot_file(const std::string & path, ggml_backend_buffer_type_t buft,
                                    snapshot_location where);

}  // namespace lucebox
