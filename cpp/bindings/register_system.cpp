#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cuda_kernels.h"
#include "lucebox/system.h"
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
          "GEMMs on dequantized weights instead of ggml's MMQ; 0: never. The default is set when the first "
          "CUDA device is used; for the threshold sweep (bench/probes/prefill_gemm_sweep.py). No effect "
          "without CUDA.");

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
