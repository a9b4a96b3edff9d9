#include "lucebox/model_files.h"

namespace lucebox {

namespace {
uint64_t total_bytes(const gguf_file & f) {
    uint64_t n = 0;
    for (const auto & t : f.tensors()) {
        n += t.nbytes;
    }
    return n;
}
}  // namespace

target_model_file open_target(const std::string & path) {
    gguf_file file = gguf_file::open(path);
    qwen35_hparams hp = read_qwen35(file);
    const uint64_t bytes = total_bytes(file);
    return target_model_file{std::move(file), std::move(hp), bytes};
}

draft_model_file open_draft(const std::string & path) {
    gguf_file file = gguf_file::open(path);
    dflash_hparams hp = read_dflash(file);
    const uint64_t bytes = total_bytes(file);
    return draft_model_file{std::move(file), std::move(hp), bytes};
}

std::map<std::string, uint64_t> bytes_by_type(const gguf_file & file) {
    std::map<std::string, uint64_t> out;
    for (const auto & t : file.tensors()) {
        out[ggml_type_name(t.type)] += t.nbytes;
    }
    return out;
}

}  // namespace lucebox
