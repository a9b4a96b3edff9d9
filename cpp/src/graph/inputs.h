// Graph inputs (tensors flagged with ggml_set_input: token ids, positions, K/V rows, masks, ...)
// and how a step's host values reach them.
//
// By default ggml's scheduler keeps inputs in host memory and, at every compute, copies each one
// to the device that reads it, synchronizing the device stream before and after each copy (two
// host waits per input, ~5 inputs a forward pass). place_on_device() gives them a place in the
// device's compute buffer instead, and set() then writes there with an asynchronous copy queued
// on the device's stream ahead of the compute: a step then waits for the device only where it
// reads a result (token ids, logits).
#pragma once

#include <cstddef>

#include "ggml-backend.h"
#include "ggml.h"

namespace lucebox::graph {

// Assigns every input of gf that has no memory yet to `device` (one of s's backends). Call it
// between ggml_backend_sched_reset and ggml_backend_sched_alloc_graph (the scheduler forgets
// assignments on reset). An input read on another backend is copied there by the scheduler, as
// before. A no-op for a host (CPU) backend, whose inputs are in host memory anyway.
void place_on_device(ggml_backend_sched_t s, ggml_cgraph * gf, ggml_backend_t device);

// Writes `bytes` bytes from `data` to the start of input t of a graph allocated by s. In device
// memory: queued on the stream of the backend s gave t (ordered before that backend's next
// compute; `data` may be reused as soon as this returns, as the copy stages it first). In host
// memory (or s null): a plain synchronous write.
void set(ggml_backend_sched_t s, ggml_tensor * t, const void * data, size_t bytes);

}  // namespace lucebox::graph
