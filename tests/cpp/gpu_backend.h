// For C++ tests that compare a GPU kernel with the CPU op: the first GPU backend of this build and
// machine, or null (with a note on stdout that `test` checks nothing) where there is none.
#pragma once

#include <cstdio>

#include "ggml-backend.h"

namespace lucebox_test {

inline ggml_backend_t first_gpu_backend(const char * test) {
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(d) == GGML_BACKEND_DEVICE_TYPE_GPU) {
            return ggml_backend_dev_init(d, nullptr);
        }
    }
    std::printf("  (no GPU device in this build/machine: %s checks nothing)\n", test);
    return nullptr;
}

}  // namespace lucebox_test
