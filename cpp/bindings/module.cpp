#include "module.h"

#include "lucebox/log.h"

PYBIND11_MODULE(_core, m) {
    m.doc() = "lucebox C++ core (pinned ggml). Use the lucebox package, not this module directly.";
    lucebox::install_ggml_logger();
    lucebox::bindings::register_errors(m);
    lucebox::bindings::register_system(m);
    lucebox::bindings::register_models(m);
    lucebox::bindings::register_engine(m);
}
