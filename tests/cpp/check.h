// Minimal test harness for the C++ unit tests: CHECK records a failure and continues,
// CHECK_THROWS checks the exception type and a substring of its message.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace lucebox_test {

inline int & failures() {
    static int n = 0;
    return n;
}

struct test_case {
    const char * name;
    std::function<void()> fn;
};

inline std::vector<test_case> & registry() {
    static std::vector<test_case> r;
    return r;
}

struct registrar {
    registrar(const char * name, std::function<void()> fn) { registry().push_back({name, std::move(fn)}); }
};

// Runs every registered case, or only the one named `only` (CTest registers single cases that way).
inline int run_all(const char * only = nullptr) {
    bool found = only == nullptr;
    for (const auto & t : registry()) {
        if (only != nullptr && std::string(only) != t.name) {
            continue;
        }
        found = true;
        const int before = failures();
        try {
            t.fn();
        } catch (const std::exception & e) {
            std::fprintf(stderr, "  unexpected exception in %s: %s\n", t.name, e.what());
            ++failures();
        }
        std::printf("%s %s\n", failures() == before ? "PASS" : "FAIL", t.name);
    }
    if (!found) {
        std::fprintf(stderr, "no test case named %s\n", only);
        return 1;
    }
    std::printf("%d failure(s)\n", failures());
    return failures() == 0 ? 0 : 1;
}

}  // namespace lucebox_test

#define TEST_CASE(name)                                                        \
    static void name();                                                        \
    static lucebox_test::registrar name##_registrar(#name, name);              \
    static void name()

#define CHECK(cond)                                                                             \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            std::fprintf(stderr, "  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);     \
            ++lucebox_test::failures();                                                         \
        }                                                                                       \
    } while (0)

#define CHECK_THROWS(expr, type, substring)                                                          \
    do {                                                                                             \
        bool thrown_ = false;                                                                        \
        try {                                                                                        \
            expr;                                                                                    \
        } catch (const type & e_) {                                                                  \
            thrown_ = true;                                                                          \
            if (std::string(e_.what()).find(substring) == std::string::npos) {                       \
                std::fprintf(stderr, "  %s:%d: message '%s' lacks '%s'\n", __FILE__, __LINE__, e_.what(), \
                             substring);                                                             \
                ++lucebox_test::failures();                                                          \
            }                                                                                        \
        }                                                                                            \
        if (!thrown_) {                                                                              \
            std::fprintf(stderr, "  %s:%d: %s did not throw %s\n", __FILE__, __LINE__, #expr, #type); \
            ++lucebox_test::failures();                                                              \
        }                                                                                            \
    } while (0)

#define TEST_MAIN() \
    int main(int argc, char ** argv) { return lucebox_test::run_all(argc > 1 ? argv[1] : nullptr); }
