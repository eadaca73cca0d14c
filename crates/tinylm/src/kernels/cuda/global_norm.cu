// The global L2 norm of the flat gradient buffer and the clipping factor, on the
// device, deterministic (a fixed grid, fixed summation order), in f64 like
// crates/tinylm/src/optim.rs `global_norm` and `clip_scale`.

/// Stage 1 of 2: partial (gridDim.x) f64 = this block's Σ x² over a grid-stride
/// loop of x (n) f32.
/// Launch: grid G (a fixed constant of the caller, the same every step), block 512.
extern "C" __global__ void global_norm_partial(double* partial, const float* x, size_t n) {
    double sum = 0.0;
    for (size_t i = thread_index(); i < n; i += grid_stride()) {
        const double xi = x[i];
        sum += xi * xi;
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = sum;
    }
}

/// Stage 2 of 2: norm_scale[0] = sqrt(Σ partial (blocks)), norm_scale[1] = the
/// clipping factor max/(norm + eps) when max > 0 and norm > max, else 1.
/// Launch: grid 1, block 1024.
extern "C" __global__ void global_norm_finish(float* norm_scale, const double* partial,
                                              int blocks, double max_norm, double eps) {
    double sum = 0.0;
    for (int i = threadIdx.x; i < blocks; i += blockDim.x) {
        sum += partial[i];
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
        const double norm = sqrt(sum);
        norm_scale[0] = (float)norm;
        norm_scale[1] = max_norm > 0.0 && norm > max_norm ? (float)(max_norm / (norm + eps)) : 1.0f;
    }
}
