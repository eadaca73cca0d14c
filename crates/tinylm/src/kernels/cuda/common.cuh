// Prepended to every kernel family (`*.cu`) before NVRTC compiles it: the
// activation type, conversions and the warp/block reductions.
//
// `floatX` is the activation and matmul-operand type: `__nv_bfloat16` when the
// source is compiled with `-DTINYLM_BF16` (`--precision bf16`), else `float`
// (`--precision fp32`). Parameters (the f32 master copy), gradients of parameters,
// AdamW moments, RMSNorm statistics, RoPE tables and losses are always `float`;
// every reduction accumulates in `float` (or `double` where the CPU uses `f64`).

#ifdef TINYLM_BF16
#include <cuda_bf16.h>
typedef __nv_bfloat16 floatX;
__device__ __forceinline__ float to_f32(floatX x) { return __bfloat162float(x); }
__device__ __forceinline__ floatX to_x(float x) { return __float2bfloat16_rn(x); }
#else
typedef float floatX;
__device__ __forceinline__ float to_f32(floatX x) { return x; }
__device__ __forceinline__ floatX to_x(float x) { return x; }
#endif

/// 16 bytes of T in one access: 8 bf16, or 4 f32.
template <typename T>
struct alignas(16) Packed {
    T v[16 / sizeof(T)];
};

/// floatX values in one 16-byte access: 8 in bf16, 4 in f32. A row whose length
/// is a multiple of PACK, starting 16-byte aligned, is read and written in packs.
#define PACK (16 / (int)sizeof(floatX))
typedef Packed<floatX> Pack;
typedef Packed<float> F32Pack;

/// v[0..PACK) = the pack at p as f32 when `packed`, else v[0] = *p.
__device__ __forceinline__ void load_pack(float (&v)[PACK], const floatX* p, int packed) {
    if (packed) {
        const Pack q = *reinterpret_cast<const Pack*>(p);
#pragma unroll
        for (int k = 0; k < PACK; k++) {
            v[k] = to_f32(q.v[k]);
        }
    } else {
        v[0] = to_f32(*p);
    }
}

/// v[0..PACK) = the PACK f32 at p (16-byte aligned) in 16-byte loads when `packed`,
/// else v[0] = *p: f32 values (a gain, a master-weight row) beside a floatX pack.
__device__ __forceinline__ void load_f32_pack(float (&v)[PACK], const float* p, int packed) {
    if (packed) {
#pragma unroll
        for (int h = 0; h < PACK; h += 4) {
            const F32Pack q = reinterpret_cast<const F32Pack*>(p)[h / 4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                v[h + k] = q.v[k];
            }
        }
    } else {
        v[0] = *p;
    }
}

/// The pack at p = v[0..PACK) rounded to floatX when `packed`, else *p = v[0].
__device__ __forceinline__ void store_pack(floatX* p, const float (&v)[PACK], int packed) {
    if (packed) {
        Pack q;
#pragma unroll
        for (int k = 0; k < PACK; k++) {
            q.v[k] = to_x(v[k]);
        }
        *reinterpret_cast<Pack*>(p) = q;
    } else {
        *p = to_x(v[0]);
    }
}

#ifdef TINYLM_BF16
/// Two bf16 as one 32-bit register, the first in the low half (tensor-core operands).
__device__ __forceinline__ unsigned pair_of(floatX lo, floatX hi) {
    return (unsigned)__bfloat16_as_ushort(lo) | (unsigned)__bfloat16_as_ushort(hi) << 16;
}

