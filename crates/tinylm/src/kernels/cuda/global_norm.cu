// The sum of squares of a flat f32 buffer (the gradients, for the global norm and
// its clipping), on the device, in f64 like crates/tinylm/src/optim.rs
// `global_norm`, and deterministic: a fixed grid and a fixed summation order.

/// Stage 1 of 2: partial (gridDim.x) f64 = this block's Σ x² over a grid-stride
/// loop of x (n) f32: of 16-byte packs when `packed` (x 16-byte aligned), then of
/// the values after the last whole pack.
/// Launch: grid G (a fixed constant of the caller, the same every step), block 512.
extern "C" __global__ void global_norm_partial(double* partial, const float* x, size_t n,
                                               int packed) {
    const size_t packs = packed ? n / 4 : 0;
    double sum = 0.0;
    for (size_t i = thread_index(); i < packs; i += grid_stride()) {
        const F32Pack q = reinterpret_cast<const F32Pack*>(x)[i];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const double xi = q.v[k];
            sum += xi * xi;
        }
    }
    for (size_t i = 4 * packs + thread_index(); i < n; i += grid_stride()) {
        const double xi = x[i];
        sum += xi * xi;
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = sum;
    }
}

/// Stage 2 of 2: sum (1) f64 = Σ partial (blocks).
/// Launch: grid 1, block 1024.
extern "C" __global__ void global_norm_finish(double* sum, const double* partial, int blocks) {
    double total = 0.0;
    for (int i = threadIdx.x; i < blocks; i += blockDim.x) {
        total += partial[i];
    }
    total = block_sum(total);
    if (threadIdx.x == 0) {
        *sum = total;
    }
}
