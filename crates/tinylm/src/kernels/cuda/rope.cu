// Rotary position embedding on adjacent pairs (2k, 2k+1) of every query and key
// head, from f32 tables. CPU twin: kernels/cpu/rope.rs.

/// Rotates the query and key heads of qkv (B, Tq, 3C) in place: row i of each
/// sequence is at position q0 + i; `inverse` rotates by −θ (the backward pass,
/// applied to dqkv). cos, sin: (context_length, D/2) f32. rows = B·Tq, C = H·D.
/// Launch: grid ceil(B·Tq·2H·D/2 / 256), block 256; one thread per rotated pair.
extern "C" __global__ void rope(floatX* qkv, const float* cos, const float* sin, int rows,
                                int tq, int q0, int h, int d, int inverse) {
    // 32-bit index arithmetic (the caller checks B·Tq·3C < 2^32).
    const unsigned int half = d / 2;
    const unsigned int pairs_per_row = 2 * h * half;
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * pairs_per_row) {
        return;
    }
    const unsigned int row = i / pairs_per_row;
    const unsigned int pair = i % pairs_per_row;
    // The q and k parts are the first 2C channels: 2H heads of D.
    const unsigned int head = pair / half;
    const unsigned int k = pair % half;
    const unsigned int pos = q0 + row % tq;
    const float cs = cos[pos * half + k];
    const float sn = inverse ? -sin[pos * half + k] : sin[pos * half + k];
    floatX* p = qkv + row * 3 * h * d + head * d + 2 * k;
    const float x0 = to_f32(p[0]);
    const float x1 = to_f32(p[1]);
    p[0] = to_x(x0 * cs - x1 * sn);
    p[1] = to_x(x0 * sn + x1 * cs);
}
