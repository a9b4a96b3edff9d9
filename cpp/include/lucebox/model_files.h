// Opened and validated model files: the parsed GGUF plus its architecture's hyperparameters.
// Opening reads metadata and the tensor directory only; weights are loaded by the engine.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "lucebox/gguf_file.h"
#include "lucebox/models.h"

namespace lucebox {

struct target_model_file {
    gguf_file file;
    qwen35_hparams hparams;
    uint64_t weight_bytes = 0;  // sum of all tensor data in the file
};

struct draft_model_file {
    gguf_file file;
    dflash_hparams hparams;
    uint64_t weight_bytes = 0;
};

target_model_file open_target(const std::string & path);
draft_model_file open_draft(const std::string & path);

// Bytes of tensor data per ggml type name, e.g. {"q8_0": ..., "f32": ...}.
std::map<std::string, uint64_t> bytes_by_type(const gguf_file & file);

}  // namespace lucebox
