#include "graph/inputs.h"

namespace lucebox::graph {

void place_on_device(ggml_backend_sched_t s, ggml_cgraph * gf, ggml_backend_t device) {
    if (ggml_backend_dev_type(ggml_backend_get_device(device)) == GGML_BACKEND_DEVICE_TYPE_CPU) {
        return;
    }
    const int n = ggml_graph_n_nodes(gf);
    for (int i = 0; i < n; ++i) {
        const ggml_tensor * node = ggml_graph_node(gf, i);
        for (ggml_tensor * src : node->src) {
            ggml_tensor * input = src != nullptr && src->view_src != nullptr ? src->view_src : src;  // (a view's base)
            if (input != nullptr && (input->flags & GGML_TENSOR_FLAG_INPUT) != 0 && input->buffer == nullptr) {
                ggml_backend_sched_set_tensor_backend(s, input, device);
            }
        }
    }
}

void set(ggml_backend_sched_t s, ggml_tensor * t, const void * data, size_t bytes) {
    const ggml_backend_buffer_t buf = t->view_src != nullptr ? t->view_src->buffer : t->buffer;
    if (s != nullptr && buf != nullptr && !ggml_backend_buffer_is_host(buf)) {
        if (ggml_backend_t b = ggml_backend_sched_get_tensor_backend(s, t)) {
            ggml_backend_tensor_set_async(b, t, data, 0, bytes);
            return;
        }
    }
    ggml_backend_tensor_set(t, data, 0, bytes);
}

}  // namespace lucebox::graph
