#include "lucebox/system.h"

#include "ggml-backend.h"
#include "lucebox/log.h"

#include "lucebox/build_config.h"

namespace lucebox {

build_info get_build_info() {
    install_ggml_logger();
    build_info info;
    info.version = LUCEBOX_VERSION;
    info.ggml_pin = LUCEBOX_GGML_PIN;
    for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
        info.backends.emplace_back(ggml_backend_reg_name(ggml_backend_reg_get(i)));
    }
    info.cuda_architectures = LUCEBOX_CUDA_ARCHS;
    return info;
}

std::vector<device_info> list_devices() {
    install_ggml_logger();
    std::vector<device_info> out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        device_info d;
        d.name = ggml_backend_dev_name(dev);
        d.description = ggml_backend_dev_description(dev);
        switch (ggml_backend_dev_type(dev)) {
            case GGML_BACKEND_DEVICE_TYPE_CPU: d.type = "cpu"; break;
            case GGML_BACKEND_DEVICE_TYPE_GPU: d.type = "gpu"; break;
            case GGML_BACKEND_DEVICE_TYPE_IGPU: d.type = "igpu"; break;
            case GGML_BACKEND_DEVICE_TYPE_ACCEL: d.type = "accel"; break;
            default: d.type = "other"; break;
        }
        size_t free = 0, total = 0;
        ggml_backend_dev_memory(dev, &free, &total);
        d.memory_free = free;
        d.memory_total = total;
        out.push_back(std::move(d));
    }
    return out;
}

}  // namespace lucebox
