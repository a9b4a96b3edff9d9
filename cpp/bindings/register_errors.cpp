// Maps lucebox C++ exceptions to the Python classes of lucebox.errors (which also derive from
// the matching builtin, e.g. GGUFError is a ValueError).
#include <pybind11/pybind11.h>

#include "lucebox/errors.h"
#include "module.h"

namespace py = pybind11;

namespace lucebox::bindings {

namespace {
void raise_as(const char * cls_name, const char * message) {
    py::object cls = py::module_::import("lucebox.errors").attr(cls_name);
    PyErr_SetString(cls.ptr(), message);
}
}  // namespace

void register_errors(py::module_ & m) {
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) {
                std::rethrow_exception(p);
            }
        } catch (const gguf_error & e) {
            raise_as("GGUFError", e.what());
        } catch (const draft_mismatch_error & e) {
            raise_as("DraftMismatchError", e.what());
        } catch (const config_error & e) {
            raise_as("ConfigError", e.what());
        } catch (const unsupported_error & e) {
            raise_as("UnsupportedError", e.what());
        } catch (const out_of_memory_error & e) {
            raise_as("OutOfMemoryError", e.what());
        } catch (const error & e) {
            raise_as("LuceboxError", e.what());
        }
    });
}

}  // namespace lucebox::bindings
