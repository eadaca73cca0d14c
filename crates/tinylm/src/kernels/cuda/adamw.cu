// AdamW over the flat parameter buffer, exactly as crates/tinylm/src/optim.rs
// `adamw_step` (SPEC §3), in the same f32 operations in the same order: the
// explicit _rn intrinsics keep NVRTC from contracting them into FMAs, so a step
// on the GPU equals the CPU's bit for bit given the same gradients.

/// g ← s·g; m ← β1 m + (1−β1) g; v ← β2 v + (1−β2) g²;
/// θ ← θ − α_t m / (sqrt(v) + ε); θ ← θ − decay·θ, with decay = lr·λ, α_t from the
/// step number (computed by the caller in f64, as the CPU does) and s the
/// gradient scale (the clipping factor, or 1). params, grads, m, v (P) f32; when `shadow` is not
/// NULL it receives the new parameters in floatX (the matmul operands).
/// Launch: grid min(ceil(P / 256), 65535), block 256; grid-stride loop.
extern "C" __global__ void adamw(float* params, floatX* shadow, const float* grads, float* m,
                                 float* v, size_t n, float alpha_t, float beta1, float beta2,
                                 float eps, float decay, float grad_scale) {
    const float one_minus_b1 = __fsub_rn(1.0f, beta1);
    const float one_minus_b2 = __fsub_rn(1.0f, beta2);
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
