// Kernel modules: the emulated NVRTC turns a program into "PTX" text that carries
// the program itself (the wrapped source and the compiler flags), and the driver's
// module loader builds that text into a shared object with the host C++ compiler
// (cached by content) and loads it.
#pragma once

#include <string>
#include <vector>

namespace cuemu {

/// The names of the `__global__` functions of a CUDA C source.
std::vector<std::string> kernel_names(const std::string& source);

/// The C++ of a program: the prelude, `source` (named `name` in diagnostics), and
/// an entry for each kernel.
std::string module_cpp(const std::string& source, const std::string& name);

/// The module text NVRTC hands out as PTX: a header naming the entries (`.entry
/// NAME(` like real PTX), the flags, then `cpp`.
std::string module_text(const std::string& cpp, const std::vector<std::string>& flags);

/// Parses module text; false when `text` is not one (e.g. real PTX).
bool parse_module_text(const std::string& text, std::string* cpp, std::vector<std::string>* flags);

/// Builds `cpp` with `flags` into a shared object (from the cache when built
/// before); its path, or false with the compiler's log.
bool build_module(const std::string& cpp, const std::vector<std::string>& flags,
                  std::string* library, std::string* log);

}  // namespace cuemu
