// What this build contains and which devices it can see.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lucebox {

struct build_info {
    std::string version;        // lucebox version
    std::string ggml_pin;       // pinned upstream (package, llama.cpp commit, ggml version)
    std::vector<std::string> backends;  // compiled ggml backends, e.g. {"CPU", "CUDA"}
    std::string cuda_architectures;     // empty without CUDA
};

struct device_info {
    std::string name;          // ggml device name, e.g. "CUDA0", "CPU"
    std::string description;   // e.g. "NVIDIA H200"
    std::string type;          // "cpu", "gpu", "igpu", "accel"
    uint64_t memory_total = 0;
    uint64_t memory_free = 0;
};

build_info get_build_info();
std::vector<device_info> list_devices();

}  // namespace lucebox
