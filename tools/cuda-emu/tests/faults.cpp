// Planted faults: each case is a small change to a copy of one of tinylm's real
// kernels (read from crates/tinylm/src/kernels/cuda) or to one of its driver or
// cuBLASLt calls, run on the emulated GPU in a child process. Every case runs
// twice: as written, where its check must pass, and with the fault planted, where
// the emulator (a fault, an AddressSanitizer report, a cuBLASLt rejection) or the
// check against a host reference must catch it. A case whose change no longer
// applies to the kernel's source fails: the suite then needs updating.
//
// Usage: faults KERNEL_DIR   (run under run.sh)

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_api.h"

// cuBLASLt's entry points (as cublasLt.h declares them).
extern "C" {
typedef void* cublasLtHandle_t;
typedef void* cublasLtMatrixLayout_t;
typedef void* cublasLtMatmulDesc_t;
typedef void* cublasLtMatmulPreference_t;
struct cublasLtMatmulAlgo_t {
    uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    int state;
    float wavesCount;
    int reserved[4];
};
int cublasLtCreate(cublasLtHandle_t*);
int cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t*, int, uint64_t, uint64_t, int64_t);
int cublasLtMatmulDescCreate(cublasLtMatmulDesc_t*, int, int);
int cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t, int, const void*, size_t);
int cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t*);
int cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                   cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                   cublasLtMatrixLayout_t, cublasLtMatmulPreference_t, int,
                                   cublasLtMatmulHeuristicResult_t*, int*);
int cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t, const void*, const void*,
                   cublasLtMatrixLayout_t, const void*, cublasLtMatrixLayout_t, const void*,
                   const void*, cublasLtMatrixLayout_t, void*, cublasLtMatrixLayout_t,
                   const cublasLtMatmulAlgo_t*, void*, size_t, CUstream);
}

namespace {

std::string g_kernel_dir;
CUstream g_stream;

std::string read(const std::string& file) {
    std::ifstream in(g_kernel_dir + "/" + file);
    if (!in) {
        std::fprintf(stderr, "cannot read %s/%s\n", g_kernel_dir.c_str(), file.c_str());
        std::_Exit(2);
    }
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

/// `source` with `from` replaced by `to`; `from` must occur exactly once.
std::string plant(const std::string& source, const std::string& from, const std::string& to) {
    size_t at = source.find(from);
    if (at == std::string::npos || source.find(from, at + 1) != std::string::npos) {
        std::fprintf(stderr, "the planted fault no longer applies: \"%s\" is not in the kernel "
                             "exactly once; update tests/faults.cpp\n", from.c_str());
        std::_Exit(2);
    }
    return source.substr(0, at) + to + source.substr(at + from.size());
}

/// A kernel family as tinylm compiles it (fp32, or bf16 with `bf16`): common.cuh
/// (or `common`), then the family.
CUmodule load(const std::string& family, const std::string& source,
              const std::string& common = read("common.cuh"), bool bf16 = false) {
    std::string full = "#line 1 \"common.cuh\"\n" + common + "\n#line 1 \"" + family +
                       ".cu\"\n" + source;
    nvrtcProgram prog;
    nvrtcCreateProgram(&prog, full.c_str(), (family + ".cu").c_str(), 0, nullptr, nullptr);
    const char* options[] = {"--gpu-architecture=compute_90", "--std=c++17", "-DTINYLM_BF16"};
    if (nvrtcCompileProgram(prog, bf16 ? 3 : 2, options) != 0) {
        size_t n;
        nvrtcGetProgramLogSize(prog, &n);
        std::string log(n, '\0');
        nvrtcGetProgramLog(prog, &log[0]);
        std::fprintf(stderr, "%s\n", log.c_str());
        std::_Exit(2);
    }
    size_t n;
    nvrtcGetPTXSize(prog, &n);
    std::string ptx(n, '\0');
    nvrtcGetPTX(prog, &ptx[0]);
    CUmodule module;
    ok(cuModuleLoadData(&module, ptx.c_str()), "cuModuleLoadData");
    return module;
}

CUfunction function(CUmodule m, const char* name) {
    CUfunction f;
    ok(cuModuleGetFunction(&f, m, name), "cuModuleGetFunction");
    return f;
}

template <typename T>
CUdeviceptr upload(const std::vector<T>& host) {
    CUdeviceptr d;
    ok(cuMemAllocAsync(&d, host.size() * sizeof(T), g_stream), "cuMemAllocAsync");
    ok(cuMemcpyHtoDAsync_v2(d, host.data(), host.size() * sizeof(T), g_stream), "upload");
    return d;
}

CUdeviceptr zeros(size_t bytes) {
    CUdeviceptr d;
    ok(cuMemAllocAsync(&d, bytes, g_stream), "cuMemAllocAsync");
    ok(cuMemsetD8Async(d, 0, bytes, g_stream), "memset");
    return d;
}

template <typename T>
std::vector<T> download(CUdeviceptr d, size_t n) {
    std::vector<T> host(n);
    ok(cuMemcpyDtoHAsync_v2(host.data(), d, n * sizeof(T), g_stream), "download");
    return host;
}

void launch(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned block_x, unsigned block_y,
            std::vector<void*> args) {
    ok(cuLaunchKernel(f, grid_x, grid_y, 1, block_x, block_y, 1, 0, g_stream, args.data(), nullptr),
       "cuLaunchKernel");
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol,
                  const char* what) {
    for (size_t i = 0; i < want.size(); i++) {
        if (!(std::fabs(got[i] - want[i]) <= tol * (1.0 + std::fabs(want[i])))) {
            caught(std::string(what) + ": element " + std::to_string(i) + " is " +
                   std::to_string(got[i]) + ", the host reference " + std::to_string(want[i]));
        }
    }
}

/// `x` rounded to bf16 (to nearest, ties to even), as its bits.
uint16_t bf16_bits(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    return uint16_t((bits + 0x7fff + (bits >> 16 & 1)) >> 16);
}

/// The bf16 value of `bits`.
float bf16_value(uint16_t bits) {
    uint32_t f32 = uint32_t(bits) << 16;
    float x;
    std::memcpy(&x, &f32, 4);
    return x;
}

/// The head dimension of the attention cases: attention_forward_d32 pads D to 32.
constexpr int kHeadDim = 32;

std::vector<float> values(size_t n, unsigned seed) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = float(seed >> 8) / float(1 << 24) * 2.0f - 1.0f;
    }
    return v;
}

