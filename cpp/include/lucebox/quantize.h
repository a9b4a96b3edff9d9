// Weight quantization through ggml (used by the synthetic-model writer for the K-quants that the
// gguf Python package cannot produce), and its inverse (tests compare quantized models with the
// float model they stand for).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ggml.h"

namespace lucebox {

// Any ggml type by its ggml name ("q4_K", "q8_0", "f16"); throws config_error if unknown.
ggml_type parse_ggml_type(const std::string & name);

// Quantizes `n_rows` rows of `n_per_row` floats (row-major, contiguous) to `type`.
// n_per_row must be a multiple of the type's block size. importance: null, or n_per_row weights of
// the columns' squared errors (an importance matrix's row, as llama.cpp's quantizer passes it); the
// types that need one (ggml_quantize_requires_imatrix: IQ1_S, IQ2_XXS, IQ2_XS) are rejected
// without. Runs on up to `n_threads` threads (0: hardware concurrency).
std::vector<uint8_t> quantize_rows(const float * data, int64_t n_rows, int64_t n_per_row, ggml_type type,
                                   int n_threads = 0, const float * importance = nullptr);

// The floats that whole rows of `type` (row_size(type, n_per_row) bytes each, contiguous, `n_bytes`
// in all) stand for, with ggml's to_float: n_bytes / row_size rows of n_per_row, row-major. Throws
// config_error when the bytes are not whole rows, n_per_row is not a multiple of the block size, or
// ggml cannot dequantize the type.
std::vector<float> dequantize_rows(const uint8_t * data, size_t n_bytes, int64_t n_per_row, ggml_type type);

}  // namespace lucebox
