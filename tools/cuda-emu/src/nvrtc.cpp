// libnvrtc.so.13 of the emulated GPU: a program's CUDA C is checked by the host
// C++ compiler (with the prelude that gives it its meaning on the CPU) and handed
// out as module text that the emulated driver's loader builds and loads.

#include <cstring>
#include <string>
#include <vector>

#include "build.h"

typedef int nvrtcResult;
enum : nvrtcResult {
    NVRTC_SUCCESS = 0,
    NVRTC_ERROR_INVALID_INPUT = 3,
    NVRTC_ERROR_INVALID_PROGRAM = 4,
    NVRTC_ERROR_INVALID_OPTION = 5,
    NVRTC_ERROR_COMPILATION = 6,
};

struct Program {
    std::string source, name, log, module;
};

#define API extern "C" __attribute__((visibility("default")))

API nvrtcResult nvrtcVersion(int* major, int* minor) {
    *major = 13;
    *minor = 0;
    return NVRTC_SUCCESS;
}

API const char* nvrtcGetErrorString(nvrtcResult result) {
    switch (result) {
        case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
        case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
        case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
        case NVRTC_ERROR_INVALID_OPTION: return "NVRTC_ERROR_INVALID_OPTION";
        case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
        default: return "NVRTC_ERROR";
    }
}

API nvrtcResult nvrtcCreateProgram(Program** prog, const char* source, const char* name,
                                   int headers, const char* const*, const char* const*) {
    if (prog == nullptr || source == nullptr) return NVRTC_ERROR_INVALID_INPUT;
    // In-memory headers are not emulated: tinylm passes none.
    if (headers != 0) return NVRTC_ERROR_INVALID_INPUT;
    *prog = new Program{source, name ? name : "default_program", "", ""};
    return NVRTC_SUCCESS;
}

API nvrtcResult nvrtcDestroyProgram(Program** prog) {
    if (prog == nullptr || *prog == nullptr) return NVRTC_ERROR_INVALID_PROGRAM;
    delete *prog;
    *prog = nullptr;
    return NVRTC_SUCCESS;
}

/// NVRTC's options as host compiler flags; false (and the log says why) for one
/// that is not understood.
static bool translate(const std::string& option, std::vector<std::string>* flags, std::string* log) {
    auto value = [&](const char* prefix) -> const char* {
        size_t n = std::strlen(prefix);
        return option.compare(0, n, prefix) == 0 ? option.c_str() + n : nullptr;
    };
    if (const char* arch = value("--gpu-architecture=") ? value("--gpu-architecture=") : value("-arch=")) {
        const char* digits = std::strchr(arch, '_');
        if (digits == nullptr || std::strlen(digits + 1) < 2) {
            *log = "nvrtc: invalid architecture " + option;
            return false;
        }
        flags->push_back(std::string("-D__CUDA_ARCH__=") + (digits + 1) + "0");
    } else if (const char* dir = value("--include-path=") ? value("--include-path=") : value("-I")) {
        flags->push_back(std::string("-I") + dir);
    } else if (const char* def = value("--define-macro=") ? value("--define-macro=") : value("-D")) {
        flags->push_back(std::string("-D") + def);
    } else if (const char* std_ = value("--std=") ? value("--std=") : value("-std=")) {
        flags->push_back(std::string("-std=") + std_);
    } else if (option == "--use_fast_math" || option == "-use_fast_math" || option == "-lineinfo" ||
               option == "--generate-line-info" || option == "-G" || option == "--device-debug") {
        // Accepted; the emulator rounds every operation either way.
    } else {
        *log = "nvrtc error: unrecognized option " + option;
        return false;
    }
    return true;
}

API nvrtcResult nvrtcCompileProgram(Program* prog, int count, const char* const* options) {
    if (prog == nullptr) return NVRTC_ERROR_INVALID_PROGRAM;
    std::vector<std::string> flags = {"-D__CUDACC__", "-D__CUDACC_RTC__", "-D__NVCC__"};
    for (int i = 0; i < count; i++) {
        if (!translate(options[i], &flags, &prog->log)) return NVRTC_ERROR_INVALID_OPTION;
    }
    std::string cpp = cuemu::module_cpp(prog->source, prog->name), library;
    if (!cuemu::build_module(cpp, flags, &library, &prog->log)) return NVRTC_ERROR_COMPILATION;
    prog->log.clear();
    prog->module = cuemu::module_text(cpp, flags);
    return NVRTC_SUCCESS;
}

API nvrtcResult nvrtcGetPTXSize(Program* prog, size_t* size) {
    if (prog == nullptr || prog->module.empty()) return NVRTC_ERROR_INVALID_PROGRAM;
    *size = prog->module.size() + 1;
    return NVRTC_SUCCESS;
}

API nvrtcResult nvrtcGetPTX(Program* prog, char* ptx) {
    if (prog == nullptr || prog->module.empty()) return NVRTC_ERROR_INVALID_PROGRAM;
    std::memcpy(ptx, prog->module.c_str(), prog->module.size() + 1);
    return NVRTC_SUCCESS;
}

API nvrtcResult nvrtcGetProgramLogSize(Program* prog, size_t* size) {
    if (prog == nullptr) return NVRTC_ERROR_INVALID_PROGRAM;
    *size = prog->log.size() + 1;
    return NVRTC_SUCCESS;
}

API nvrtcResult nvrtcGetProgramLog(Program* prog, char* log) {
    if (prog == nullptr) return NVRTC_ERROR_INVALID_PROGRAM;
    std::memcpy(log, prog->log.c_str(), prog->log.size() + 1);
    return NVRTC_SUCCESS;
}
