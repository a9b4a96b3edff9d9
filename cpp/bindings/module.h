// pybind11 registration of lucebox._core: one register_* per bound concept, no logic here.
#pragma once

#include <pybind11/pybind11.h>

namespace lucebox {
struct memory_plan;
}

namespace lucebox::bindings {

// Every field of a memory plan, plus total_bytes and bytes_per_verified_token (what each extra
// verified token or DDTree node costs: its recurrent checkpoint and its feature-ring row).
pybind11::dict plan_to_dict(const memory_plan & p);

void register_errors(pybind11::module_ & m);
void register_system(pybind11::module_ & m);
void register_models(pybind11::module_ & m);
void register_engine(pybind11::module_ & m);

}  // namespace lucebox::bindings
