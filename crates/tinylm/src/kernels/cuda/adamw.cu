// AdamW over the flat parameter buffer, exactly as crates/tinylm/src/optim.rs
// `adamw_step` (SPEC §3), in the same f32 operations in the same order: the
// explicit _rn intrinsics keep NVRTC from contracting them into FMAs, so a step
// on the GPU equals the CPU's bit for bit given the same gradients. The clipping
// factor is computed here from the gradient's sum of squares on the device, so a
// training step never waits for the host.

/// The clipping factor of crates/tinylm/src/optim.rs `clip_scale(sqrt(sum), max_norm,
/// eps)`: max_norm / (norm + eps) when norm > max_norm > 0, else 1 (also for a NaN
/// norm), in the same f64 operations rounded to f32; 1 when `sum_squares` is NULL.
__device__ float clip_scale(const double* sum_squares, double max_norm, double eps) {
    if (sum_squares == nullptr) {
        return 1.0f;
    }
    const double norm = __dsqrt_rn(*sum_squares);
    if (max_norm > 0.0 && norm > max_norm) {
        return __double2float_rn(__ddiv_rn(max_norm, __dadd_rn(norm, eps)));
    }
    return 1.0f;
}

/// g ← s·g; m ← β1 m + (1−β1) g; v ← β2 v + (1−β2) g²;
/// θ ← θ − α_t m / (sqrt(v) + ε); θ ← θ − decay·θ, with decay = lr·λ, α_t from the
/// step number (computed by the caller in f64, as the CPU does) and s the clipping
/// factor of the gradient's sum of squares `sum_squares` (1) f64 and `max_norm`
/// (no clipping when `sum_squares` is NULL). params, grads, m, v (P) f32; when
/// `shadow` is not NULL it receives the new parameters in floatX (the matmul operands).
/// Launch: grid min(ceil(P / 256), 65535), block 256; grid-stride loop.
extern "C" __global__ void adamw(float* params, floatX* shadow, const float* grads, float* m,
                                 float* v, size_t n, float alpha_t, float beta1, float beta2,
                                 float eps, float decay, const double* sum_squares,
                                 double max_norm, double clip_eps) {
    const float one_minus_b1 = __fsub_rn(1.0f, beta1);
    const float one_minus_b2 = __fsub_rn(1.0f, beta2);
    const float grad_scale = clip_scale(sum_squares, max_norm, clip_eps);
    for (size_t i = thread_index(); i < n; i += grid_stride()) {
        const float g = __fmul_rn(grads[i], grad_scale);
        const float mi = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(one_minus_b1, g));
        const float vi =
            __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(__fmul_rn(one_minus_b2, g), g));
        const float step = __fdiv_rn(__fmul_rn(alpha_t, mi), __fadd_rn(__fsqrt_rn(vi), eps));
        const float theta = __fsub_rn(params[i], step);
        const float p = __fsub_rn(theta, __fmul_rn(decay, theta));
        m[i] = mi;
        v[i] = vi;
        params[i] = p;
        if (shadow != nullptr) {
            shadow[i] = to_x(p);
        }
    }
}
