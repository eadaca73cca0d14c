#include "build.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <cctype>
#include <sstream>
#include <thread>

namespace cuemu {

namespace {

const char kMagic[] = "// cuda-emu module 1\n";
const char kSourceMarker[] = "//@source\n";

/// The directory of the library this code is linked into (the emulator's lib/).
std::string library_dir() {
    Dl_info info;
    dladdr(reinterpret_cast<void*>(&library_dir), &info);
    std::string path = info.dli_fname;
    return path.substr(0, path.rfind('/'));
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

std::string quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) {
        if (c == '\'') q += "'\\''";
        else q += c;
    }
    return q + "'";
}

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
    for (unsigned char c : s) {
        h ^= c;
        h *= 1099511628211ull;
    }
    return h;
}

std::string cache_dir() {
    if (const char* d = std::getenv("CUDA_EMU_CACHE")) return d;
    if (const char* d = std::getenv("XDG_CACHE_HOME")) return std::string(d) + "/cuda-emu";
    if (const char* d = std::getenv("HOME")) return std::string(d) + "/.cache/cuda-emu";
    return "/tmp/cuda-emu";
}

void make_dirs(const std::string& path) {
    for (size_t i = 1; i <= path.size(); i++) {
        if (i == path.size() || path[i] == '/') mkdir(path.substr(0, i).c_str(), 0755);
    }
}

}  // namespace

std::vector<std::string> kernel_names(const std::string& source) {
    auto word = [](char c) { return std::isalnum((unsigned char)c) || c == '_'; };
    std::vector<std::string> names;
    const std::string global = "__global__";
    for (size_t at = source.find(global); at != std::string::npos; at = source.find(global, at + 1)) {
        size_t i = at + global.size();
        auto skip = [&] { while (i < source.size() && std::isspace((unsigned char)source[i])) i++; };
        skip();
        if (source.compare(i, 4, "void") != 0 || i + 4 >= source.size() || word(source[i + 4])) continue;
        i += 4;
        skip();
        const std::string bounds = "__launch_bounds__(";
        if (source.compare(i, bounds.size(), bounds) == 0) {  // void __launch_bounds__(…) NAME(
            i = source.find(')', i);
            if (i == std::string::npos) break;
            i++;
            skip();
        }
        size_t start = i;
        while (i < source.size() && word(source[i])) i++;
        std::string name = source.substr(start, i - start);
        skip();
        if (!name.empty() && i < source.size() && source[i] == '(') names.push_back(name);
    }
    return names;
}

std::string module_cpp(const std::string& source, const std::string& name) {
    std::string cpp = "#include \"cuda_emu_prelude.h\"\n#line 1 \"" + name + "\"\n" + source + "\n";
    for (const auto& k : kernel_names(source)) cpp += "CUEMU_KERNEL(" + k + ")\n";
    return cpp;
}

std::string module_text(const std::string& cpp, const std::vector<std::string>& flags) {
    std::string text = kMagic;
    for (const auto& k : kernel_names(cpp)) text += "// .entry " + k + "(\n";
    for (const auto& f : flags) text += "//@flag " + f + "\n";
    return text + kSourceMarker + cpp;
}

bool parse_module_text(const std::string& text, std::string* cpp, std::vector<std::string>* flags) {
    if (text.compare(0, sizeof kMagic - 1, kMagic) != 0) return false;
    size_t source = text.find(kSourceMarker);
    if (source == std::string::npos) return false;
    std::istringstream header(text.substr(0, source));
    for (std::string line; std::getline(header, line);) {
        if (line.compare(0, 8, "//@flag ") == 0) flags->push_back(line.substr(8));
    }
    *cpp = text.substr(source + sizeof kSourceMarker - 1);
    return true;
}

bool build_module(const std::string& cpp, const std::vector<std::string>& flags,
                  std::string* library, std::string* log) {
    const std::string lib = library_dir();
    const std::string include = lib + "/../include";
    const char* cxx = std::getenv("CUDA_EMU_CXX");
    std::string command = cxx ? cxx : "g++";
    command += " -std=c++17 -O2 -fPIC -shared -fsanitize=address -fno-omit-frame-pointer "
               "-ffp-contract=off -fno-fast-math -fvisibility=hidden -Wno-unused -I" + quote(include);
    for (const auto& f : flags) command += " " + quote(f);
    // The key covers the command, the source and the prelude headers.
    std::string key = command + "\n" + cpp;
    for (const char* h : {"cuda_emu_prelude.h", "cuda_emu.h", "cuda_bf16.h"}) {
        key += read_file(include + "/" + h);
    }
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx", (unsigned long long)fnv1a(key));
    const std::string dir = cache_dir();
    *library = dir + "/" + hash + ".so";
    if (access(library->c_str(), R_OK) == 0) return true;
    make_dirs(dir);
    static std::atomic<unsigned> counter{0};
    const std::string tmp = dir + "/" + hash + ".tmp" + std::to_string(getpid()) + "-" +
                            std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id())) +
                            "-" + std::to_string(counter++);
    const std::string source = tmp + ".cpp";
    std::ofstream(source) << cpp;
    command += " -x c++ " + quote(source) + " -o " + quote(tmp + ".so") + " -L" + quote(lib) +
               " -l:libcuda.so.1 -Wl,-rpath," + quote(lib) + " 2>&1";
    // The compiler must not inherit the sanitizer preloaded into this process.
    std::string run = "env -u LD_PRELOAD " + command;
    FILE* pipe = popen(run.c_str(), "r");
    if (pipe == nullptr) {
        *log = "cuda-emu: could not run the host compiler: " + command;
        return false;
    }
    char buf[4096];
    log->clear();
    for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) log->append(buf, n);
    int status = pclose(pipe);
    unlink(source.c_str());
    if (status != 0) {
        unlink((tmp + ".so").c_str());
        *log = "cuda-emu: the host compiler failed (" + command + "):\n" + *log;
        return false;
    }
    if (rename((tmp + ".so").c_str(), library->c_str()) != 0) {
        *log = "cuda-emu: could not write " + *library;
        return false;
    }
    return true;
}

}  // namespace cuemu
