// Rotary position embedding on adjacent pairs (2k, 2k+1) of every query and key
// head, from f32 tables. CPU twin: kernels/cpu/rope.rs.

/// Rotates the query and key heads of qkv (B, Tq, 3C) in place: row i of each
/// sequence is at position q0 + i; `inverse` rotates by −θ (the backward pass,
/// applied to dqkv). cos, sin: (context_length, D/2) f32. rows = B·Tq, C = H·D.
/// A thread rotates `width` consecutive values of one head (width/2 pairs): a
/// 16-byte pack when `packed` (D a multiple of PACK, qkv 16-byte aligned), else 2.
/// Launch: grid ceil(B·Tq·2C / (256·width)), block 256.
extern "C" __global__ void rope(floatX* qkv, const float* cos, const float* sin, int rows,
                                int tq, int q0, int h, int d, int inverse, int packed) {
    // 32-bit index arithmetic (the caller checks B·Tq·3C < 2^32).
    const unsigned int width = packed ? PACK : 2;
    const unsigned int half = d / 2;
    // The q and k parts are the first 2C channels of a row: 2H heads of D.
    const unsigned int channels = 2 * h * d;
    const unsigned int i = (blockIdx.x * blockDim.x + threadIdx.x) * width;
    if (i >= rows * channels) {
        return;
    }
    const unsigned int row = i / channels;
    const unsigned int channel = i % channels;
    const unsigned int first_pair = (channel % d) / 2;
    const float* cs = cos + (q0 + row % tq) * half + first_pair;
    const float* sn = sin + (q0 + row % tq) * half + first_pair;
    floatX* p = qkv + row * 3 * h * d + channel;
    float v[PACK];
    if (packed) {
        load_pack(v, p, 1);
    } else {
        v[0] = to_f32(p[0]);
        v[1] = to_f32(p[1]);
    }
#pragma unroll
    for (int j = 0; j < PACK / 2; j++) {
        if (2 * j < (int)width) {
            const float c = cs[j];
            const float s = inverse ? -sn[j] : sn[j];
            const float x0 = v[2 * j];
            const float x1 = v[2 * j + 1];
            v[2 * j] = x0 * c - x1 * s;
            v[2 * j + 1] = x0 * s + x1 * c;
        }
    }
    if (packed) {
        store_pack(p, v, 1);
    } else {
        p[0] = to_x(v[0]);
        p[1] = to_x(v[1]);
    }
}
