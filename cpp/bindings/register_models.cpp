// Model files, hyperparameters, tensor layouts, memory plans and quantization.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>

#include "lucebox/errors.h"
#include "lucebox/memory_plan.h"
#include "lucebox/model_files.h"
#include "lucebox/quantize.h"
#include "module.h"

namespace py = pybind11;

namespace lucebox::bindings {

namespace {

py::list specs_to_list(const std::vector<tensor_spec> & specs) {
    py::list out;
    for (const tensor_spec & s : specs) {
        out.append(py::make_tuple(s.name, py::tuple(py::cast(s.ne)), role_name(s.role), s.required));
    }
    return out;
}

py::list tensors_to_list(const gguf_file & f) {
    py::list out;
    for (const gguf_tensor_entry & t : f.tensors()) {
        std::vector<int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
        out.append(py::make_tuple(t.name, ggml_type_name(t.type), py::tuple(py::cast(ne)), t.nbytes));
    }
    return out;
}

}  // namespace

py::dict plan_to_dict(const memory_plan & p) {
    py::dict d;
    d["target_weight_bytes"] = p.target_weight_bytes;
    d["draft_weight_bytes"] = p.draft_weight_bytes;
    d["kv_bytes_per_token"] = p.kv_bytes_per_token;
    d["kv_bytes"] = p.kv_bytes;
    d["conv_state_bytes_per_seq"] = p.conv_state_bytes_per_seq;
    d["ssm_state_bytes_per_seq"] = p.ssm_state_bytes_per_seq;
    d["recurrent_bytes"] = p.recurrent_bytes;
    d["checkpoint_bytes_per_token"] = p.checkpoint_bytes_per_token;
    d["checkpoint_bytes"] = p.checkpoint_bytes;
    d["draft_kv_bytes_per_token"] = p.draft_kv_bytes_per_token;
    d["draft_kv_bytes"] = p.draft_kv_bytes;
    d["feature_ring_tokens"] = p.feature_ring_tokens;
    d["feature_ring_bytes"] = p.feature_ring_bytes;
    d["total_bytes"] = p.total();
    d["bytes_per_verified_token"] =
        p.checkpoint_bytes_per_token + (p.feature_ring_tokens ? p.feature_ring_bytes / p.feature_ring_tokens : 0);
    return d;
}

void register_models(py::module_ & m) {
    py::class_<qwen35_hparams>(m, "Qwen35HParams", "Hyperparameters of a qwen35 target (see models.h).")
        .def(py::init<>())
        .def_readwrite("n_vocab", &qwen35_hparams::n_vocab)
        .def_readwrite("n_ctx_train", &qwen35_hparams::n_ctx_train)
        .def_readwrite("n_embd", &qwen35_hparams::n_embd)
        .def_readwrite("n_layer", &qwen35_hparams::n_layer)
        .def_readwrite("n_nextn", &qwen35_hparams::n_nextn)
        .def_readwrite("n_ff", &qwen35_hparams::n_ff)
        .def_readwrite("n_head", &qwen35_hparams::n_head)
        .def_readwrite("n_head_kv", &qwen35_hparams::n_head_kv)
        .def_readwrite("head_dim", &qwen35_hparams::head_dim)
        .def_readwrite("n_rot", &qwen35_hparams::n_rot)
        .def_readwrite("rope_sections", &qwen35_hparams::rope_sections)
        .def_readwrite("rope_freq_base", &qwen35_hparams::rope_freq_base)
        .def_readwrite("attn_scale", &qwen35_hparams::attn_scale)
        .def_readwrite("rms_eps", &qwen35_hparams::rms_eps)
        .def_readwrite("ssm_d_conv", &qwen35_hparams::ssm_d_conv)
        .def_readwrite("ssm_d_state", &qwen35_hparams::ssm_d_state)
        .def_readwrite("ssm_n_k_heads", &qwen35_hparams::ssm_n_k_heads)
        .def_readwrite("ssm_n_v_heads", &qwen35_hparams::ssm_n_v_heads)
        .def_readwrite("is_recurrent", &qwen35_hparams::is_recurrent)
        .def_readwrite("has_output", &qwen35_hparams::has_output)
        .def_property_readonly("key_dim", &qwen35_hparams::key_dim)
        .def_property_readonly("value_dim", &qwen35_hparams::value_dim)
        .def_property_readonly("conv_dim", &qwen35_hparams::conv_dim)
        .def_property_readonly("n_attention_layers", &qwen35_hparams::n_attention_layers)
        .def_property_readonly("n_recurrent_layers", &qwen35_hparams::n_recurrent_layers)
        .def("validate", &qwen35_hparams::validate)
        .def("tensor_specs", [](const qwen35_hparams & hp) { hp.validate(); return specs_to_list(qwen35_tensor_specs(hp)); },
             "[(name, shape, role, required)] in ggml order; role is embedding|matrix|norm|vector|conv.");

    py::class_<dflash_hparams>(m, "DFlashHParams", "Hyperparameters of a DFlash draft (see models.h).")
        .def(py::init<>())
        .def_readwrite("n_embd", &dflash_hparams::n_embd)
        .def_readwrite("n_layer", &dflash_hparams::n_layer)
        .def_readwrite("n_ff", &dflash_hparams::n_ff)
        .def_readwrite("n_head", &dflash_hparams::n_head)
        .def_readwrite("n_head_kv", &dflash_hparams::n_head_kv)
        .def_readwrite("head_dim", &dflash_hparams::head_dim)
        .def_readwrite("n_rot", &dflash_hparams::n_rot)
        .def_readwrite("rope_freq_base", &dflash_hparams::rope_freq_base)
        .def_readwrite("rms_eps", &dflash_hparams::rms_eps)
        .def_readwrite("block_size", &dflash_hparams::block_size)
        .def_readwrite("mask_token_id", &dflash_hparams::mask_token_id)
        .def_readwrite("target_layers", &dflash_hparams::target_layers)
        .def_readwrite("n_deferred_target_layers", &dflash_hparams::n_deferred_target_layers)
        .def_property_readonly("n_target_layers", &dflash_hparams::n_target_layers)
        .def_readwrite("causal", &dflash_hparams::causal)
        .def_readwrite("n_swa", &dflash_hparams::n_swa)
        .def_readwrite("is_swa", &dflash_hparams::is_swa)
        .def_readwrite("n_vocab", &dflash_hparams::n_vocab)
        .def_readwrite("has_token_embd", &dflash_hparams::has_token_embd)
        .def_readwrite("has_output", &dflash_hparams::has_output)
        .def_property("schema", [](const dflash_hparams & hp) { return std::string(dflash_schema_name(hp.schema)); },
                      [](dflash_hparams & hp, const std::string & name) {
                          if (name == "upstream") {
                              hp.set_schema(dflash_schema::upstream);
                          } else if (name == "lucebox") {
                              hp.set_schema(dflash_schema::lucebox);
                          } else {
                              throw config_error("unknown DFlash draft schema '" + name + "' (upstream or lucebox)");
                          }
                      },
                      "GGUF schema: 'upstream' (llama.cpp dflash) or 'lucebox' (qwen35-dflash-draft); setting it "
                      "also sets the schema's tensor names and SWA semantics.")
        .def_property_readonly("swa_kind", [](const dflash_hparams & hp) { return std::string(dflash_swa_kind_name(hp.swa_kind)); },
                               "SWA semantics: 'per_query' (upstream) or 'last_context' (lucebox).")
        .def_property_readonly("tensor_names", [](const dflash_hparams & hp) {
            py::dict d;
            d["fc"] = hp.names.fc;
            d["enc_norm"] = hp.names.enc_norm;
            d["ffn_norm"] = hp.names.ffn_norm;
            return d;
        }, "File names of the schema-dependent tensors (ffn_norm: the per-layer suffix after 'blk.N.').")
        .def("validate", &dflash_hparams::validate)
        .def("tensor_specs", [](const dflash_hparams & hp) { hp.validate(); return specs_to_list(dflash_tensor_specs(hp)); },
             "[(name, shape, role, required)] in ggml order.");

    py::class_<target_model_file>(m, "TargetFile", "A validated qwen35 GGUF (metadata and tensor directory).")
        .def_static("open", [](const std::string & path) {
            py::gil_scoped_release nogil;
            return open_target(path);
        }, py::arg("path"))
        .def_property_readonly("path", [](const target_model_file & t) { return t.file.path(); })
        .def_property_readonly("file_size", [](const target_model_file & t) { return t.file.file_size(); })
        .def_readonly("hparams", &target_model_file::hparams)
        .def_readonly("weight_bytes", &target_model_file::weight_bytes)
        .def_property_readonly("tensors", [](const target_model_file & t) { return tensors_to_list(t.file); },
                               "[(name, type, shape, nbytes)] in file order")
        .def_property_readonly("bytes_by_type", [](const target_model_file & t) { return bytes_by_type(t.file); });

    py::class_<draft_model_file>(m, "DraftFile", "A validated DFlash draft GGUF (metadata and tensor directory).")
        .def_static("open", [](const std::string & path) {
            py::gil_scoped_release nogil;
            return open_draft(path);
        }, py::arg("path"))
        .def_property_readonly("path", [](const draft_model_file & d) { return d.file.path(); })
        .def_property_readonly("file_size", [](const draft_model_file & d) { return d.file.file_size(); })
        .def_readonly("hparams", &draft_model_file::hparams)
        .def_readonly("weight_bytes", &draft_model_file::weight_bytes)
        .def_property_readonly("tensors", [](const draft_model_file & d) { return tensors_to_list(d.file); })
        .def_property_readonly("bytes_by_type", [](const draft_model_file & d) { return bytes_by_type(d.file); });

    m.def("validate_draft", [](const target_model_file & t, draft_model_file & d) {
        validate_draft_for_target(t.file, t.hparams, d.file, d.hparams);
    }, py::arg("target"), py::arg("draft"),
       "Raise DraftMismatchError if the draft cannot serve the target. Completes the draft's hparams that depend "
       "on the target (a lucebox-schema draft without target_layer_ids gets the original default ids).");

    m.def("dflash_default_target_layers", &dflash_default_target_layers, py::arg("n"), py::arg("n_layer_target"),
          "The original lucebox default captured layers (our convention: layer inputs): 2 + k * ((n_layer - 2) / (n - 1)).");

    m.def("plan_memory", [](const target_model_file & t, const draft_model_file * d, uint32_t n_ctx, uint32_t n_seq,
                            const std::string & kv_type_k, const std::string & kv_type_v, uint32_t verify_tokens,
                            uint32_t ubatch, bool keep_states) {
        memory_request req;
        req.n_ctx = n_ctx;
        req.n_seq = n_seq;
        req.kv_type_k = parse_kv_type(kv_type_k);
        req.kv_type_v = parse_kv_type(kv_type_v);
        req.verify_tokens = verify_tokens;
        req.ubatch = ubatch;
        req.keep_states = keep_states;
        memory_plan p = plan_memory(t.hparams, d ? &d->hparams : nullptr, req);
        p.target_weight_bytes = t.weight_bytes;
        p.draft_weight_bytes = d ? d->weight_bytes : 0;
        return plan_to_dict(p);
    }, py::arg("target"), py::arg("draft") = nullptr, py::arg("n_ctx") = 4096, py::arg("n_seq") = 1,
       py::arg("kv_type_k") = "f16", py::arg("kv_type_v") = "f16", py::arg("verify_tokens") = 16,
       py::arg("ubatch") = 512, py::arg("keep_states") = true,
       "Bytes needed for weights, KV, recurrent state, checkpoints, draft KV, feature ring. keep_states: every "
       "verified token's whole DeltaNet state is kept (trees, long verifies, the replay rollback); false: chain "
       "verifies whose fused DeltaNet layers keep their inputs instead.");

    m.def("quantize", [](py::array_t<float, py::array::c_style | py::array::forcecast> rows, const std::string & type_name,
                         int n_threads, std::optional<py::array_t<float, py::array::c_style | py::array::forcecast>> importance) {
        if (rows.ndim() != 2) {
            throw config_error("quantize: expected a 2-D float32 array (rows, n_per_row), got " +
                               std::to_string(rows.ndim()) + " dimensions");
        }
        const ggml_type type = parse_ggml_type(type_name);
        const int64_t n_rows = rows.shape(0), n_per_row = rows.shape(1);
        if (importance && (importance->ndim() != 1 || importance->shape(0) != n_per_row)) {
            throw config_error("quantize: importance must hold one value per column (" + std::to_string(n_per_row) + ")");
        }
        const float * imp = importance ? importance->data() : nullptr;
        std::vector<uint8_t> bytes;
        {
            py::gil_scoped_release nogil;
            bytes = quantize_rows(rows.data(), n_rows, n_per_row, type, n_threads, imp);
        }
        py::array_t<uint8_t> out({n_rows, static_cast<int64_t>(bytes.size() / n_rows)});
        std::memcpy(out.mutable_data(), bytes.data(), bytes.size());
        return out;
    }, py::arg("rows"), py::arg("type"), py::arg("n_threads") = 0, py::arg("importance") = py::none(),
       "Quantize float32 rows with ggml; returns uint8 array (rows, row_bytes). importance: one weight per "
       "column (an importance matrix's row), required by quantize_needs_importance(type) types.");

    m.def("dequantize", [](py::array_t<uint8_t, py::array::c_style | py::array::forcecast> data,
                           const std::string & type_name, int64_t n_per_row) {
        const ggml_type type = parse_ggml_type(type_name);
        std::vector<float> values;
        {
            py::gil_scoped_release nogil;
            values = dequantize_rows(data.data(), size_t(data.size()), n_per_row, type);
        }
        const int64_t n_rows = int64_t(values.size()) / n_per_row;
        py::array_t<float> out({n_rows, n_per_row});
        std::memcpy(out.mutable_data(), values.data(), values.size() * sizeof(float));
        return out;
    }, py::arg("data"), py::arg("type"), py::arg("n_per_row"),
       "The float32 values (rows, n_per_row) that `type`-encoded bytes stand for (ggml's to_float); the bytes "
       "must be whole rows.");

    m.def("quantize_needs_importance", [](const std::string & type_name) {
        return ggml_quantize_requires_imatrix(parse_ggml_type(type_name));
    }, py::arg("type"), "Whether ggml quantizes `type` only with an importance matrix (IQ1_S, IQ2_XXS, IQ2_XS).");

    m.def("ggml_type_traits", [](const std::string & type_name) {
        const ggml_type t = parse_ggml_type(type_name);
        return py::make_tuple(ggml_type_name(t), ggml_blck_size(t), ggml_type_size(t));
    }, py::arg("type"), "(canonical name, block size, bytes per block) of a ggml type.");
}

}  // namespace lucebox::bindings
