// pybind11 registration of lucebox._core: one register_* per bound concept, no logic here.
#pragma once

#include <pybind11/pybind11.h>

namespace lucebox::bindings {

void register_errors(pybind11::module_ & m);
void register_system(pybind11::module_ & m);
void register_models(pybind11::module_ & m);
void register_engine(pybind11::module_ & m);

}  // namespace lucebox::bindings
