#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cuda_kernels.h"
#include "delta_net_step.h"
#include "range_mask.h"
#include "lucebox/system.h"
#include "weight_tiles.h"
#include "module.h"

namespace py = pybind11;

namespace lucebox::bindings {

void register_system(py::module_ & m) {
    m.def("build_info", [] {
        const build_info b = get_build_info();
        py::dict d;
        d["version"] = b.version;
        d["ggml_pin"] = b.ggml_pin;
        d["backends"] = b.backends;
        d["cuda_architectures"] = b.cuda_architectures;
        return d;
    }, "Version, pinned ggml, compiled backends and CUDA architectures of this build.");

    m.def("set_own_cuda_kernels", &kernels::set_cuda_kernels_enabled, py::arg("enabled"),
          "Whether lucebox's own CUDA kernels take the products they support (default True) or ggml's "
          "run everything; for A/B benchmarks. Set it before creating an Engine (ggml replays CUDA graphs "
          "it captured earlier). No effect in a build without CUDA.");

    m.def("set_bf16_gemm_min_cols", &kernels::set_bf16_gemm_min_cols, py::arg("n"),
          "Quantized products of at least n activation columns (prefill micro-batches) run as BF16 cuBLAS "
          "GEMMs on dequantized weights instead of ggml's MMQ (row-tiled weights: lucebox's kernel, which "
          "keeps those of up to 8 columns); 0: never. The defaults are set when the first "
          "CUDA device is used; for the threshold sweep (bench/probes/prefill_gemm_sweep.py). A step graph "
          "ggml captured earlier keeps the choice it was captured with. No effect without CUDA.");

    m.def("set_fattn_fixed_split", &kernels::set_fattn_fixed_split, py::arg("rows") = kernels::k_fattn_fixed_rows,
          py::arg("piece_keys") = kernels::k_fattn_piece_keys, py::arg("tile_cols") = kernels::k_fattn_tile_cols,
          py::arg("long_keys") = kernels::k_fattn_long_keys, py::arg("long_tile_cols") = kernels::k_fattn_long_tile_cols,
          py::arg("long_piece_keys") = kernels::k_fattn_long_piece_keys,
          "Flash attention of at most `rows` query rows (by default a decode step and every verify) runs ggml's "
          "tensor-core kernel with one query tile of `tile_cols` columns and its keys cut at fixed rows, "
          "`piece_keys` a CTA (ggml patch 0008), so that a decode step and a verify of the same token give the "
          "same bits; rows 0: ggml's choice by the row count. Key views of at least `long_keys` rows (0: none) "
          "take `long_tile_cols` columns and pieces of `long_piece_keys` instead; the engines pad those views "
          "to 1024 rows and keep a decode step and a verify of one token on the same side of that length (on "
          "every backend; the split itself is CUDA's). Set it before creating an Engine; for A/B benchmarks. "
          "rows in 0..1023, piece_keys a divisor of 256, long_piece_keys a divisor of 1024, long_keys >= 0, "
          "tile_cols and long_tile_cols 8, 16, 32 or 64 (ValueError otherwise).");

    m.def("set_weight_tiles", &kernels::set_weight_tiles_enabled, py::arg("enabled"),
          "Whether Q8_0 / Q4_K / Q5_K / Q6_K product weights load row-tiled on a CUDA device (default True; the layout "
          "lucebox's few-column kernel reads fastest, cpp/kernels/weight_tiles.h). Takes effect at the next "
          "load; for A/B tests of the layout. No effect without CUDA.");
    m.def("tiled_weights", [] { return kernels::tiles::count(); },
          "How many row-tiled weight ranges (matrices or stacks) are loaded now.");
    m.def("delta_net_step_runs", [] { return kernels::delta_net_step_runs() + kernels::delta_net::cpu_runs(); },
          "How many fused DeltaNet step ops (cpp/kernels/delta_net_step.h) have run, on the CPU or on lucebox's "
          "CUDA kernels (a captured CUDA graph counts once).");
    m.def("range_mask_runs", [] { return kernels::range_mask_runs() + kernels::range_mask::cpu_runs(); },
          "How many attention masks were built in a graph from their rows' key ranges (cpp/kernels/range_mask.h), "
          "on the CPU or on lucebox's CUDA kernel (a captured CUDA graph counts once), not written on the host.");
    m.def("set_range_masks", &kernels::range_mask::set_enabled, py::arg("enabled"),
          "Whether graphs built from now on build the target's (chain and tree) and the draft's attention masks "
          "from each row's key range (default True) or take host-written masks (the A/B of the masks' cost).");
    m.def("tiles_declined", &kernels::tiles_declined,
          "Fused products of row-tiled weights that lucebox's kernel left to ggml to split (expected 0).");

    m.def("devices", [] {
        py::list out;
        for (const device_info & dev : list_devices()) {
            py::dict d;
            d["name"] = dev.name;
            d["description"] = dev.description;
            d["type"] = dev.type;
            d["memory_total"] = dev.memory_total;
            d["memory_free"] = dev.memory_free;
            out.append(d);
        }
        return out;
    }, "Devices visible to the compiled backends.");
}

}  // namespace lucebox::bindings