// ---- The cases: each takes `planted` and returns normally when its check passes.

/// rmsnorm_forward writing one element further: the last row's store passes the end.
void index_off_by_one(bool planted) {
    std::string src = read("rmsnorm.cu");
    if (planted) src = plant(src, "store_pack(outr + i, v, packed);", "store_pack(outr + i + 1, v, packed);");
    CUfunction f = function(load("rmsnorm", src), "rmsnorm_forward");
    int n = 9, c = 40;
    auto x = values(n * c, 1), g = values(c, 2);
    CUdeviceptr dx = upload(x), dg = upload(g), out = zeros(n * c * 4), rstd = zeros(n * 4);
    float eps = 1e-5f;
    int packed = 0;  // one value at a time: the last store is the one past the end
    launch(f, (n + 7) / 8, 1, 256, 1, {&out, &rstd, &dx, &dg, &n, &c, &eps, &packed});
    auto got = download<float>(out, n * c);
    std::vector<float> want(n * c);
    for (int r = 0; r < n; r++) {
        float ss = 0;
        for (int i = 0; i < c; i++) ss += x[r * c + i] * x[r * c + i];
        float k = 1.0f / std::sqrt(ss / c + eps);
        for (int i = 0; i < c; i++) want[r * c + i] = x[r * c + i] * k * g[i];
    }
    expect_close(got, want, 1e-5, "rmsnorm out");
}

/// convert_f32_to_x with `<=`: the last partial block writes one element past the end.
void write_past_the_last_partial_block(bool planted) {
    std::string src = read("convert.cu");
    if (planted) src = plant(src, "if (i < n) {\n        dst[i] = to_x(src[i]);", "if (i <= n) {\n        dst[i] = to_x(src[i]);");
    CUfunction f = function(load("convert", src), "convert_f32_to_x");
    size_t n = 1000;
    auto x = values(n, 3);
    CUdeviceptr src_d = upload(x), dst = zeros(n * 4);
    launch(f, (n + 255) / 256, 1, 256, 1, {&dst, &src_d, &n});
    expect_close(download<float>(dst, n), x, 0, "convert");
}

