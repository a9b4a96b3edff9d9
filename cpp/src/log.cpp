#include "lucebox/log.h"

#include <cstdio>
#include <mutex>

#include "ggml.h"

namespace lucebox {

namespace {
thread_local log_capture * t_capture = nullptr;

void ggml_log_callback_fn(enum ggml_log_level level, const char * text, void * /*user_data*/) {
    if (t_capture != nullptr) {
        append_captured(text);
        return;
    }
    if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}
}  // namespace

void append_captured(const char * msg) { t_capture->text_ += msg; }

void install_ggml_logger() {
    static std::once_flag once;
    std::call_once(once, [] { ggml_log_set(ggml_log_callback_fn, nullptr); });
}

log_capture::log_capture() : previous_(t_capture) {
    install_ggml_logger();
    t_capture = this;
}

log_capture::~log_capture() { t_capture = previous_; }

std::string log_capture::last_line() const {
    size_t end = text_.find_last_not_of("\n ");
    if (end == std::string::npos) {
        return {};
    }
    size_t begin = text_.rfind('\n', end);
    begin = begin == std::string::npos ? 0 : begin + 1;
    std::string line = text_.substr(begin, end - begin + 1);
    size_t colon = line.find(": ");
    if (colon != std::string::npos && line.compare(0, 5, "gguf_") == 0) {
        line = line.substr(colon + 2);
    }
    return line;
}

}  // namespace lucebox
