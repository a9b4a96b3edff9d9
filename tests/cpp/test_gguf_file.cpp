// GGUF reading: typed accessors, truncation and malformed headers raise gguf_error with the
// file, key or tensor named; qwen35 hparams and tensor checks on a minimal file written here.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "check.h"
#include "ggml.h"
#include "gguf.h"
#include "lucebox/errors.h"
#include "lucebox/gguf_file.h"
#include "lucebox/models.h"

using namespace lucebox;

namespace {

std::string tmp_path(const std::string & name) {
    return (std::filesystem::temp_directory_path() / ("lucebox_test_" + name)).string();
}

// Writes a GGUF with a few keys and one 8x4 f32 tensor.
std::string write_small(const std::string & name) {
    gguf_context * ctx = gguf_init_empty();
    gguf_set_val_str(ctx, "general.architecture", "test");
    gguf_set_val_u32(ctx, "test.u32", 42);
    gguf_set_val_i32(ctx, "test.negative", -3);
    gguf_set_val_f32(ctx, "test.f32", 0.5f);
    gguf_set_val_bool(ctx, "test.bool", true);
    const int32_t arr[3] = {1, 2, 3};
    gguf_set_arr_data(ctx, "test.arr", GGUF_TYPE_INT32, arr, 3);

    ggml_init_params ip{ggml_tensor_overhead() * 4, nullptr, true};
    ggml_context * gctx = ggml_init(ip);
    ggml_tensor * t = ggml_new_tensor_2d(gctx, GGML_TYPE_F32, 8, 4);
    ggml_set_name(t, "weight");
    static float data[32] = {};
    t->data = data;
    gguf_add_tensor(ctx, t);
    const std::string path = tmp_path(name);
    CHECK(gguf_write_to_file(ctx, path.c_str(), false));
    gguf_free(ctx);
    ggml_free(gctx);
    return path;
}

void truncate_to(const std::string & path, uintmax_t size) { std::filesystem::resize_file(path, size); }

}  // namespace

TEST_CASE(reads_typed_values) {
    const std::string path = write_small("typed.gguf");
    gguf_file f = gguf_file::open(path);
    CHECK(f.get_string("general.architecture") == "test");
    CHECK(f.get_u32("test.u32") == 42);
    CHECK(f.get_f32("test.f32") == 0.5f);
    CHECK(f.get_bool("test.bool"));
    CHECK(f.get_int_array("test.arr").size() == 3);
    CHECK(f.get_int_array("test.arr")[2] == 3);
    CHECK(f.tensors().size() == 1);
    CHECK(f.find_tensor("weight") != nullptr);
    CHECK(f.find_tensor("weight")->ne[0] == 8 && f.find_tensor("weight")->ne[1] == 4);
    CHECK(!f.find_u32("absent").has_value());
    std::filesystem::remove(path);
}

TEST_CASE(typed_errors_name_the_key) {
    const std::string path = write_small("errors.gguf");
    gguf_file f = gguf_file::open(path);
    CHECK_THROWS(f.get_u32("absent.key"), gguf_error, "missing required key 'absent.key'");
    CHECK_THROWS(f.get_u32("test.f32"), gguf_error, "key 'test.f32' has type");
    CHECK_THROWS(f.get_u32("test.negative"), gguf_error, "out of range");
    CHECK_THROWS(f.get_string("test.u32"), gguf_error, "expected string");
    CHECK_THROWS(f.get_bool_array("test.arr"), gguf_error, "expected an array of bool");
    std::filesystem::remove(path);
}

TEST_CASE(truncated_data_is_reported) {
    const std::string path = write_small("trunc.gguf");
    const auto size = std::filesystem::file_size(path);
    truncate_to(path, size - 16);
    CHECK_THROWS(gguf_file::open(path), gguf_error, "truncated: tensor 'weight'");
    truncate_to(path, 10);
    CHECK_THROWS(gguf_file::open(path), gguf_error, "malformed or truncated GGUF");
    std::filesystem::remove(path);
}

TEST_CASE(bad_magic_and_missing_file) {
    const std::string path = tmp_path("magic.gguf");
    {
        std::ofstream out(path, std::ios::binary);
        out << "NOPE this is not a gguf file at all";
    }
    CHECK_THROWS(gguf_file::open(path), gguf_error, "file '" + path + "'");
    CHECK_THROWS(gguf_file::open(path), gguf_error, "invalid magic");
    std::filesystem::remove(path);
    CHECK_THROWS(gguf_file::open(path), gguf_error, "cannot open");
}

TEST_CASE(wrong_architecture) {
    const std::string path = write_small("arch.gguf");
    gguf_file f = gguf_file::open(path);
    CHECK_THROWS(read_qwen35(f), gguf_error, "architecture is 'test', expected 'qwen35'");
    CHECK_THROWS(read_dflash(f), gguf_error, "expected 'dflash'");
    std::filesystem::remove(path);
}

TEST_CASE(qwen35_spec_counts) {
    qwen35_hparams hp;
    hp.n_vocab = 100; hp.n_ctx_train = 64; hp.n_embd = 32; hp.n_layer = 4; hp.n_ff = 64;
    hp.n_head = 2; hp.n_head_kv = 1; hp.head_dim = 16; hp.n_rot = 8; hp.rope_sections = {2, 1, 1, 0};
    hp.ssm_d_conv = 4; hp.ssm_d_state = 8; hp.ssm_n_k_heads = 2; hp.ssm_n_v_heads = 4;
    hp.is_recurrent = {true, true, true, false};
    hp.validate();
    const auto specs = qwen35_tensor_specs(hp);
    // 3 global + 3 GDN layers * (2 norms + 3 ffn + 9 gdn) + 1 attention layer * (2 norms + 3 ffn + 6 attn)
    CHECK(specs.size() == 3 + 3 * 14 + 11);
    CHECK(hp.conv_dim() == 2 * 16 + 32);
    hp.ssm_n_v_heads = 3;
    CHECK_THROWS(hp.validate(), config_error, "multiple of ssm.group_count");
}

TEST_MAIN()