/// rmsnorm_backward_dg_finish without its barrier: thread row 0 adds the slice sums
/// that rows 1 to 31 (higher-numbered threads) write before the barrier.
void missing_syncthreads_read_after_higher_threads_write(bool planted) {
    std::string src = read("rmsnorm.cu");
    if (planted) src = plant(src, "    __syncthreads();\n    if (threadIdx.y == 0 && col < c) {", "    if (threadIdx.y == 0 && col < c) {");
    CUfunction f = function(load("rmsnorm", src), "rmsnorm_backward_dg_finish");
    int row_blocks = 70, c = 40;
    auto partial = values(row_blocks * c, 4);
    CUdeviceptr dp = upload(partial), dg = zeros(c * 4);
    launch(f, (c + 31) / 32, 1, 32, 32, {&dg, &dp, &row_blocks, &c});
    auto got = download<float>(dg, c);
    std::vector<float> want(c, 0.0f);
    for (int y = 0; y < row_blocks; y++)
        for (int col = 0; col < c; col++) want[col] += partial[y * c + col];
    expect_close(got, want, 1e-4, "gain gradient");
}

/// attention_forward_d32 compiled from `source` (in bf16 with `bf16`) over every
/// query of `qkv` (H heads of T positions, D 32, read in packs): out (T, H·32) as f32.
std::vector<float> attention_forward_d32(const std::string& source, bool bf16, CUdeviceptr qkv,
                                         int t, int h) {
    int tq = t, q0 = 0, d = kHeadDim, packed = 1;
    float scale = 1.0f / std::sqrt(float(d));
    size_t n = size_t(tq) * h * d;
    CUfunction f = function(load("attention", source, read("common.cuh"), bf16), "attention_forward_d32");
    CUdeviceptr out = zeros(n * (bf16 ? 2 : 4)), lse = zeros(h * tq * 4);
    // A block of 4 warps takes 64 query rows of one head.
    launch(f, h, (tq + 63) / 64, 128, 1, {&out, &lse, &qkv, &t, &tq, &q0, &h, &d, &scale, &packed});
    if (!bf16) return download<float>(out, n);
    std::vector<float> got;
    for (uint16_t bits : download<uint16_t>(out, n)) got.push_back(bf16_value(bits));
    return got;
}

/// attention_forward without the barrier that opens each chunk: a warp done with
/// the last chunk (higher-numbered threads) loads the next chunk's keys and values
/// over those a lower warp still reads. The reference is the unchanged kernel, which
/// the numeric suite checks against the CPU.
void missing_syncthreads_write_after_a_lower_thread_reads(bool planted) {
    std::string src = read("attention.cu");
    std::string changed = src;
    if (planted) changed = plant(src, "columns past D zero.\n        __syncthreads();  // every warp is done with the last chunk\n", "columns past D zero.\n");
    // One head of 128 positions (4 chunks of 32 keys), D 32, two blocks of 4 warps.
    int t = 128, h = 1;
    CUdeviceptr qkv = upload(values(t * 3 * kHeadDim, 13));
    expect_close(attention_forward_d32(changed, false, qkv, t, h),
                 attention_forward_d32(src, false, qkv, t, h), 0, "attention out");
}

/// block_reduce (common.cuh) without its trailing barrier, in the cross-entropy,
/// which reduces the row's max and then its sum through the same `partial`: a
/// warp done with the max (its reads of `partial`, five shuffles, its part of the
/// sum, five more) writes its part of the sum over the warps' maxima while a
/// slower warp has yet to read them. Seen only when a warp runs collectives ahead
/// of the others, as each warp alone does.
void block_reduction_reused_without_its_trailing_barrier(bool planted) {
    std::string common = read("common.cuh");
    if (planted) common = plant(common, "partial[lane] : identity);\n    __syncthreads();\n", "partial[lane] : identity);\n");
    CUfunction f = function(load("cross_entropy", read("cross_entropy.cu"), common), "cross_entropy_forward_backward");
    // Four rows, so that the first launch runs two blocks with each warp alone (in
    // both orders): 256 threads over 1,000 logits, in packs of 4.
    int n = 4, v = 1000, grad = 1, packed = 1;
    auto logits = values(n * v, 14);
    for (float& x : logits) x *= 4.0f;
    std::vector<unsigned> targets = {3, 999, 500, 0};
    CUdeviceptr dl = upload(logits), dt = upload(targets), losses = zeros(n * 4);
    launch(f, n, 1, 256, 1, {&dl, &losses, &dt, &n, &v, &grad, &packed});
    std::vector<float> want_loss(n), want_grad(n * v);
    for (int r = 0; r < n; r++) {
        const float* x = &logits[r * v];
        double m = *std::max_element(x, x + v), sum = 0;
        for (int j = 0; j < v; j++) sum += std::exp(double(x[j]) - m);
        want_loss[r] = float(m + std::log(sum) - x[targets[r]]);
        for (int j = 0; j < v; j++) {
            want_grad[r * v + j] = float((std::exp(x[j] - m) / sum - (j == int(targets[r]))) / n);
        }
    }
    expect_close(download<float>(losses, n), want_loss, 1e-5, "loss");
    expect_close(download<float>(dl, n * v), want_grad, 1e-5, "gradient");
}

