// What lucebox's fused GGML_OP_CUSTOM ops (delta_net_step.h) share: their own
// parameters stored after ggml's header in a node's op_params, and which CPU function a node runs
// (that function's address tells the ops apart in a graph). Plain C++.
#pragma once

#include <cstddef>

#include "ggml.h"

namespace lucebox::kernels::custom_op {

// Copies n bytes of an op's parameters into / out of node t's op_params, after ggml's header
// (throws where they do not fit).
void write_params(ggml_tensor * t, const void * params, size_t n);
void read_params(const ggml_tensor * t, void * params, size_t n);

// The CPU function of a GGML_OP_CUSTOM node; null for any other node.
ggml_custom_op_t function_of(const ggml_tensor * node);

}  // namespace lucebox::kernels::custom_op
