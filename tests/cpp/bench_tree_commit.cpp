// The cost of one tree commit on the CPU backend for a model's state shapes: the per-commit copy
// graph (built, allocated by a scheduler and computed every commit: what the engine did before the
// reused graph) against the reused graph (the moves uploaded, then computed). One thread, so the
// thread CPU time is the commit's whole cost and stays meaningful on a loaded machine; the minimum
// over the repetitions of each path shape. Not a test (not registered with CTest).
// Usage: bench_tree_commit <target.gguf> [kv type, default f16] [repetitions, default 200]
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "lucebox/model_files.h"
#include "models/qwen35_model.h"
#include "lucebox/memory_plan.h"

using namespace lucebox;

namespace {

double now(clockid_t clock) {
    timespec ts{};
    clock_gettime(clock, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;  // ms
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s <target.gguf> [kv type] [repetitions]\n", argv[0]);
        return 2;
    }
    const qwen35_hparams hp = open_target(argv[1]).hparams;
    const ggml_type kv = parse_kv_type(argc > 2 ? argv[2] : "f16");
    const int reps = argc > 3 ? std::stoi(argv[3]) : 200;
    const uint32_t kv_size = 1024, ring = 512, n_ckpt = 23;  // ctx 1024, budget 22
    std::vector<int32_t> capture;
    for (uint32_t i = 1; i <= 5; ++i) capture.push_back(int32_t(i * hp.n_layer / 5));
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, 1);
    ggml_backend_buffer_type_t buft = ggml_backend_get_default_buffer_type(cpu);
    const qwen35_state st = qwen35_state::allocate(hp, kv_size, kv, kv, capture, ring, n_ckpt, buft,
                                                   ggml_backend_get_device(cpu));
    ggml_backend_sched_t sched = ggml_backend_sched_new(&cpu, nullptr, 1, 16384, false, true);
    std::vector<uint8_t> meta(ggml_tensor_overhead() * 16384 + ggml_graph_overhead_custom(16384, false));

    ggml_init_params ip{meta.size(), meta.data(), true};
    std::vector<uint8_t> reused_meta(meta.size());
    ggml_init_params rp{reused_meta.size(), reused_meta.data(), true};
    ggml_context * reused_ctx = ggml_init(rp);
    const qwen35_tree_commit g = build_qwen35_tree_commit_graph(reused_ctx, hp, st);
    if (g.gf == nullptr) {
        std::fprintf(stderr, "KV rows of this type are not whole words: only the copy graph applies\n");
        return 1;
    }
    ggml_gallocr_t galloc = ggml_gallocr_new(buft);
    ggml_gallocr_alloc_graph(galloc, g.gf);

    const std::vector<std::vector<int32_t>> paths{{0}, {0, 1}, {0, 1, 2}, {0, 2, 9}, {0, 1, 4, 11, 17}, {0, 3, 8, 12, 15, 19, 22}};
    std::printf("%s, %u layers (%u DeltaNet), KV %s, %u checkpoint slots; ms per commit (min over %d):\n",
                argv[1], hp.n_layer, hp.n_recurrent_layers(), ggml_type_name(kv), n_ckpt, reps);
    std::printf("  path                     copy graph: nodes  cpu ms  wall ms | reused graph: nodes  cpu ms  wall ms\n");
    for (const auto & path : paths) {
        double copy_cpu = 1e9, copy_wall = 1e9, reused_cpu = 1e9, reused_wall = 1e9;
        int copy_nodes = 0;
        for (int r = 0; r < reps; ++r) {
            const uint32_t n_past = 100 + uint32_t(r % 200);
            double c0 = now(CLOCK_THREAD_CPUTIME_ID), w0 = now(CLOCK_MONOTONIC);
            ggml_context * ctx = ggml_init(ip);
            ggml_cgraph * gf = build_qwen35_tree_commit_copy_graph(ctx, hp, st, n_ckpt, n_past, path);
            copy_nodes = ggml_graph_n_nodes(gf);
            ggml_backend_sched_reset(sched);
            ggml_backend_sched_alloc_graph(sched, gf);
            ggml_backend_sched_graph_compute(sched, gf);
            ggml_free(ctx);
            copy_cpu = std::min(copy_cpu, now(CLOCK_THREAD_CPUTIME_ID) - c0);
            copy_wall = std::min(copy_wall, now(CLOCK_MONOTONIC) - w0);

            c0 = now(CLOCK_THREAD_CPUTIME_ID), w0 = now(CLOCK_MONOTONIC);
            const std::vector<int32_t> moves = qwen35_tree_commit_moves(g, hp, st, n_ckpt, n_past, path);
            ggml_backend_tensor_set(g.moves, moves.data(), 0, moves.size() * sizeof(int32_t));
            ggml_backend_graph_compute(cpu, g.gf);
            reused_cpu = std::min(reused_cpu, now(CLOCK_THREAD_CPUTIME_ID) - c0);
            reused_wall = std::min(reused_wall, now(CLOCK_MONOTONIC) - w0);
        }
        std::string p;
        for (int32_t n : path) p += std::to_string(n) + " ";
        std::printf("  %-24s %18d  %6.3f  %7.3f | %19d  %6.3f  %7.3f\n", p.c_str(), copy_nodes, copy_cpu, copy_wall,
                    ggml_graph_n_nodes(g.gf), reused_cpu, reused_wall);
    }
    ggml_gallocr_free(galloc);
    ggml_free(reused_ctx);
    ggml_backend_sched_free(sched);
    ggml_backend_free(cpu);
    return 0;
}