/// attention_forward in bf16 without the barrier between loading a chunk's keys
/// and values and multiplying by them: a warp's tensor-core operands, which it
/// reads by ldmatrix after the address shuffles, come from rows other warps load.
/// Warps together have all loaded the chunk before any warp's ldmatrix reads a
/// row, after 16 or 32 address shuffles; a warp alone reads rows the others have
/// yet to load. The reference is the unchanged kernel, which the numeric suite
/// checks against the CPU.
void missing_syncthreads_before_tensor_core_operands_other_warps_load(bool planted) {
    std::string src = read("attention.cu");
    std::string changed = src;
    if (planted) changed = plant(src, "keys + c, KC, t - chunk * KC, d, stride, packed);\n        __syncthreads();\n        if (chunk * KC >= warp_keys) {\n            continue;\n        }\n        float s[KC / 8][4];", "keys + c, KC, t - chunk * KC, d, stride, packed);\n        if (chunk * KC >= warp_keys) {\n            continue;\n        }\n        float s[KC / 8][4];");
    // Two heads of 128 positions (4 chunks of 32 keys), D 32: four blocks of 4 warps,
    // two of them with each warp alone.
    int t = 128, h = 2;
    std::vector<uint16_t> bits;
    for (float x : values(t * 3 * h * kHeadDim, 15)) bits.push_back(bf16_bits(x));
    CUdeviceptr qkv = upload(bits);
    expect_close(attention_forward_d32(changed, true, qkv, t, h),
                 attention_forward_d32(src, true, qkv, t, h), 0, "attention out");
}

/// attention_forward in bf16 with the A operand's right-hand tiles 8 bytes into
/// their rows: ldmatrix row addresses must be 16-byte aligned.
void misaligned_ldmatrix_row(bool planted) {
    std::string src = read("attention.cu");
    if (planted) src = plant(src, "lda + 8 * (lane / 16));", "lda + 4 * (lane / 16));");
    int t = 32, h = 1;
    // bf16 ones: every probability 1/(i + 1), every output 1.
    CUdeviceptr qkv = upload(std::vector<uint16_t>(t * 3 * kHeadDim, bf16_bits(1.0f)));
    for (float v : attention_forward_d32(src, true, qkv, t, h)) {
        if (v != 1.0f) caught("attention of ones is not one");
    }
}

/// global_norm_finish returning early from threads without a partial: the block
/// sum's barrier is never reached by them.
void barrier_not_reached_by_every_thread(bool planted) {
    std::string src = read("global_norm.cu");
    if (planted) src = plant(src, "    total = block_sum(total);", "    if (threadIdx.x >= blocks) {\n        return;\n    }\n    total = block_sum(total);");
    CUfunction f = function(load("global_norm", src), "global_norm_finish");
    int blocks = 40;
    std::vector<double> partial(blocks);
    double want = 0;
    for (int i = 0; i < blocks; i++) want += partial[i] = i * 0.5;
    CUdeviceptr dp = upload(partial), sum = zeros(8);
    launch(f, 1, 1, 256, 1, {&sum, &dp, &blocks});
    double got = download<double>(sum, 1)[0];
    if (got != want) caught("sum " + std::to_string(got) + " != " + std::to_string(want));
}

/// rmsnorm_forward letting lanes without a column exit before the warp sum, whose
/// full mask names them.
void shuffle_mask_names_an_exited_lane(bool planted) {
    std::string src = read("rmsnorm.cu");
    if (planted) src = plant(src, "    const int width = packed ? PACK : 1;\n    const floatX* xr", "    const int width = packed ? PACK : 1;\n    if (lane >= c) {\n        return;\n    }\n    const floatX* xr");
    CUfunction f = function(load("rmsnorm", src), "rmsnorm_forward");
    int n = 8, c = 20;
    auto x = values(n * c, 7), g = values(c, 8);
    CUdeviceptr dx = upload(x), dg = upload(g), out = zeros(n * c * 4), rstd = zeros(n * 4);
    float eps = 1e-5f;
    int packed = 0;
    launch(f, 1, 1, 256, 1, {&out, &rstd, &dx, &dg, &n, &c, &eps, &packed});
    auto got = download<float>(rstd, n);
    for (int r = 0; r < n; r++) {
        float ss = 0;
        for (int i = 0; i < c; i++) ss += x[r * c + i] * x[r * c + i];
        expect_close({got[r]}, {1.0f / std::sqrt(ss / c + eps)}, 1e-5, "rstd");
    }
}

