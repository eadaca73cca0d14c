// RMSNorm: out = x / sqrt(mean(x²) + eps) ⊙ g, statistics in f32, the gain read
// from the f32 master copy. CPU twin: kernels/cpu/rmsnorm.rs.
//
// Every kernel reads and writes its rows in 16-byte packs (`packed`, when C is a
// multiple of PACK and the buffers are 16-byte aligned; else one value at a time):
// the step is bound by memory, and a warp of 2-byte bf16 accesses moves a quarter
// of what it could. A lane takes `width` (PACK or 1) consecutive values at a time.

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
    float v[PACK];
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
#pragma unroll
        for (int k = 0; k < PACK; k++) {
            v[k] = k < width ? v[k] * r * g[i + k] : 0.0f;
        }
        store_pack(outr + i, v, packed);
    }
    if (lane == 0) {
        rstd[row] = r;
    }
}

/// The input gradient of rmsnorm_forward: with dot = Σ dout⊙g⊙x,
/// dx (N, C) = rstd · (dout⊙g − x · dot·rstd²/C), overwritten, or added to dx
/// when `accumulate` (the residual stream).
/// Launch: grid ceil(N / 8), block 256; one warp per row.
extern "C" __global__ void rmsnorm_backward_dx(floatX* dx, const floatX* dout, const floatX* x,
                                               const float* g, const float* rstd, int n, int c,
                                               int accumulate, int packed) {
    const int row = warp_row(n);
    if (row < 0) {
        return;
    }
    const int lane = threadIdx.x % WARP_SIZE;
    const int width = packed ? PACK : 1;
    const size_t base = (size_t)row * c;
    float dy[PACK], xv[PACK], acc[PACK];
    float dot = 0.0f;
    for (int i = lane * width; i < c; i += WARP_SIZE * width) {
        load_pack(dy, dout + base + i, packed);
        load_pack(xv, x + base + i, packed);
#pragma unroll
        for (int k = 0; k < PACK; k++) {
            dot += k < width ? dy[k] * g[i + k] * xv[k] : 0.0f;
        }
    }
    dot = warp_sum(dot);
    const float r = rstd[row];
    const float scale = dot * r * r / c;
    for (int i = lane * width; i < c; i += WARP_SIZE * width) {
        load_pack(dy, dout + base + i, packed);
        load_pack(xv, x + base + i, packed);
        if (accumulate) {
            load_pack(acc, dx + base + i, packed);
        }
#pragma unroll
        for (int k = 0; k < PACK; k++) {
            float v = k < width ? r * (dy[k] * g[i + k] - xv[k] * scale) : 0.0f;
            if (accumulate) {
                v += acc[k];
            }
            dy[k] = v;
        }
        store_pack(dx + base + i, dy, packed);
    }
}

/// Rows of a block of the gain gradient's first stage.
#define DG_ROWS 8

/// The gain gradient, stage 1 of 2 (deterministic, no atomics):
/// partial (gridDim.y, C) f32 = Σ over this block's rows of dout ⊙ x · rstd.
/// Launch: grid (ceil(C / (32·width)), ROW_BLOCKS), block (32, DG_ROWS): each block
/// owns 32·width columns (a lane `width` of them) and rows y, y + ROW_BLOCKS·DG_ROWS,
/// ... per thread row; its DG_ROWS thread rows are summed in order.
extern "C" __global__ void rmsnorm_backward_dg_partial(float* partial, const floatX* dout,
                                                       const floatX* x, const float* rstd,
                                                       int n, int c, int packed) {
    __shared__ float column_sums[DG_ROWS][WARP_SIZE * PACK];
    const int width = packed ? PACK : 1;
    const int col = (blockIdx.x * WARP_SIZE + threadIdx.x) * width;
    float dy[PACK], xv[PACK], sum[PACK];
#pragma unroll
    for (int k = 0; k < PACK; k++) {
        sum[k] = 0.0f;
    }
    if (col < c) {
        for (int row = blockIdx.y * blockDim.y + threadIdx.y; row < n;
             row += gridDim.y * blockDim.y) {
            const size_t i = (size_t)row * c + col;
            load_pack(dy, dout + i, packed);
            load_pack(xv, x + i, packed);
            const float r = rstd[row];
#pragma unroll
            for (int k = 0; k < PACK; k++) {
                sum[k] += k < width ? dy[k] * xv[k] * r : 0.0f;
            }
        }
    }
#pragma unroll
    for (int k = 0; k < PACK; k++) {
        column_sums[threadIdx.y][threadIdx.x * PACK + k] = sum[k];
    }
    __syncthreads();
    if (threadIdx.y == 0 && col < c) {
        for (int y = 1; y < blockDim.y; y++) {
#pragma unroll
            for (int k = 0; k < PACK; k++) {
                sum[k] += column_sums[y][threadIdx.x * PACK + k];
            }
        }
        for (int k = 0; k < width; k++) {
            partial[(size_t)blockIdx.y * c + col + k] = sum[k];
        }
    }
}

/// The gain gradient, stage 2 of 2: dg (C) f32 += Σ_y partial (row_blocks, C), in order.
/// Launch: grid ceil(C / 256), block 256; one thread per column.
extern "C" __global__ void rmsnorm_backward_dg_finish(float* dg, const float* partial,
                                                      int row_blocks, int c) {
    const int col = thread_index();
    if (col >= c) {
        return;
    }
    float sum = 0.0f;
    for (int y = 0; y < row_blocks; y++) {
        sum += partial[(size_t)y * c + col];
    }
    dg[col] += sum;
}
