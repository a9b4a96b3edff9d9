// Typed errors of the lucebox core. Every failure a user can cause gets one of these, with a
// message that names the file, key or tensor involved and what was expected. The Python
// bindings map each class to the exception of the same name in lucebox.errors.
#pragma once

#include <stdexcept>
#include <string>

namespace lucebox {

// Base of all lucebox errors.
class error : public std::runtime_error {
  public:
    using std::runtime_error::runtime_error;
};

// A GGUF file that cannot be used: unreadable, truncated, corrupt, wrong architecture, missing
// or mistyped key, missing tensor, wrong shape, unsupported tensor type.
class gguf_error : public error {
  public:
    using error::error;
};

// A draft model that does not fit its target (hidden size, vocabulary, target layer ids).
class draft_mismatch_error : public error {
  public:
    using error::error;
};

// An invalid configuration value (context length, KV type, sampling parameter, device list).
class config_error : public error {
  public:
    using error::error;
};

// Something valid in general that this build or backend cannot do.
class unsupported_error : public error {
  public:
    using error::error;
};

// An allocation that does not fit; the message names the sizes needed and available.
class out_of_memory_error : public error {
  public:
    using error::error;
};

}  // namespace lucebox
