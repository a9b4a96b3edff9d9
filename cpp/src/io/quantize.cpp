#include "lucebox/quantize.h"

#include <algorithm>
#include <thread>

#include "lucebox/errors.h"

namespace lucebox {

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
    if (n_rows <= 0 || n_per_row <= 0) {
        throw config_error("quantize: empty input");
    }
    if (n_per_row % ggml_blck_size(type) != 0) {
        throw config_error("quantize: row length " + std::to_string(n_per_row) + " is not a multiple of the " +
                           ggml_type_name(type) + " block size " + std::to_string(ggml_blck_size(type)));
    }
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

}  // namespace lucebox
