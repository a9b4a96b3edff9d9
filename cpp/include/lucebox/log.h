// Routing of ggml's log output. lucebox installs one ggml log callback at start-up; messages
// at warning level and above go to stderr, unless a log_capture is active on the calling
// thread, in which case they are collected so that an error can quote them.
#pragma once

#include <string>

namespace lucebox {

class log_capture;
// Appends to the active capture of this thread (internal to log.cpp).
void append_captured(const char * msg);

// Install the ggml log callback (idempotent, thread-safe).
void install_ggml_logger();

// While alive, ggml messages emitted on this thread are appended to text() instead of printed.
class log_capture {
  public:
    log_capture();
    ~log_capture();
    log_capture(const log_capture &) = delete;
    log_capture & operator=(const log_capture &) = delete;

    const std::string & text() const { return text_; }
    // The last non-empty line captured, without the "function: " prefix ggml adds.
    std::string last_line() const;

  private:
    friend void append_captured(const char * msg);
    std::string text_;
    log_capture * previous_;
};

}  // namespace lucebox
