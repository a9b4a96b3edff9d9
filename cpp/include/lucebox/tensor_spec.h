// What a model architecture expects of a GGUF file's tensors, and the check of a file against it.
// The same spec lists drive loading (C++) and the synthetic-model writer (Python), so the layout of
// each architecture is written down once, in its model file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ggml.h"

namespace lucebox {

class gguf_file;

enum class tensor_role {
    embedding,  // token embedding table {n_embd, n_vocab}: any supported weight type
    matrix,     // projection weight {in, out}: any supported weight type
    norm,       // 1-D norm gain: F32
    vector,     // 1-D per-head parameter (ssm_a, dt bias): F32
    conv,       // depthwise conv kernel {d_conv, channels}: F32
};

const char * role_name(tensor_role role);

struct tensor_spec {
    std::string name;
    std::vector<int64_t> ne;  // ggml order, trailing 1s omitted
    tensor_role role;
    bool required = true;
};

// Weight types a file may hold for matrices and embeddings: f32, f16, bf16 and every quantized type
// ggml stores weights in (not q8_K). Whether a device multiplies it: check_weights_runnable.
bool is_supported_weight_type(ggml_type type);
// Whether `type` is acceptable for a tensor of `role`.
bool type_allowed_for(tensor_role role, ggml_type type);

// Checks that every required spec is present, and every present spec has the expected shape and
// an allowed type. Throws gguf_error naming the tensor, the expectation and what was found.
void check_tensors(const gguf_file & file, const std::vector<tensor_spec> & specs);

std::string shape_string(const std::vector<int64_t> & ne);

// Names of the specs to load from `file`: every required one and each optional one present.
std::vector<std::string> tensors_to_load(const gguf_file & file, const std::vector<tensor_spec> & specs);

}  // namespace lucebox
