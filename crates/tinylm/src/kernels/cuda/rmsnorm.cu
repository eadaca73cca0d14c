// RMSNorm: out = x / sqrt(mean(x²) + eps) ⊙ g, statistics in f32, the gain read
// from the f32 master copy. CPU twin: kernels/cpu/rmsnorm.rs.

/// out (N, C), rstd (N) f32 = 1 / sqrt(mean(x²) + eps) from x (N, C), g (C) f32.
/// Launch: grid ceil(N / 8), block 256; one warp per row.
extern "C" __global__ void rmsnorm_forward(floatX* out, float* rstd, const floatX* x,
                                           const float* g, int n, int c, float eps) {
    const int row = warp_row(n);
    if (row < 0) {
        return;
    }
    const int lane = threadIdx.x % WARP_SIZE;
    const floatX* xr = x + (size_t)row * c;
    floatX* outr = out + (size_t)row * c;
    float sum_sq = 0.0f;
    for (int i = lane; i < c; i += WARP_SIZE) {
        const float v = to_f32(xr[i]);
        sum_sq += v * v;
    }
    sum_sq = warp_sum(sum_sq);
    const float r = 1.0f / sqrtf(sum_sq / c + eps);
    for (int i = lane; i < c; i += WARP_SIZE) {
        outr[i] = to_x(to_f32(xr[i]) * r * g[i]);
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
                                               int accumulate) {
    const int row = warp_row(n);
    if (row < 0) {
        return;
    }
    const int lane = threadIdx.x % WARP_SIZE;
    const size_t base = (size_t)row * c;
    float dot = 0.0f;
    for (int i = lane; i < c; i += WARP_SIZE) {
        dot += to_f32(dout[base + i]) * g[i] * to_f32(x[base + i]);
    }
    dot = warp_sum(dot);
    const float r = rstd[row];
    const float k = dot * r * r / c;
    for (int i = lane; i < c; i += WARP_SIZE) {
        float v = r * (to_f32(dout[base + i]) * g[i] - to_f32(x[base + i]) * k);
        if (accumulate) {
            v += to_f32(dx[base + i]);
        }
        dx[base + i] = to_x(v);
    }
}

/// The gain gradient, stage 1 of 2 (deterministic, no atomics):
/// partial (gridDim.y, C) f32 = Σ over this block's rows of dout ⊙ x · rstd.
/// Launch: grid (ceil(C / 32), ROW_BLOCKS), block (32, 8): each block owns 32
/// columns and rows y, y + ROW_BLOCKS, ...; its 8 thread rows are summed in order.
extern "C" __global__ void rmsnorm_backward_dg_partial(float* partial, const floatX* dout,
                                                       const floatX* x, const float* rstd,
                                                       int n, int c) {
    __shared__ float column_sums[8][WARP_SIZE];
    const int col = blockIdx.x * WARP_SIZE + threadIdx.x;
    float sum = 0.0f;
    if (col < c) {
        for (int row = blockIdx.y * blockDim.y + threadIdx.y; row < n;
             row += gridDim.y * blockDim.y) {
            const size_t i = (size_t)row * c + col;
            sum += to_f32(dout[i]) * to_f32(x[i]) * rstd[row];
        }
    }
    column_sums[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && col < c) {
        for (int y = 1; y < blockDim.y; y++) {
            sum += column_sums[y][threadIdx.x];
        }
        partial[(size_t)blockIdx.y * c + col] = sum;
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
