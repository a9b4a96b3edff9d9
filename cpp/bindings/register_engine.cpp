// Engine and Session. Long calls release the GIL; callbacks into Python re-acquire it.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "lucebox/engine.h"
#include "module.h"

namespace py = pybind11;

namespace lucebox::bindings {

namespace {

// The session's tokens for a proposal hook: a read-only int32 array, one copy (a list would build one
// Python int a token, ~0.5 ms a step at 32000 tokens, which the benchmarks would count as draft time).
py::array_t<int32_t> context_array(const std::vector<int32_t> & ctx) {
    py::array_t<int32_t> out(static_cast<py::ssize_t>(ctx.size()));
    std::memcpy(out.mutable_data(), ctx.data(), ctx.size() * sizeof(int32_t));
    out.attr("setflags")(py::arg("write") = false);
    return out;
}

// A token_constraint implemented in Python: an object with allowed(words) and accept(token).
// allowed() gets a writable uint32 array viewing the sampler's words (valid during the call only).
class py_constraint final : public token_constraint {
  public:
    explicit py_constraint(py::object obj) : obj_(std::move(obj)) {}
    ~py_constraint() override {
        py::gil_scoped_acquire gil;
        obj_ = py::object();
    }
    void allowed(uint32_t * words, size_t n_words) override {
        py::gil_scoped_acquire gil;
        py::array_t<uint32_t> view({static_cast<py::ssize_t>(n_words)}, {sizeof(uint32_t)}, words,
                                   py::capsule(words, [](void *) {}));
        obj_.attr("allowed")(view);
    }
    void accept(int32_t token) override {
        py::gil_scoped_acquire gil;
        obj_.attr("accept")(token);
    }

