// custom_op.h: ggml's internal header of a custom node's op_params, in one place.
#include "custom_op.h"

#include <cstring>

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"  // ggml's internal header's static helpers
#endif
#include "ggml-impl.h"  // ggml_custom_op_params: the header of a custom node's op_params
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#include "lucebox/errors.h"

namespace lucebox::kernels::custom_op {
namespace {

constexpr size_t PARAMS_AT = sizeof(ggml_custom_op_params);

void check_fits(size_t n) {
    if (PARAMS_AT + n > GGML_MAX_OP_PARAMS) throw error("internal: a custom op's parameters do not fit op_params");
}

}  // namespace

void write_params(ggml_tensor * t, const void * params, size_t n) {
    check_fits(n);
    std::memcpy(reinterpret_cast<char *>(t->op_params) + PARAMS_AT, params, n);
}

void read_params(const ggml_tensor * t, void * params, size_t n) {
    check_fits(n);
    std::memcpy(params, reinterpret_cast<const char *>(t->op_params) + PARAMS_AT, n);
}

ggml_custom_op_t function_of(const ggml_tensor * node) {
    if (node == nullptr || node->op != GGML_OP_CUSTOM) return nullptr;
    ggml_custom_op_params cp;
    std::memcpy(&cp, node->op_params, sizeof cp);
    return cp.fun;
}

}  // namespace lucebox::kernels::custom_op
