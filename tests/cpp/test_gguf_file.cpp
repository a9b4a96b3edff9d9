// GGUF reading: typed accessors, truncation and malformed headers raise gguf_error with the
// file, key or tensor named; qwen35 hparams and tensor checks on a minimal file written here;
// tensor_store's stacks (the file's bytes, members as views of one tensor, which groups stack).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <cstring>
#include <vector>

#include "check.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "gguf.h"
#include "lucebox/backend_buffers.h"
#include "graph/builders.h"
#include "lucebox/errors.h"
#include "lucebox/gguf_file.h"
#include "lucebox/models.h"

using namespace lucebox;

namespace {

std::string tmp_path(const std::string & name) {
    return (std::filesystem::temp_directory_path() / ("lucebox_test_" + name)).string();
}

// Writes `ctx` (tensors from `gctx`) to a temporary file named after `name`, frees both, returns the path.
std::string write_and_free(gguf_context * ctx, ggml_context * gctx, const std::string & name) {
    const std::string path = tmp_path(name);
    CHECK(gguf_write_to_file(ctx, path.c_str(), false));
    gguf_free(ctx);
    ggml_free(gctx);
    return path;
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
    return write_and_free(ctx, gctx, name);
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

namespace {

// A GGUF of Q8_0 matrices a [64, 3], b [64, 5], c [64, 2], an F16 matrix d [64, 4] and a Q8_0
// e [32, 2] (another row length), each byte pattern distinct; returns the bytes of each.
std::string write_stackable(const std::string & name, std::vector<std::vector<uint8_t>> & bytes) {
    gguf_context * ctx = gguf_init_empty();
    gguf_set_val_str(ctx, "general.architecture", "test");
    ggml_init_params ip{ggml_tensor_overhead() * 8, nullptr, true};
    ggml_context * gctx = ggml_init(ip);
    struct spec { const char * name; ggml_type type; int64_t ne0, ne1; };
    const spec specs[] = {{"a", GGML_TYPE_Q8_0, 64, 3}, {"b", GGML_TYPE_Q8_0, 64, 5}, {"c", GGML_TYPE_Q8_0, 64, 2},
                          {"d", GGML_TYPE_F16, 64, 4}, {"e", GGML_TYPE_Q8_0, 32, 2}};
    bytes.clear();
    bytes.reserve(std::size(specs));  // the tensors point into these until the file is written
    for (const spec & sp : specs) {
        ggml_tensor * t = ggml_new_tensor_2d(gctx, sp.type, sp.ne0, sp.ne1);
        ggml_set_name(t, sp.name);
        bytes.emplace_back(ggml_nbytes(t));
        for (size_t i = 0; i < bytes.back().size(); ++i) {
            bytes.back()[i] = uint8_t(i * 7 + bytes.size() * 31);
        }
        t->data = bytes.back().data();
        gguf_add_tensor(ctx, t);
    }
    return write_and_free(ctx, gctx, name);
}

}  // namespace

TEST_CASE(stacks_hold_the_files_bytes_as_views_of_one_tensor) {
    std::vector<std::vector<uint8_t>> bytes;
    const std::string path = write_stackable("stack.gguf", bytes);
    gguf_file f = gguf_file::open(path);
    ggml_backend_buffer_type_t buft = ggml_backend_cpu_buffer_type();
    // {a, b, c, d}: the Q8_0 prefix a, b, c stacks, d (F16) stays alone; {e, a}: a is taken, and e
    // alone is no stack
    tensor_store s = tensor_store::load(f, {"a", "b", "c", "d", "e"}, buft, nullptr, {}, {{"a", "b", "c", "d"}, {"e", "a"}});
    ggml_tensor * a = s.get("a");
    ggml_tensor * b = s.get("b");
    ggml_tensor * c = s.get("c");
    CHECK(a->view_src != nullptr && a->view_src == b->view_src && b->view_src == c->view_src);
    CHECK(a->view_src->ne[0] == 64 && a->view_src->ne[1] == 10 && a->view_src->type == GGML_TYPE_Q8_0);
    CHECK(a->view_offs == 0 && b->view_offs == ggml_nbytes(a) && c->view_offs == ggml_nbytes(a) + ggml_nbytes(b));
    CHECK(s.get("d")->view_src == nullptr && s.get("e")->view_src == nullptr);
    const char * names[] = {"a", "b", "c", "d", "e"};
    for (size_t i = 0; i < 5; ++i) {
        ggml_tensor * t = s.get(names[i]);
        CHECK(ggml_nbytes(t) == bytes[i].size());
        CHECK(std::memcmp(t->data, bytes[i].data(), bytes[i].size()) == 0);
    }
    // no stacks asked: every tensor its own
    tensor_store plain = tensor_store::load(f, {"a", "b", "c"}, buft, nullptr, {});
    CHECK(plain.get("a")->view_src == nullptr && plain.get("b")->view_src == nullptr);
    // a group whose members are not all wanted stacks consecutive wanted runs only (a, c are not)
    tensor_store part = tensor_store::load(f, {"a", "c"}, buft, nullptr, {}, {{"a", "b", "c"}});
    CHECK(part.get("a")->view_src == nullptr && part.get("c")->view_src == nullptr);
    // a member of another type (d) or row length (e) ends a run and the next run still stacks:
    // {d, a, b, e, c} stacks a, b; {d, b, c}: b, c
    for (const auto & group : {std::vector<std::string>{"d", "a", "b", "e", "c"}, std::vector<std::string>{"d", "b", "c"}}) {
        tensor_store runs = tensor_store::load(f, {"a", "b", "c", "d", "e"}, buft, nullptr, {}, {group});
        const bool ab = group.size() == 5;
        ggml_tensor * first = runs.get(ab ? "a" : "b");
        ggml_tensor * second = runs.get(ab ? "b" : "c");
        CHECK(first->view_src != nullptr && first->view_src == second->view_src);
        CHECK(first->view_offs == 0 && second->view_offs == ggml_nbytes(first));
        CHECK(runs.get(ab ? "c" : "a")->view_src == nullptr && runs.get("d")->view_src == nullptr &&
              runs.get("e")->view_src == nullptr);
        for (size_t i = 0; i < 5; ++i) {
            ggml_tensor * t = runs.get(names[i]);
            CHECK(std::memcmp(t->data, bytes[i].data(), bytes[i].size()) == 0);
        }
    }
    // an earlier group's member ends a run: {a, b, d, c} stacks a, b (c alone after d), and then
    // in {c, b} b is taken, so c stays alone
    tensor_store two = tensor_store::load(f, {"a", "b", "c", "d"}, buft, nullptr, {}, {{"a", "b", "d", "c"}, {"c", "b"}});
    CHECK(two.get("a")->view_src != nullptr && two.get("a")->view_src == two.get("b")->view_src);
    CHECK(two.get("c")->view_src == nullptr);
    std::filesystem::remove(path);
}

// Adds to gf the products of each weight with `input` on its own, computes gf, and checks that
// results[i] (a [rows, T] result of stacked_products, possibly strided) holds the same bits.
static void check_equal_separate_products(ggml_context * ctx, ggml_cgraph * gf, const std::vector<ggml_tensor *> & ws,
                                          ggml_tensor * input, const std::vector<ggml_tensor *> & results) {
    std::vector<ggml_tensor *> separate;
    for (ggml_tensor * w : ws) {
        separate.push_back(ggml_mul_mat(ctx, w, input));
        ggml_build_forward_expand(gf, separate.back());
    }
    ggml_graph_compute_with_ctx(ctx, gf, 1);
    for (size_t i = 0; i < ws.size(); ++i) {
        for (int64_t t = 0; t < input->ne[1]; ++t) {
            for (int64_t r = 0; r < ws[i]->ne[1]; ++r) {
                const float a = *reinterpret_cast<const float *>(static_cast<const char *>(results[i]->data) +
                                                                 t * results[i]->nb[1] + r * results[i]->nb[0]);
                const float b = static_cast<const float *>(separate[i]->data)[t * ws[i]->ne[1] + r];
                CHECK(a == b);
            }
        }
    }
}

TEST_CASE(stacked_products_equal_separate_products) {
    // weights W0 [32, 3], W1 [32, 2], W2 [32, 4] (F32) stacked, W3 alone; x [32, 2]
    ggml_context * wctx = ggml_init({ggml_tensor_overhead() * 8 + 32 * 16 * 4 + 1024, nullptr, false});
    ggml_tensor * stack = ggml_new_tensor_2d(wctx, GGML_TYPE_F32, 32, 9);
    ggml_tensor * w3 = ggml_new_tensor_2d(wctx, GGML_TYPE_F32, 32, 2);
    ggml_tensor * x = ggml_new_tensor_2d(wctx, GGML_TYPE_F32, 32, 2);
    for (ggml_tensor * t : {stack, w3, x}) {
        float * d = static_cast<float *>(t->data);
        for (int64_t i = 0; i < ggml_nelements(t); ++i) d[i] = float((i * 37 + t->ne[1]) % 11) - 5.0f;
    }
    std::vector<ggml_tensor *> ws{ggml_view_2d(wctx, stack, 32, 3, stack->nb[1], 0),
                                  ggml_view_2d(wctx, stack, 32, 2, stack->nb[1], 3 * stack->nb[1]),
                                  ggml_view_2d(wctx, stack, 32, 4, stack->nb[1], 5 * stack->nb[1]), w3};
    ggml_context * ctx = ggml_init({ggml_tensor_overhead() * 64 + ggml_graph_overhead() + (1 << 20), nullptr, false});
    const std::vector<ggml_tensor *> stacked = graph::stacked_products(ctx, ws, x);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    int products = 0;
    for (size_t i = 0; i < ws.size(); ++i) {
        ggml_build_forward_expand(gf, graph::contiguous(ctx, stacked[i]));
        CHECK(stacked[i]->ne[0] == ws[i]->ne[1] && stacked[i]->ne[1] == 2);
    }
    for (int n = 0; n < ggml_graph_n_nodes(gf); ++n) products += ggml_graph_node(gf, n)->op == GGML_OP_MUL_MAT;
    CHECK(products == 2);  // the stack and w3
    check_equal_separate_products(ctx, gf, ws, x, stacked);
    ggml_free(ctx);
    ggml_free(wctx);
}

TEST_CASE(normed_stacked_products_give_each_product_its_own_norm) {
    // a split stack (W0, W1 stacked; W2 alone) of the rows rms_norm(x) * g: each product's input is a
    // MUL (by g) of an RMS_NORM of x that no other node reads (what ggml patch 0003 takes into the
    // product), and every result equals the product of one shared norm
    ggml_context * wctx = ggml_init({ggml_tensor_overhead() * 8 + 32 * 16 * 4 + 1024, nullptr, false});
    ggml_tensor * stack = ggml_new_tensor_2d(wctx, GGML_TYPE_F32, 32, 5);
    ggml_tensor * w2 = ggml_new_tensor_2d(wctx, GGML_TYPE_F32, 32, 4);
    ggml_tensor * x = ggml_new_tensor_2d(wctx, GGML_TYPE_F32, 32, 3);
    ggml_tensor * g = ggml_new_tensor_1d(wctx, GGML_TYPE_F32, 32);
    for (ggml_tensor * t : {stack, w2, x, g}) {
        float * d = static_cast<float *>(t->data);
        for (int64_t i = 0; i < ggml_nelements(t); ++i) d[i] = float((i * 29 + t->ne[1]) % 13) - 6.0f;
    }
    std::vector<ggml_tensor *> ws{ggml_view_2d(wctx, stack, 32, 2, stack->nb[1], 0),
                                  ggml_view_2d(wctx, stack, 32, 3, stack->nb[1], 2 * stack->nb[1]), w2};
    ggml_context * ctx = ggml_init({ggml_tensor_overhead() * 64 + ggml_graph_overhead() + (1 << 20), nullptr, false});
    const std::vector<ggml_tensor *> normed = graph::stacked_products(ctx, ws, graph::rms_normed{x, g, 1e-6f, "n", 0});
    ggml_cgraph * gf = ggml_new_graph(ctx);
    for (ggml_tensor * t : normed) ggml_build_forward_expand(gf, graph::contiguous(ctx, t));
    const int n_nodes = ggml_graph_n_nodes(gf);
    auto uses = [&](const ggml_tensor * t) {
        int n = 0;
        for (int i = 0; i < n_nodes; ++i)
            for (const ggml_tensor * src : ggml_graph_node(gf, i)->src) n += src == t;
        return n;
    };
    int products = 0, norms = 0;
    for (int i = 0; i < n_nodes; ++i) {
        const ggml_tensor * mm = ggml_graph_node(gf, i);
        norms += mm->op == GGML_OP_RMS_NORM;
        if (mm->op != GGML_OP_MUL_MAT) continue;
        ++products;
        const ggml_tensor * mul = mm->src[1];
        CHECK(mul->op == GGML_OP_MUL && mul->src[1] == g && uses(mul) == 1);
        CHECK(mul->src[0]->op == GGML_OP_RMS_NORM && mul->src[0]->src[0] == x && uses(mul->src[0]) == 1);
        CHECK(std::strcmp(ggml_get_name(mul), "n-0") == 0);
        // (the patch takes RMS_NORM, MUL, MUL_MAT as consecutive nodes)
        CHECK(i >= 2 && ggml_graph_node(gf, i - 1) == mul && ggml_graph_node(gf, i - 2) == mul->src[0]);
    }
    CHECK(products == 2 && norms == 2);  // the stack and w2
    check_equal_separate_products(ctx, gf, ws, graph::rms_norm(ctx, x, g, 1e-6f), normed);
    ggml_free(ctx);
    ggml_free(wctx);
}

TEST_MAIN()
