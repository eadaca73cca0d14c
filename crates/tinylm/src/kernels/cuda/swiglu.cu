// SiLU and SwiGLU: SiLU(a) = a·σ(a), SwiGLU = SiLU(a) ⊙ b; the plain SiLU FFN
// passes b = NULL. CPU twin: kernels/cpu/swiglu.rs.

__device__ __forceinline__ float sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

/// out (N, F) = SiLU(a) ⊙ b, or SiLU(a) when b is NULL.
/// Launch: grid ceil(N·F / 256), block 256; one thread per element.
extern "C" __global__ void swiglu_forward(floatX* out, const floatX* a, const floatX* b,
                                          size_t n) {
    const size_t i = thread_index();
    if (i >= n) {
        return;
    }
    const float av = to_f32(a[i]);
    float y = av * sigmoid(av);
    if (b != nullptr) {
        y *= to_f32(b[i]);
    }
    out[i] = to_x(y);
}

/// Backward: da = dout ⊙ b ⊙ σ(a)(1 + a(1 − σ(a))), db = dout ⊙ SiLU(a), both
/// overwritten; b and db are NULL together for SiLU.
/// Launch: grid ceil(N·F / 256), block 256; one thread per element.
extern "C" __global__ void swiglu_backward(floatX* da, floatX* db, const floatX* dout,
                                           const floatX* a, const floatX* b, size_t n) {
    const size_t i = thread_index();
    if (i >= n) {
        return;
    }
    const float av = to_f32(a[i]);
    const float d = to_f32(dout[i]);
    const float s = sigmoid(av);
    const float dsilu = d * s * (1.0f + av * (1.0f - s));
    if (b != nullptr) {
        db[i] = to_x(d * av * s);
        da[i] = to_x(dsilu * to_f32(b[i]));
    } else {
        da[i] = to_x(dsilu);
    }
}
