// Tensors that live in one backend buffer: model weights loaded from a GGUF file, or engine
// state (KV cache, recurrent state, feature ring). Owns the ggml context holding the tensor
// metadata and the backend buffer holding the data.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"

namespace lucebox {

class gguf_file;

// Called with (bytes done, bytes total) while loading.
using progress_callback = std::function<void(uint64_t, uint64_t)>;

// Throws unsupported_error, naming the tensor, its type and the device, if `dev`'s ggml backend
// cannot run what the engine does with one of the named tensors of `file`: a product (MUL_MAT with
// F32 activations) for every weight of two or more dimensions, and a row lookup (GET_ROWS) for
// token_embd.weight too, and a DeltaNet conv of the width of each *.ssm_conv1d.weight (ggml's CUDA
// backend has kernels for a few widths; on one device lucebox pads the others up to 15 with zero taps,
// graph::ssm_conv, while a tensor split, `split` here, runs the conv as it is). A file may hold any
// weight type (tensor_spec.h) while a device has kernels for fewer (ggml's CUDA backend multiplies no
// TQ1_0 / TQ2_0, for example); without the check such a model would load and then abort inside its
// first graph. tensor_store::load runs it for plain devices; a tensor split runs it for each device it
// splits over.
void check_weights_runnable(const gguf_file & file, const std::vector<std::string> & names, ggml_backend_dev_t dev,
                            bool split = false);

// Whether `buft` is a tensor split's (ggml's meta backend): its tensors are dealt in slices to devices.
bool is_meta(ggml_backend_buffer_type_t buft);

class tensor_store {
  public:
    tensor_store() = default;
    tensor_store(const tensor_store &) = delete;
    tensor_store & operator=(const tensor_store &) = delete;
    tensor_store(tensor_store && o) noexcept;
    tensor_store & operator=(tensor_store && o) noexcept;
    ~tensor_store();

    // Creates tensors through `define(ctx)` (which calls ggml_new_tensor on ctx), then allocates one
    // buffer for all of them on `buft`. Throws out_of_memory_error naming `what`, the size needed
    // and the device's free memory if the allocation fails.
    static tensor_store allocate(ggml_backend_buffer_type_t buft, ggml_backend_dev_t dev, size_t max_tensors,
                                 const std::function<void(ggml_context *)> & define, const std::string & what);

    // Loads the named tensors of `file` (shapes and types as in the file) onto `buft`.
    //
    // stacks: groups of names (each group's members among `names`, in the order given) to store
    // row after row in one tensor [ne0, sum of ne1], so that one product with the stack computes
    // them all; each member is then a view of the stack (view_src = the stack, at its row offset).
    // A group stacks each run of at least two consecutive members that are 2-D matrices of one type
    // and one row length (a member of another type ends a run and may start the next: a Q6_K
    // attn_qkv before three Q4_K matrices leaves those three one stack); the rest load on their own,
    // as does everything on a meta (tensor parallel) buffer type. Values are the file's bytes either
    // way, except that on a CUDA device (kernels::tile_weights_in) Q8_0, Q4_K and Q5_K matrices of whole
    // 256-value chunks (Q6_K ones of whole 16-row tiles), token_embd.weight
    // aside (ggml_get_rows reads it), load row-tiled (cpp/kernels/weight_tiles.h; a stack only when
    // its members' row counts, the last one's aside, are multiples of 16) and are registered as such
    // until the store is released; only lucebox's kernels read them.
    static tensor_store load(const gguf_file & file, const std::vector<std::string> & names,
                             ggml_backend_buffer_type_t buft, ggml_backend_dev_t dev, const progress_callback & progress,
                             const std::vector<std::vector<std::string>> & stacks = {});

    ggml_tensor * get(const std::string & name) const;   // throws if absent
    ggml_tensor * find(const std::string & name) const;  // null if absent
    size_t size_bytes() const { return buffer_ ? ggml_backend_buffer_get_size(buffer_) : 0; }
    void clear();  // zero the whole buffer

  private:
    void release();
    ggml_context * ctx_ = nullptr;
    ggml_backend_buffer_t buffer_ = nullptr;
    std::unordered_map<std::string, ggml_tensor *> by_name_;
    bool tiled_ = false;  // registered row-tiled ranges in buffer_ (released with it)
};

}  // namespace lucebox
