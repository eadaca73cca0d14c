// The prelude the emulated NVRTC puts before a kernel family's CUDA C: it gives
// the CUDA language its meaning on the CPU. Each GPU thread is a fiber of the
// emulated driver; `__syncthreads` and the warp collectives are real rendezvous of
// those fibers (a barrier some thread never reaches is a fault, not a hang);
// `__shared__` storage is per block; floating-point operations are IEEE single
// or double, rounded per operation (the module is compiled without FMA
// contraction), like the `__f*_rn` intrinsics.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "cuda_emu.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
// One block runs at a time on each host thread, so thread-local storage is the
// block's shared memory; the block executor poisons the module's whole
// thread-local storage at each block's start, so a module has no other.
#define __shared__ static thread_local
#define __constant__ static const

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1)
        : x(x_), y(y_), z(z_) {}
    constexpr dim3(cuemu_uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
typedef cuemu_uint3 uint3;

#define threadIdx (cuemu_self()->thread_idx)
#define blockIdx (cuemu_self()->block_idx)
#define blockDim (cuemu_self()->block_dim)
#define gridDim (cuemu_self()->grid_dim)
#define warpSize 32

#define __syncthreads() cuemu_syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) \
    ((void)cuemu_warp(CUEMU_SYNCWARP, cuemu_mask(__VA_ARGS__), 0, 0, 32, __FILE__, __LINE__))
#define __trap() cuemu_kernel_fault(__FILE__, __LINE__, "__trap()")
#define assert(cond) \
    ((cond) ? (void)0 : cuemu_kernel_fault(__FILE__, __LINE__, "assertion failed: " #cond))

static inline unsigned int cuemu_mask(unsigned int mask = 0xffffffffu) { return mask; }

// ---- Warp collectives: the value travels as its bits.

template <typename T>
static inline uint64_t cuemu_bits(T v) {
    static_assert(sizeof(T) <= 8, "a shuffled value is at most 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    return bits;
}

template <typename T>
static inline T cuemu_from_bits(uint64_t bits) {
    T v;
    std::memcpy(&v, &bits, sizeof(T));
    return v;
}

#define CUEMU_SHUFFLE(name, op)                                                         \
    template <typename T>                                                               \
    static inline T cuemu_##name(unsigned int mask, T v, int arg, int width,            \
                                 const char* file, int line) {                          \
        return cuemu_from_bits<T>(cuemu_warp(op, mask, cuemu_bits(v), arg, width, file, \
                                             line));                                    \
    }
CUEMU_SHUFFLE(shfl_sync, CUEMU_SHFL_IDX)
CUEMU_SHUFFLE(shfl_xor_sync, CUEMU_SHFL_XOR)
CUEMU_SHUFFLE(shfl_down_sync, CUEMU_SHFL_DOWN)
CUEMU_SHUFFLE(shfl_up_sync, CUEMU_SHFL_UP)
#undef CUEMU_SHUFFLE

#define CUEMU_WIDTH(w, ...) w
#define __shfl_sync(mask, v, lane, ...) \
    cuemu_shfl_sync(mask, v, lane, CUEMU_WIDTH(__VA_ARGS__ __VA_OPT__(, ) 32), __FILE__, __LINE__)
#define __shfl_xor_sync(mask, v, lane_mask, ...)                                         \
    cuemu_shfl_xor_sync(mask, v, lane_mask, CUEMU_WIDTH(__VA_ARGS__ __VA_OPT__(, ) 32), \
                        __FILE__, __LINE__)
#define __shfl_down_sync(mask, v, delta, ...)                                         \
    cuemu_shfl_down_sync(mask, v, delta, CUEMU_WIDTH(__VA_ARGS__ __VA_OPT__(, ) 32), \
                         __FILE__, __LINE__)
#define __shfl_up_sync(mask, v, delta, ...) \
    cuemu_shfl_up_sync(mask, v, delta, CUEMU_WIDTH(__VA_ARGS__ __VA_OPT__(, ) 32), __FILE__, __LINE__)
#define __ballot_sync(mask, pred) \
    ((unsigned int)cuemu_warp(CUEMU_BALLOT, mask, (pred) != 0, 0, 32, __FILE__, __LINE__))
#define __any_sync(mask, pred) (__ballot_sync(mask, pred) != 0u)
#define __all_sync(mask, pred) (__ballot_sync(mask, pred) == (mask))

// ---- Atomics (blocks run in parallel on host threads).

template <typename T>
static inline T atomicAdd(T* address, T value) {
    if constexpr (std::is_integral<T>::value) {
        return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);
    } else {
        T old;
        __atomic_load(address, &old, __ATOMIC_RELAXED);
        T desired;
        do {
            desired = old + value;
        } while (!__atomic_compare_exchange(address, &old, &desired, false, __ATOMIC_RELAXED,
                                            __ATOMIC_RELAXED));
        return old;
    }
}
/// Replaces `*address` by `value` while `value` is `better` than it; the old value.
template <typename T, typename Better>
static inline T cuemu_atomic_keep(T* address, T value, Better better) {
    T old = *address;
    while (better(value, old) &&
           !__atomic_compare_exchange(address, &old, &value, false, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
    }
    return old;
}
template <typename T>
static inline T atomicMax(T* address, T value) {
    return cuemu_atomic_keep(address, value, [](T a, T b) { return a > b; });
}
template <typename T>
static inline T atomicMin(T* address, T value) {
    return cuemu_atomic_keep(address, value, [](T a, T b) { return a < b; });
}
template <typename T>
static inline T atomicExch(T* address, T value) {
    T old;
    __atomic_exchange(address, &value, &old, __ATOMIC_RELAXED);
    return old;
}
template <typename T>
static inline T atomicCAS(T* address, T compare, T value) {
    __atomic_compare_exchange(address, &compare, &value, false, __ATOMIC_RELAXED,
                              __ATOMIC_RELAXED);
    return compare;
}
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---- Math: the C library's functions, and the intrinsics as single IEEE operations.

using std::max;
using std::min;
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
static inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
#define __expf(x) std::exp((float)(x))
#define __logf(x) std::log((float)(x))
#define __sinf(x) std::sin((float)(x))
#define __cosf(x) std::cos((float)(x))
#define __powf(x, y) std::pow((float)(x), (float)(y))
static inline float __fdividef(float x, float y) { return x / y; }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fsqrt_rn(float a) { return std::sqrt(a); }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __dsqrt_rn(double a) { return std::sqrt(a); }
static inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
static inline float __double2float_rn(double a) { return (float)a; }
static inline int __float_as_int(float x) { return cuemu_from_bits<int>(cuemu_bits(x)); }
static inline float __int_as_float(int x) { return cuemu_from_bits<float>(cuemu_bits(x)); }
static inline unsigned int __float_as_uint(float x) { return cuemu_from_bits<unsigned int>(cuemu_bits(x)); }
static inline float __uint_as_float(unsigned int x) { return cuemu_from_bits<float>(cuemu_bits(x)); }
template <typename T>
static inline T __ldg(const T* p) { return *p; }

// ---- The tensor cores' `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`, by
// the PTX ISA's fragment layout (lane 4g + q; see `mma_16x8x16` in tinylm's
// common.cuh): each lane gathers rows g and g + 8 of A and columns 2q and 2q + 1 of
// B from the lanes that hold them, by real shuffles of the whole warp, and sums its
// four outputs' 16 products in f32 in order (the hardware's order and intermediate
// precision are its own).
#define CUDA_EMU 1
static inline float cuemu_bf16_bits(unsigned bits) { return __uint_as_float(bits << 16); }
static inline void cuemu_mma_m16n8k16_bf16(float (&c)[4], const unsigned (&a)[4],
                                           const unsigned (&b)[2]) {
    const int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    float arow[2][16], bcol[2][16];
    for (int src = 0; src < 4; src++) {
        // Lane 4g + src holds A's rows g, g + 8 at columns 2src, 2src + 1 (+ 8).
        for (int r = 0; r < 4; r++) {
            const unsigned v = __shfl_sync(0xffffffffu, a[r], 4 * g + src);
            const int row = r & 1, col = 2 * src + 8 * (r >> 1);
            arow[row][col] = cuemu_bf16_bits(v & 0xffffu);
            arow[row][col + 1] = cuemu_bf16_bits(v >> 16);
        }
        // Lane 4n + src holds B's column n at rows 2src, 2src + 1 (+ 8).
        for (int n = 0; n < 2; n++) {
            for (int r = 0; r < 2; r++) {
                const unsigned v = __shfl_sync(0xffffffffu, b[r], 4 * (2 * q + n) + src);
                const int k = 2 * src + 8 * r;
                bcol[n][k] = cuemu_bf16_bits(v & 0xffffu);
                bcol[n][k + 1] = cuemu_bf16_bits(v >> 16);
            }
        }
    }
    for (int i = 0; i < 4; i++) {
        float sum = c[i];
        for (int k = 0; k < 16; k++) {
            sum += arow[i >> 1][k] * bcol[i & 1][k];
        }
        c[i] = sum;
    }
}

// ---- `ldmatrix.sync.aligned.m8n8.x{N}[.trans].shared.b16`: N 8×8 tiles of 16-bit
// values, tile m's row r at the address lane 8m + r gives (16-byte aligned, a fault
// otherwise). Lane 4g + q receives of tile m its row g at columns 2q, 2q + 1, or
// with TRANS its rows 2q, 2q + 1 at column g, the first in the low half: the
// fragment layout of the mma above. The row addresses travel by real shuffles of
// the whole warp.
template <int N, bool TRANS>
static inline void cuemu_ldmatrix_b16(unsigned (&r)[N], const void* row, const char* file,
                                      int line) {
    const int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const void* rows[4 * 8];
    for (int i = 0; i < 8 * N; i++) {
        rows[i] = __shfl_sync(0xffffffffu, row, i);
        if (reinterpret_cast<uintptr_t>(rows[i]) % 16 != 0) {
            cuemu_kernel_fault(file, line, "ldmatrix: a row address not 16-byte aligned");
        }
    }
    for (int m = 0; m < N; m++) {
        uint16_t lo, hi;
        if (TRANS) {
            std::memcpy(&lo, static_cast<const uint16_t*>(rows[8 * m + 2 * q]) + g, 2);
            std::memcpy(&hi, static_cast<const uint16_t*>(rows[8 * m + 2 * q + 1]) + g, 2);
        } else {
            std::memcpy(&lo, static_cast<const uint16_t*>(rows[8 * m + g]) + 2 * q, 2);
            std::memcpy(&hi, static_cast<const uint16_t*>(rows[8 * m + g]) + 2 * q + 1, 2);
        }
        r[m] = unsigned(lo) | unsigned(hi) << 16;
    }
}

// ---- What the driver needs of each kernel: its parameters and an entry that
// unpacks the launch's `void**` into a call.

template <typename F, F f>
struct cuemu_kernel;

template <typename... P, void (*f)(P...)>
struct cuemu_kernel<void (*)(P...), f> {
    template <size_t... I>
    static void call(void** args, std::index_sequence<I...>) {
        f(*static_cast<std::remove_cv_t<P>*>(args[I])...);
    }
    static void entry(void** args) { call(args, std::index_sequence_for<P...>{}); }
    static constexpr unsigned int sizes[sizeof...(P) + 1] = {(unsigned int)sizeof(P)..., 0};
    static constexpr unsigned char pointers[sizeof...(P) + 1] = {std::is_pointer<P>::value...,
                                                                 0};
    static cuemu_kernel_info info(const char* name) {
        return {name, (int)sizeof...(P), sizes, pointers, &entry};
    }
};

#define CUEMU_KERNEL(name)                                                              \
    extern "C" __attribute__((visibility("default"))) cuemu_kernel_info                 \
        cuemu_kernel_##name() {                                                         \
        return cuemu_kernel<decltype(&name), &name>::info(#name);                       \
    }