/// A kernel input allocated and never written (no upload): it reads poison.
void read_of_memory_never_written(bool planted) {
    CUfunction f = function(load("swiglu", read("swiglu.cu")), "swiglu_forward");
    size_t n = 300;
    auto a = values(n, 9);
    CUdeviceptr da = upload(a), out = zeros(n * 4), null = 0;
    if (planted) ok(cuMemAllocAsync(&da, n * 4, g_stream), "cuMemAllocAsync");
    int packed = 0;
    launch(f, (n + 255) / 256, 1, 256, 1, {&out, &da, &null, &n, &packed});
    auto got = download<float>(out, n);
    std::vector<float> want(n);
    for (size_t i = 0; i < n; i++) want[i] = a[i] / (1.0f + std::exp(-a[i]));
    expect_close(got, want, 1e-5, "silu");
}

/// A queued copy into pinned memory read by the host without waiting for the stream.
void missing_wait_before_a_host_read(bool planted) {
    CUfunction f = function(load("convert", read("convert.cu")), "fill");
    size_t n = 64;
    float value = 2.5f;
    CUdeviceptr d = zeros(n * 4);
    launch(f, 1, 1, 256, 1, {&d, &value, &n});
    float* host;
    ok(cuMemHostAlloc(reinterpret_cast<void**>(&host), n * 4, 0), "cuMemHostAlloc");
    ok(cuMemcpyDtoHAsync_v2(host, d, n * 4, g_stream), "copy to pinned memory");
    if (!planted) ok(cuStreamSynchronize(g_stream), "cuStreamSynchronize");
    expect_close(std::vector<float>(host, host + n), std::vector<float>(n, value), 0, "host copy");
}

/// tinylm's row-major product `out (m, n) = a (m, k) · b (k, n)` as cuBLASLt's
/// column-major `outᵀ = bᵀ aᵀ`, with a fault planted in the call.
void matmul(const char* fault) {
    const int m = 24, k = 24, n = 24;
    auto a = values(m * k, 10), b = values(k * n, 11);
    CUdeviceptr da = upload(a), db = upload(b), out = zeros(m * n * 4);
    cublasLtHandle_t h;
    cublasLtCreate(&h);
    bool transposed = std::strcmp(fault, "transposed operand") == 0;
    int64_t ld_b = std::strcmp(fault, "wrong leading dimension") == 0 ? n + 1 : n;
    cublasLtMatrixLayout_t la, lb, lc;
    // cuBLAS's A is our b: (n, k) column-major, leading dimension n.
    cublasLtMatrixLayoutCreate(&la, 0, n, k, ld_b);
    cublasLtMatrixLayoutCreate(&lb, 0, k, m, k);
    cublasLtMatrixLayoutCreate(&lc, 0, n, m, n);
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, 68, 0);
    int op = transposed ? 1 : 0;
    cublasLtMatmulDescSetAttribute(desc, 3, &op, 4);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t result;
    int count = 0;
    if (int s = cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 1, &result, &count))
        caught("the heuristic rejected the product (status " + std::to_string(s) + ")");
    float alpha = 1, beta = 0;
    if (int s = cublasLtMatmul(h, desc, &alpha, reinterpret_cast<void*>(db), la,
                               reinterpret_cast<void*>(da), lb, &beta, reinterpret_cast<void*>(out), lc,
                               reinterpret_cast<void*>(out), lc, &result.algo, nullptr, 0, g_stream))
        caught("cublasLtMatmul rejected the product (status " + std::to_string(s) + ")");
    auto got = download<float>(out, m * n);
    std::vector<float> want(m * n, 0.0f);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++)
            for (int p = 0; p < k; p++) want[i * n + j] += a[i * k + p] * b[p * n + j];
    expect_close(got, want, 1e-5, "matmul");
}

void wrong_leading_dimension(bool planted) { matmul(planted ? "wrong leading dimension" : ""); }
void transposed_operand(bool planted) { matmul(planted ? "transposed operand" : ""); }

