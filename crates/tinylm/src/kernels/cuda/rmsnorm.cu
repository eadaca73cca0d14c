// RMSNorm: out = x / sqrt(mean(x²) + eps) ⊙ g, statistics in f32, the gain read
// from the f32 master copy. CPU twin: kernels/cpu/rmsnorm.rs.
//
// Every kernel reads and writes its rows, and the f32 gain, in 16-byte packs
// (`packed`, when C is a multiple of PACK and the buffers are 16-byte aligned; else
// one value at a time): the step is bound by memory, and a warp of 2-byte bf16
// accesses moves a quarter of what it could. A lane takes `width` (PACK or 1)
// consecutive values at a time.

/// out (N, C), rstd (N) f32 = 1 / sqrt(mean(x²) + eps) from x (N, C), g (C) f32.
/// Launch: grid ceil(N / 8), block 256; one warp per row.
extern "C" __global__ void rmsnorm_forward(floatX* out, float* rstd, const floatX* x,
                                           const float* g, int n, int c, float eps,
                                           int packed) {
    const int row = warp_row(n);
    if (row < 0) {
        return;
    }
    const int lane = threadIdx.x % WARP_SIZE;
    const int width = packed ? PACK : 1;
    const floatX* xr = x + (size_t)row * c;
    floatX* outr = out + (size_t)row * c;
    float v[PACK], gv[PACK];
    float sum_sq = 0.0f;
    for (int i = lane * width; i < c; i += WARP_SIZE * width) {
        load_pack(v, xr + i, packed);
#pragma unroll
        for (int k = 0; k < PACK; k++) {
            sum_sq += k < width ? v[k] * v[k] : 0.0f;
        }
    }
    sum_sq = warp_sum(sum_sq);
    const float r = 1.0f / sqrtf(sum_sq / c + eps);
    for (int i = lane * width; i < c; i += WARP_SIZE * width) {
        load_pack(v, xr + i, packed);
        load_f32_pack(gv, g + i, packed);
#pragma unroll
        for (int k = 0; k < PACK; k++) {
            v[k] = k < width ? v[k] * r * gv[k] : 0.0f;
        }
        store_pack(outr + i, v, packed);
    }
    if (lane == 0) {
        rstd[row] = r;
    }
}

/// The backward's shared column sums, 48 KiB (all a block has without opting in to
/// more): rows of up to this C, with one warp a block (`MAX_WIDTH` in rmsnorm.rs).
#define COLUMN_SUMS 12288

/// The input gradient of rmsnorm_forward and the first of its gain gradient's two
/// stages, in one pass over dout and x (deterministic, no atomics). With
/// dot = Σ dout⊙g⊙x, dx (N, C) = rstd · (dout⊙g − x · dot·rstd²/C), overwritten,
/// or added to dx when `accumulate` (the residual stream); and
/// partial (gridDim.x, C) f32 = Σ over this block's rows of dout ⊙ x · rstd.
/// Launch: grid at most ROW_BLOCKS, block 32·W with W·C ≤ COLUMN_SUMS: warp w of
/// block b takes rows b·W + w, then every gridDim.x·W rows, adding its column sums
/// to its own row of the shared (W, C) sums; the block adds its W rows in order.
/// A warp's row of sums keeps value k of every pack in a run of its own, at
/// k·packs + p for pack p: the 32 lanes, adding their packs' value k at once,
/// touch 32 consecutive banks. Four blocks of 48 KiB share a multiprocessor, so the
/// registers are capped to let four run (62 in bf16 on sm_90, no spill; 68 uncapped).
extern "C" __global__ void __launch_bounds__(256, 4)
    rmsnorm_backward(floatX* dx, float* partial, const floatX* dout, const floatX* x,
                     const float* g, const float* rstd, int n, int c, int accumulate,
                     int packed) {
    __shared__ float column_sums[COLUMN_SUMS];
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    const int width = packed ? PACK : 1;
    const int packs = c / width;
    float* sums = column_sums + (size_t)warp * c;
    for (int i = lane; i < c; i += WARP_SIZE) {
        sums[i] = 0.0f;
    }
    __syncwarp();
    float dy[PACK], xv[PACK], gv[PACK], acc[PACK];
    for (int row = blockIdx.x * warps + warp; row < n; row += gridDim.x * warps) {
        const size_t base = (size_t)row * c;
        float dot = 0.0f;
        for (int i = lane * width; i < c; i += WARP_SIZE * width) {
            load_pack(dy, dout + base + i, packed);
            load_pack(xv, x + base + i, packed);
            load_f32_pack(gv, g + i, packed);
#pragma unroll
            for (int k = 0; k < PACK; k++) {
                dot += k < width ? dy[k] * gv[k] * xv[k] : 0.0f;
            }
        }
        dot = warp_sum(dot);
        const float r = rstd[row];
        const float scale = dot * r * r / c;
        for (int p = lane; p < packs; p += WARP_SIZE) {
            const int i = p * width;
            load_pack(dy, dout + base + i, packed);
            load_pack(xv, x + base + i, packed);
            load_f32_pack(gv, g + i, packed);
            if (accumulate) {
                load_pack(acc, dx + base + i, packed);
            }
#pragma unroll
            for (int k = 0; k < PACK; k++) {
                if (k < width) {
                    sums[k * packs + p] += dy[k] * xv[k] * r;
                }
                float v = k < width ? r * (dy[k] * gv[k] - xv[k] * scale) : 0.0f;
                if (accumulate) {
                    v += acc[k];
                }
                dy[k] = v;
            }
            store_pack(dx + base + i, dy, packed);
        }
    }
    __syncthreads();
    for (int at = threadIdx.x; at < c; at += blockDim.x) {
        float sum = 0.0f;
        for (int w = 0; w < warps; w++) {
            sum += column_sums[(size_t)w * c + at];
        }
        const int col = at % packs * width + at / packs;
        partial[(size_t)blockIdx.x * c + col] = sum;
    }
}

/// Rows of partial sums a thread of the gain gradient's second stage adds.
#define DG_SLICES 32

/// The gain gradient, stage 2 of 2: dg (C) f32 += Σ_y partial (row_blocks, C), in
/// a fixed order: thread (x, y) of a block adds rows y, y + DG_SLICES, ... of column
/// 32·blockIdx.x + x, then thread (x, 0) adds the DG_SLICES sums in order.
/// Launch: grid ceil(C / 32), block (32, DG_SLICES).
extern "C" __global__ void rmsnorm_backward_dg_finish(float* dg, const float* partial,
                                                      int row_blocks, int c) {
    __shared__ float slice_sums[DG_SLICES][WARP_SIZE + 1];
    const int col = blockIdx.x * WARP_SIZE + threadIdx.x;
    float sum = 0.0f;
    if (col < c) {
        for (int y = threadIdx.y; y < row_blocks; y += DG_SLICES) {
            sum += partial[(size_t)y * c + col];
        }
    }
    slice_sums[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && col < c) {
        for (int y = 1; y < DG_SLICES; y++) {
            sum += slice_sums[y][threadIdx.x];
        }
        dg[col] += sum;
    }
}