/// c (16×8) += a (16×16) · b (16×8) on the tensor cores, bf16 operands and f32
/// accumulation (`mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`). Each lane
/// 4g + q (g = lane / 4, q = lane % 4) holds, by the PTX ISA's fragment layout, two
/// values a register, the lower column (or row of b) in the low half:
///   a[0] = A[g][2q, 2q+1], a[1] = A[g+8][2q, 2q+1], a[2] = A[g][2q+8, 2q+9],
///   a[3] = A[g+8][2q+8, 2q+9];  b[0] = B[2q, 2q+1][g], b[1] = B[2q+8, 2q+9][g];
///   c[0], c[1] = C[g][2q], C[g][2q+1];  c[2], c[3] = C[g+8][2q], C[g+8][2q+1].
/// The whole warp calls it together.
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], const unsigned (&a)[4],
                                            const unsigned (&b)[2]) {
#ifdef CUDA_EMU
    cuemu_mma_m16n8k16_bf16(c, a, b);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/// r = N 8×8 tiles of bf16 from shared memory (`ldmatrix.sync.aligned.m8n8.x{N}
/// [.trans].shared.b16`, N = 2 or 4): tile m's row r at the address lane 8m + r
/// passes, 16-byte aligned. Lane 4g + q receives of tile m its row g, columns 2q and
/// 2q + 1, or with TRANS its rows 2q and 2q + 1 at column g: the A and B fragments
/// of `mma_16x8x16`, each from one instruction where 32-bit loads took two to four
/// and 16-bit ones (a B operand stored by rows) four. The whole warp calls it.
template <int N, bool TRANS>
__device__ __forceinline__ void load_tiles(unsigned (&r)[N], const floatX* row) {
#ifdef CUDA_EMU
    cuemu_ldmatrix_b16<N, TRANS>(r, row, __FILE__, __LINE__);
#else
    static_assert(N == 2 || N == 4, "ldmatrix takes 1, 2 or 4 tiles; 2 or 4 here");
    const unsigned at = (unsigned)__cvta_generic_to_shared(row);
    if constexpr (N == 4 && !TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(at));
    } else if constexpr (N == 4) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(at));
    } else if constexpr (!TRANS) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                     : "=r"(r[0]), "=r"(r[1])
                     : "r"(at));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                     : "=r"(r[0]), "=r"(r[1])
                     : "r"(at));
    }
#endif
}
#endif

/// log2(e): e^x = 2^(x·LOG2E), the base every exponential here is taken in.
#define LOG2E 1.4426950408889634f

/// 2^x on the special-function unit (`ex2.approx.ftz.f32`, within 2 ulp, a result
/// below 2^-126 flushed to 0): one instruction where exp2f, which keeps subnormal
/// results, takes four. Every softmax here exponentiates in base 2 with it.
__device__ __forceinline__ float exp2_approx(float x) {
#ifdef CUDA_EMU
    return exp2f(x);
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#endif
}

#define WARP_SIZE 32
#define FULL_MASK 0xffffffffu
#define FLT_LOWEST (-3.402823466e38f)

template <typename T>
__device__ __forceinline__ T warp_sum(T x) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        x += __shfl_xor_sync(FULL_MASK, x, offset);
    }
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, offset));
    }
    return x;
}

/// `warp_reduce` (warp_sum, warp_max) over the block (blockDim.x a multiple of 32, at
/// most 1024), returned to every thread; `identity` fills the lanes past the last
/// warp. The order is fixed, so the result is deterministic. Ends with a barrier,
/// so it may be called again at once.
template <typename T, typename WarpReduce>
__device__ __forceinline__ T block_reduce(T x, T identity, WarpReduce warp_reduce) {
    __shared__ T partial[WARP_SIZE];
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    x = warp_reduce(x);
    if (lane == 0) {
        partial[warp] = x;
    }
    __syncthreads();
    x = warp_reduce(lane < warps ? partial[lane] : identity);
    __syncthreads();
    return x;
}

/// The sum over the block (block_reduce).
template <typename T>
__device__ __forceinline__ T block_sum(T x) {
    return block_reduce(x, T(0), warp_sum<T>);
}

/// The maximum over the block (block_reduce).
__device__ __forceinline__ float block_max(float x) {
    return block_reduce(x, FLT_LOWEST, warp_max);
}

/// The row of a one-warp-per-row kernel (`-1` past the last row) and the lane.
__device__ __forceinline__ int warp_row(int rows) {
    const int row = blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    return row < rows ? row : -1;
}

/// The global index of this thread in a one-thread-per-element launch.
__device__ __forceinline__ size_t thread_index() {
    return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}

/// The step of a grid-stride loop.
__device__ __forceinline__ size_t grid_stride() {
    return (size_t)gridDim.x * blockDim.x;
}
