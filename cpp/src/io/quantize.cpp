#include "lucebox/quantize.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "lucebox/errors.h"

namespace lucebox {

namespace {

void check_rows(const char * what, int64_t n_rows, int64_t n_per_row, ggml_type type) {
    if (n_rows <= 0 || n_per_row <= 0) {
        throw config_error(std::string(what) + ": empty input");
    }
    if (n_per_row % ggml_blck_size(type) != 0) {
        throw config_error(std::string(what) + ": row length " + std::to_string(n_per_row) + " is not a multiple of the " +
                           ggml_type_name(type) + " block size " + std::to_string(ggml_blck_size(type)));
    }
}

}  // namespace

ggml_type parse_ggml_type(const std::string & name) {
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const auto type = static_cast<ggml_type>(t);
        const char * tn = ggml_type_name(type);
        if (tn == nullptr || ggml_type_size(type) == 0) {
            continue;
        }
        std::string a = tn, b = name;
        std::transform(a.begin(), a.end(), a.begin(), ::tolower);
        std::transform(b.begin(), b.end(), b.begin(), ::tolower);
        if (a == b) {
            return type;
        }
    }
    throw config_error("unknown ggml type '" + name + "'");
}

std::vector<uint8_t> quantize_rows(const float * data, int64_t n_rows, int64_t n_per_row, ggml_type type,
                                   int n_threads, const float * importance) {
    check_rows("quantize", n_rows, n_per_row, type);
    if (importance == nullptr && ggml_quantize_requires_imatrix(type)) {
        throw config_error(std::string("quantize: type ") + ggml_type_name(type) + " needs an importance matrix");
    }
    const size_t row_size = ggml_row_size(type, n_per_row);
    std::vector<uint8_t> out(row_size * n_rows);
    ggml_quantize_init(type);
    if (n_threads <= 0) {
        n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    }
    const int64_t per = std::max<int64_t>(1, (n_rows + n_threads - 1) / n_threads);
    std::vector<std::thread> workers;
    for (int64_t r0 = 0; r0 < n_rows; r0 += per) {
        const int64_t nr = std::min(per, n_rows - r0);
        workers.emplace_back([=, &out] {
            ggml_quantize_chunk(type, data, out.data(), r0 * n_per_row, nr, n_per_row, importance);  // start is an element index
        });
    }
    for (auto & w : workers) {
        w.join();
    }
    return out;
}

std::vector<float> dequantize_rows(const uint8_t * data, size_t n_bytes, int64_t n_per_row, ggml_type type) {
    check_rows("dequantize", 1, n_per_row, type);
    const size_t row_size = ggml_row_size(type, n_per_row);
    if (n_bytes == 0 || n_bytes % row_size != 0) {
        throw config_error("dequantize: " + std::to_string(n_bytes) + " bytes are not whole rows of " +
                           std::to_string(n_per_row) + " " + ggml_type_name(type) + " values (" +
                           std::to_string(row_size) + " bytes each)");
    }
    const int64_t n_rows = int64_t(n_bytes / row_size);
    std::vector<float> out(size_t(n_rows) * size_t(n_per_row));
    if (type == GGML_TYPE_F32) {  // (ggml has no conversion for what is already floats)
        std::memcpy(out.data(), data, n_bytes);
        return out;
    }
    const ggml_to_float_t to_float = ggml_get_type_traits(type)->to_float;
    if (to_float == nullptr) {
        throw config_error(std::string("dequantize: ggml cannot convert ") + ggml_type_name(type) + " to floats");
    }
    for (int64_t r = 0; r < n_rows; ++r) {
        to_float(data + size_t(r) * row_size, out.data() + size_t(r) * size_t(n_per_row), n_per_row);
    }
    return out;
}

}  // namespace lucebox
