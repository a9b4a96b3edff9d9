// ggml quantization through lucebox::quantize_rows: sizes, round-trip error, bad inputs.
#include <cmath>
#include <random>
#include <vector>

#include "check.h"
#include "ggml.h"
#include "lucebox/errors.h"
#include "lucebox/quantize.h"

using namespace lucebox;

TEST_CASE(round_trip_error_is_small) {
    const int64_t rows = 16, cols = 512;
    std::vector<float> x(rows * cols);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (float & v : x) v = nd(rng);
    const struct { const char * name; double max_rel_rmse; } cases[] = {
        {"q8_0", 0.01}, {"q6_K", 0.03}, {"q5_K", 0.06}, {"q4_K", 0.12}, {"q4_0", 0.15},
    };
    for (const auto & c : cases) {
        const ggml_type t = parse_ggml_type(c.name);
        const std::vector<uint8_t> q = quantize_rows(x.data(), rows, cols, t, 3);
        CHECK(q.size() == ggml_row_size(t, cols) * rows);
        std::vector<float> y(rows * cols);
        ggml_get_type_traits(t)->to_float(q.data(), y.data(), rows * cols);
        double se = 0, ss = 0;
        for (size_t i = 0; i < x.size(); ++i) {
            se += (x[i] - y[i]) * (x[i] - y[i]);
            ss += x[i] * x[i];
        }
        const double rel = std::sqrt(se / ss);
        if (!(rel < c.max_rel_rmse)) {
            std::fprintf(stderr, "  %s relative rmse %.4f >= %.4f\n", c.name, rel, c.max_rel_rmse);
        }
        CHECK(rel < c.max_rel_rmse);
    }
}

TEST_CASE(rejects_bad_input) {
    std::vector<float> x(100, 1.0f);
    CHECK_THROWS(quantize_rows(x.data(), 1, 100, GGML_TYPE_Q4_K, 1), config_error, "not a multiple");
    CHECK_THROWS(parse_ggml_type("q9_9"), config_error, "unknown ggml type 'q9_9'");
    CHECK_THROWS(quantize_rows(x.data(), 0, 100, GGML_TYPE_F16, 1), config_error, "empty input");
}

TEST_MAIN()