/// A kernel given a buffer already freed (stream-ordered free before the launch).
void use_of_a_freed_buffer(bool planted) {
    CUfunction f = function(load("convert", read("convert.cu")), "fill");
    size_t n = 64;
    float value = 1.0f;
    CUdeviceptr d = zeros(n * 4), other = zeros(n * 4);
    if (planted) ok(cuMemFreeAsync(d, g_stream), "cuMemFreeAsync");
    launch(f, 1, 1, 256, 1, {&d, &value, &n});
    ok(cuStreamSynchronize(g_stream), "cuStreamSynchronize");
    (void)other;
}

struct Case {
    const char* name;
    void (*run)(bool planted);
};

const Case kCases[] = {
    {"an index off by one (rmsnorm_forward stores outr[i + 1])", index_off_by_one},
    {"an out-of-bounds write in the last partial block (convert_f32_to_x with i <= n)", write_past_the_last_partial_block},
    {"a missing __syncthreads before a thread reads what higher-numbered threads wrote (rmsnorm_backward_dg_finish)", missing_syncthreads_read_after_higher_threads_write},
    {"a missing __syncthreads before a higher-numbered thread overwrites what a lower-numbered one reads (attention_forward)", missing_syncthreads_write_after_a_lower_thread_reads},
    {"a block reduction reused without its trailing __syncthreads (cross_entropy_forward_backward's block_max, then block_sum)", block_reduction_reused_without_its_trailing_barrier},
    {"a missing __syncthreads before warps read tensor-core operands that other warps load (attention_forward in bf16)", missing_syncthreads_before_tensor_core_operands_other_warps_load},
    {"a barrier not reached by every thread (global_norm_finish returns early)", barrier_not_reached_by_every_thread},
    {"an ldmatrix row address not 16-byte aligned (attention_forward in bf16)", misaligned_ldmatrix_row},
    {"a shuffle whose mask names an exited lane (rmsnorm_forward)", shuffle_mask_names_an_exited_lane},
    {"a read of device memory never written (swiglu_forward input not uploaded)", read_of_memory_never_written},
    {"a missing wait before a host read (pinned copy read before the stream sync)", missing_wait_before_a_host_read},
    {"a wrong leading dimension (cuBLASLt A with ld n + 1)", wrong_leading_dimension},
    {"a transposed operand (cuBLASLt TRANSA set on a square product)", transposed_operand},
    {"a kernel given a freed buffer (cuMemFreeAsync before the launch)", use_of_a_freed_buffer},
};

/// Runs one case in a child; its exit status and the first line of what it said.
int run_child(const Case& c, bool planted, std::string* said) {
    std::fflush(stdout);
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pipe_fds[1], 1);
        dup2(pipe_fds[1], 2);
        close(pipe_fds[0]);
        cuInit(0);
        CUcontext ctx;
        cuDevicePrimaryCtxRetain(&ctx, 0);
        cuCtxSetCurrent(ctx);
        cuStreamCreate(&g_stream, 1);
        c.run(planted);
        std::fflush(stdout);
        std::_Exit(0);
    }
    close(pipe_fds[1]);
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
    close(pipe_fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    // The most telling line: the emulator's fault, AddressSanitizer's summary, or the check.
    for (const char* key : {"cuda-emu: FAULT", "ERROR: AddressSanitizer", "cuda-emu: cuBLASLt", "check failed"}) {
        size_t at = out.find(key);
        if (at != std::string::npos) {
            *said = out.substr(at, out.find('\n', at) - at);
            break;
        }
    }
    if (said->empty()) *said = out.substr(0, out.find('\n'));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: faults KERNEL_DIR\n");
        return 2;
    }
    g_kernel_dir = argv[1];
    int failures = 0, caught_count = 0;
    for (const Case& c : kCases) {
        std::string clean_said, planted_said;
        int clean = run_child(c, false, &clean_said);
        int planted = run_child(c, true, &planted_said);
        if (clean != 0) {
            std::printf("FAILED  %s: the unchanged case fails (status %d): %s\n", c.name, clean, clean_said.c_str());
            failures++;
        } else if (planted == 0 || planted == 2) {
            std::printf("MISSED  %s: the planted fault went unnoticed (status %d) %s\n", c.name, planted,
                        planted_said.c_str());
            failures++;
        } else {
            std::printf("caught  %s\n        %s\n", c.name, planted_said.c_str());
            caught_count++;
        }
    }
    std::printf("planted faults: %d of %zu caught, every unchanged case passes: %s\n", caught_count,
                sizeof kCases / sizeof kCases[0], failures == 0 ? "yes" : "no");
    return failures == 0 ? 0 : 1;
}
