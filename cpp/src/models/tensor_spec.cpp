#include "lucebox/tensor_spec.h"

#include <sstream>

#include "lucebox/errors.h"
#include "lucebox/gguf_file.h"

namespace lucebox {

const char * role_name(tensor_role role) {
    switch (role) {
        case tensor_role::embedding: return "embedding";
        case tensor_role::matrix: return "matrix";
        case tensor_role::norm: return "norm";
        case tensor_role::vector: return "vector";
        case tensor_role::conv: return "conv";
    }
    return "?";
}

bool is_supported_weight_type(ggml_type type) {
    if (type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16) {
        return true;
    }
    // Every quantized type ggml can turn back into floats, except Q8_K: it is the activations'
    // partner of the K-quants in ggml's CPU dot products, with no dot product of its own. Removed
    // types (Q4_2, ...) have no size. Whether the device can multiply it is checked at load
    // (check_weights_runnable).
    const ggml_type_traits * tr = type < GGML_TYPE_COUNT ? ggml_get_type_traits(type) : nullptr;
    return tr != nullptr && ggml_is_quantized(type) && tr->type_size > 0 && tr->to_float != nullptr &&
           type != GGML_TYPE_Q8_K;
}

bool type_allowed_for(tensor_role role, ggml_type type) {
    switch (role) {
        case tensor_role::embedding:
        case tensor_role::matrix:
            return is_supported_weight_type(type);
        case tensor_role::norm:
        case tensor_role::vector:
        case tensor_role::conv:
            return type == GGML_TYPE_F32;
    }
    return false;
}

std::string shape_string(const std::vector<int64_t> & ne) {
    std::ostringstream os;
    os << '[';
    for (size_t i = 0; i < ne.size(); ++i) {
        os << (i ? ", " : "") << ne[i];
    }
    os << ']';
    return os.str();
}

void check_tensors(const gguf_file & file, const std::vector<tensor_spec> & specs) {
    for (const tensor_spec & spec : specs) {
        const gguf_tensor_entry * t = file.find_tensor(spec.name);
        if (t == nullptr) {
            if (spec.required) {
                throw gguf_error(file.where() + "missing tensor '" + spec.name + "' (expected shape " +
                                 shape_string(spec.ne) + ")");
            }
            continue;
        }
        bool shape_ok = true;
        for (int d = 0; d < 4; ++d) {
            const int64_t want = d < static_cast<int>(spec.ne.size()) ? spec.ne[d] : 1;
            shape_ok = shape_ok && t->ne[d] == want;
        }
        if (!shape_ok) {
            throw gguf_error(file.where() + "tensor '" + spec.name + "' has shape " + t->shape_string() +
                             ", expected " + shape_string(spec.ne));
        }
        if (!type_allowed_for(spec.role, t->type)) {
            const bool vec = spec.role == tensor_role::norm || spec.role == tensor_role::vector ||
                             spec.role == tensor_role::conv;
            throw gguf_error(file.where() + "tensor '" + spec.name + "' has unsupported type " +
                             ggml_type_name(t->type) + " for a " + role_name(spec.role) + " tensor (expected " +
                             (vec ? "f32" : "f32, f16, bf16 or a quantized type that ggml stores weights in") +
                             ")");
        }
    }
}

std::vector<std::string> tensors_to_load(const gguf_file & file, const std::vector<tensor_spec> & specs) {
    std::vector<std::string> names;
    for (const tensor_spec & s : specs) {
        if (s.required || file.find_tensor(s.name) != nullptr) {
            names.push_back(s.name);
        }
    }
    return names;
}

}  // namespace lucebox
