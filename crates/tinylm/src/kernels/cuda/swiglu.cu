// SiLU and SwiGLU: SiLU(a) = a·σ(a), SwiGLU = SiLU(a) ⊙ b; the plain SiLU FFN
// passes b = NULL. CPU twin: kernels/cpu/swiglu.rs.
//
// Memory-bound: a thread takes `width` consecutive values, one 16-byte pack of each
// operand when `packed` (n a multiple of PACK, the buffers 16-byte aligned), else one.

/// σ(a) = 1 / (1 + 2^(−a·log2 e)), by the special-function unit's exponential and
/// reciprocal (`exp2_approx`, `__fdividef`: within a few ulp, σ = 0 below a ≈ −87):
/// `expf` and an IEEE division took about twenty instructions more.
__device__ __forceinline__ float sigmoid(float a) {
    return __fdividef(1.0f, 1.0f + exp2_approx(a * -LOG2E));
}

/// out (N, F) = SiLU(a) ⊙ b, or SiLU(a) when b is NULL.
/// Launch: grid ceil(N·F / (256·width)), block 256; `width` values per thread.
extern "C" __global__ void swiglu_forward(floatX* out, const floatX* a, const floatX* b,
                                          size_t n, int packed) {
    const size_t width = packed ? PACK : 1;
    const size_t i = thread_index() * width;
    if (i >= n) {
        return;
    }
    float av[PACK], bv[PACK], y[PACK];
    load_pack(av, a + i, packed);
    if (b != nullptr) {
        load_pack(bv, b + i, packed);
    }
#pragma unroll
    for (int k = 0; k < PACK; k++) {
        y[k] = av[k] * sigmoid(av[k]);
        if (b != nullptr) {
            y[k] *= bv[k];
        }
    }
    store_pack(out + i, y, packed);
}

/// Backward: da = dout ⊙ b ⊙ σ(a)(1 + a(1 − σ(a))), db = dout ⊙ SiLU(a), both
/// overwritten; b and db are NULL together for SiLU.
/// Launch: grid ceil(N·F / (256·width)), block 256; `width` values per thread.
extern "C" __global__ void swiglu_backward(floatX* da, floatX* db, const floatX* dout,
                                           const floatX* a, const floatX* b, size_t n,
                                           int packed) {
    const size_t width = packed ? PACK : 1;
    const size_t i = thread_index() * width;
    if (i >= n) {
        return;
    }
    float av[PACK], d[PACK], bv[PACK], dav[PACK], dbv[PACK];
    load_pack(av, a + i, packed);
    load_pack(d, dout + i, packed);
    if (b != nullptr) {
        load_pack(bv, b + i, packed);
    }
#pragma unroll
    for (int k = 0; k < PACK; k++) {
        const float s = sigmoid(av[k]);
        const float dsilu = d[k] * s * (1.0f + av[k] * (1.0f - s));
        dbv[k] = d[k] * av[k] * s;
        dav[k] = b != nullptr ? dsilu * bv[k] : dsilu;
    }
    if (b != nullptr) {
        store_pack(db + i, dbv, packed);
    }
    store_pack(da + i, dav, packed);
}
