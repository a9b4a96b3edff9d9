// Host cost of a step's attention mask (set_qwen35_inputs, cpp/src/models/qwen35.cpp): [n_kv, 16] F16
// rows, 0 up to the row's position and -inf after, written either into a fresh vector filled with -inf
// first (before the thirtieth session) or into a staging vector kept from step to step in one pass (now).
// The fresh vector's pages are mapped anew each step. Host only, no ggml; the upload is not included.
//     g++ -O2 -std=c++17 -o /tmp/mask_staging bench/probes/mask_staging.cpp && /tmp/mask_staging
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

constexpr uint16_t ZERO = 0x0000, HIDDEN = 0xFC00;  // F16 0 and -inf
constexpr uint32_t T = 16;
constexpr int REPS = 200;
volatile uint16_t g_sink;  // keeps each mask alive to the end of its step

double seconds_per_step(uint32_t n_kv, bool reuse) {
    const uint32_t n_past = n_kv - 256;
    std::vector<uint16_t> staging;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < REPS; ++r) {
        if (reuse) {
            staging.resize(size_t(n_kv) * T);
            for (uint32_t i = 0; i < T; ++i) {
                uint16_t * row = staging.data() + size_t(i) * n_kv;
                std::fill_n(row, n_past + i + 1, ZERO);
                std::fill(row + n_past + i + 1, row + n_kv, HIDDEN);
            }
            g_sink = staging[size_t(r) % staging.size()];
        } else {
            std::vector<uint16_t> mask(size_t(n_kv) * T, HIDDEN);
            for (uint32_t i = 0; i < T; ++i) std::fill_n(mask.data() + size_t(i) * n_kv, n_past + i + 1, ZERO);
            g_sink = mask[size_t(r) % mask.size()];
        }
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / REPS;
}

}  // namespace

int main() {
    for (uint32_t n_kv : {4096u, 32768u, 131072u}) {
        std::printf("n_kv %6u, %u rows: fresh vector, two passes %7.1f us; kept staging, one pass %7.1f us\n", n_kv, T,
                    1e6 * seconds_per_step(n_kv, false), 1e6 * seconds_per_step(n_kv, true));
    }
}