  private:
    py::object obj_;
};

}  // namespace

void register_engine(py::module_ & m) {
    py::class_<sampling_params>(m, "SamplingParams")
        .def(py::init<>())
        .def_readwrite("temperature", &sampling_params::temperature)
        .def_readwrite("top_k", &sampling_params::top_k)
        .def_readwrite("top_p", &sampling_params::top_p)
        .def_readwrite("min_p", &sampling_params::min_p)
        .def_readwrite("presence_penalty", &sampling_params::presence_penalty)
        .def_readwrite("frequency_penalty", &sampling_params::frequency_penalty)
        .def_readwrite("repetition_penalty", &sampling_params::repetition_penalty)
        .def_readwrite("penalty_last_n", &sampling_params::penalty_last_n)
        .def_readwrite("seed", &sampling_params::seed)
        .def_readwrite("logit_bias", &sampling_params::logit_bias)
        .def("validate", &sampling_params::validate);

    py::class_<engine_config>(m, "EngineConfig")
        .def(py::init<>())
        .def_readwrite("model_path", &engine_config::model_path)
        .def_readwrite("n_ctx", &engine_config::n_ctx)
        .def_readwrite("kv_type_k", &engine_config::kv_type_k)
        .def_readwrite("kv_type_v", &engine_config::kv_type_v)
        .def_readwrite("device", &engine_config::device)
        .def_readwrite("n_ubatch", &engine_config::n_ubatch)
        .def_readwrite("n_threads", &engine_config::n_threads)
        .def_readwrite("capture_layers", &engine_config::capture_layers)
        .def_readwrite("draft_path", &engine_config::draft_path)
        .def_readwrite("spec", &engine_config::spec)
        .def_readwrite("rollback", &engine_config::rollback)
        .def_readwrite("tree_budget", &engine_config::tree_budget)
        .def_readwrite("tree_top_k", &engine_config::tree_top_k)
        .def_readwrite("devices", &engine_config::devices)
        .def_readwrite("split", &engine_config::split)
        .def_readwrite("layer_proportions", &engine_config::layer_proportions)
        .def_readwrite("draft_device", &engine_config::draft_device)
        .def("validate", &engine_config::validate);

    py::class_<token_logprobs>(m, "TokenLogprobs",
                               "An emitted token's log probability and its most likely alternatives (engine.h).")
        .def_readonly("logprob", &token_logprobs::logprob)
        .def_readonly("top", &token_logprobs::top);
    m.attr("MAX_TOP_LOGPROBS") = MAX_TOP_LOGPROBS;

    py::class_<generate_result>(m, "GenerateResult")
        .def_readonly("tokens", &generate_result::tokens)
        .def_readonly("logprobs", &generate_result::logprobs)
        .def_readonly("finish_reason", &generate_result::finish_reason)
        .def_property_readonly("n_prompt", [](const generate_result & r) { return r.stats.n_prompt; })
        .def_property_readonly("n_generated", [](const generate_result & r) { return r.stats.n_generated; })
        .def_property_readonly("prefill_seconds", [](const generate_result & r) { return r.stats.prefill_seconds; })
        .def_property_readonly("decode_seconds", [](const generate_result & r) { return r.stats.decode_seconds; })
        .def_property_readonly("spec_stats", [](const generate_result & r) {
            const generate_stats & s = r.stats;
            py::dict d;
            d["speculative"] = s.speculative;
            d["steps"] = s.steps;
            d["plain_steps"] = s.plain_steps;
            d["drafted"] = s.drafted;
            d["accepted"] = s.accepted;
            d["predicted_accepted"] = s.predicted_accepted;
            d["accept_histogram"] = s.accept_histogram;
            d["fast_rollbacks"] = s.fast_rollbacks;
            d["replays"] = s.replays;
            d["draft_seconds"] = s.draft_seconds;
            d["verify_seconds"] = s.verify_seconds;
            d["commit_seconds"] = s.commit_seconds;
            return d;
        });

    py::class_<session_snapshot>(m, "Snapshot",
                                 "A session's state in host or device memory (see engine.h); copies share the data.")
        .def_readonly("fingerprint", &session_snapshot::fingerprint)
        .def_readonly("tokens", &session_snapshot::tokens)
        .def_readonly("pending", &session_snapshot::pending)
        .def_property_readonly("nbytes", &session_snapshot::bytes)
        .def_property_readonly("location",
                               [](const session_snapshot & s) { return snapshot_location_name(s.location()); })
        .def_property_readonly("region_sizes", &session_snapshot::region_sizes)
        .def("to_host", &session_snapshot::to_host, py::call_guard<py::gil_scoped_release>())
        .def("save", &session_snapshot::save, py::arg("path"), py::call_guard<py::gil_scoped_release>())
        .def_static("load", &session_snapshot::load, py::arg("path"), py::call_guard<py::gil_scoped_release>());

    py::class_<session>(m, "Session")
        .def("eval", [](session & s, const std::vector<int32_t> & tokens, bool all_logits) {
            std::vector<float> logits;
            {
                py::gil_scoped_release nogil;
                logits = s.eval(tokens, all_logits);
            }
            const int64_t V = s.n_vocab();
            const int64_t rows = static_cast<int64_t>(logits.size()) / V;
            py::array_t<float> out({rows, V});
            std::memcpy(out.mutable_data(), logits.data(), logits.size() * sizeof(float));
            return out;
        }, py::arg("tokens"), py::arg("all_logits") = true)
        .def("score", &session::score, py::arg("tokens"), py::arg("n_top") = 0, py::arg("next") = -1,
             py::call_guard<py::gil_scoped_release>())
        .def("generate", [](session & s, const std::vector<int32_t> & prompt, uint32_t max_tokens,
                            const sampling_params & sampling, const std::vector<int32_t> & stop_tokens,
                            py::object on_token, py::object on_prefill, py::object propose, uint32_t block_size,
                            bool phase_timings, py::object propose_tree, int32_t logprobs, py::object constraint,
                            const std::vector<int32_t> & prediction) {
            generate_params p;
            p.prediction = prediction;
            if (!constraint.is_none()) {
                p.constraint = std::make_shared<py_constraint>(constraint);
            }
            p.max_tokens = max_tokens;
            p.logprobs = logprobs;
            p.sampling = sampling;
            p.stop_tokens = stop_tokens;
            if (!on_prefill.is_none()) {
                p.on_prefill = [on_prefill](uint64_t done, uint64_t total) {
                    py::gil_scoped_acquire gil;
                    on_prefill(done, total);
                };
            }
            p.block_size = block_size;
            p.phase_timings = phase_timings;
            if (!propose.is_none()) {
                p.propose = [propose](const std::vector<int32_t> & ctx, int32_t last, uint32_t n) {
                    py::gil_scoped_acquire gil;
                    return propose(context_array(ctx), last, n).cast<std::vector<int32_t>>();
                };
            }
            if (!propose_tree.is_none()) {
                p.propose_tree = [propose_tree](const std::vector<int32_t> & ctx, int32_t last, uint32_t n) {
                    py::gil_scoped_acquire gil;
                    return propose_tree(context_array(ctx), last, n)
                        .cast<std::pair<std::vector<int32_t>, std::vector<int32_t>>>();
                };
            }
            token_callback cb;
            if (!on_token.is_none()) {
                cb = [on_token](int32_t t, const token_logprobs * lp) {  // on_token(t), or (t, lp) with logprobs
                    py::gil_scoped_acquire gil;
                    py::object r = lp != nullptr ? on_token(t, *lp) : on_token(t);
                    return r.is_none() || r.cast<bool>();
                };
            }
            py::gil_scoped_release nogil;
            return s.generate(prompt, p, cb);
        }, py::arg("prompt"), py::arg("max_tokens"), py::arg("sampling"), py::arg("stop_tokens"),
           py::arg("on_token") = py::none(), py::arg("on_prefill") = py::none(), py::arg("propose") = py::none(),
           py::arg("block_size") = 0, py::arg("phase_timings") = false, py::arg("propose_tree") = py::none(),
           py::arg("logprobs") = -1, py::arg("constraint") = py::none(),
           py::arg("prediction") = std::vector<int32_t>())
        .def("reset", &session::reset, py::call_guard<py::gil_scoped_release>())
        .def("snapshot", [](session & s, const std::string & location) {
            const snapshot_location where = parse_snapshot_location(location);
            py::gil_scoped_release nogil;
            return s.snapshot(where);
        }, py::arg("location") = "host")
        .def_property_readonly("snapshot_nbytes", &session::snapshot_bytes)
        .def_property_readonly("state_nbytes", &session::state_bytes)
        .def("restore", &session::restore, py::arg("snapshot"), py::call_guard<py::gil_scoped_release>())
        .def("draft_proposals", &session::draft_proposals, py::arg("last"), py::call_guard<py::gil_scoped_release>())
        .def_property_readonly("n_past", &session::n_past)
        .def_property_readonly("tokens", &session::tokens)
        .def_property_readonly("pending_token", &session::pending_token)
        .def_property_readonly("n_ctx", &session::n_ctx)
        .def_property_readonly("n_vocab", &session::n_vocab);

    py::class_<engine>(m, "Engine")
        .def(py::init([](const engine_config & cfg, py::object progress) {
            progress_callback cb;
            if (!progress.is_none()) {
                cb = [progress](uint64_t done, uint64_t total) {
                    py::gil_scoped_acquire gil;
                    progress(done, total);
                };
            }
            py::gil_scoped_release nogil;
            return std::make_unique<engine>(cfg, cb);
        }), py::arg("config"), py::arg("progress") = py::none())
        .def("new_session", &engine::new_session, py::call_guard<py::gil_scoped_release>(), py::keep_alive<0, 1>())
        .def("copy_snapshot", [](const engine & e, const session_snapshot & snap, const std::string & location) {
            const snapshot_location where = parse_snapshot_location(location);
            py::gil_scoped_release nogil;
            return e.copy_snapshot(snap, where);
        }, py::arg("snapshot"), py::arg("location"))
        .def("load_snapshot", [](const engine & e, const std::string & path, const std::string & location) {
            const snapshot_location where = parse_snapshot_location(location);
            py::gil_scoped_release nogil;
            return e.load_snapshot(path, where);
        }, py::arg("path"), py::arg("location") = "host")
        .def_property_readonly("hparams", &engine::hparams, py::return_value_policy::reference_internal)
        .def_property_readonly("device_name", &engine::device_name)
        .def_property_readonly("device_description", &engine::device_description)
        .def("plan", [](const engine & e) { return plan_to_dict(e.plan()); });
}

}  // namespace lucebox::bindings
