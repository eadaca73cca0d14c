// Causal multi-head attention, llm.c style: the fused rows are split into heads
// (B, H, T, D), the two products per head run as batched matrix products
// (cuBLASLt, outside these kernels), and the causal masked softmax with the
// 1/sqrt(D) scale is one fused kernel forward and one backward. CPU twin:
// kernels/cpu/attention.rs (same semantics: query row i is at position q0 + i and
// sees keys 0..=q0+i; later keys get probability exactly 0).
//
// Forward, per layer:   heads ← qkv (to_heads, parts 3);  S = Q Kᵀ (batched, f32);
//   attention_softmax_forward(S → P);  Y = P V (batched);  out ← Y (parts 1).
// Backward:             heads ← qkv, dY ← dout;  dV = Pᵀ dY;  dP = dY Vᵀ;
//   attention_softmax_backward(dP → dS);  dQ = dS K;  dK = dSᵀ Q;  dqkv ← dQ,dK,dV.

/// Moves `parts` tensors between fused rows and per-head layout:
/// rows (B, T, parts·C) ⇄ heads (parts, B, H, T, D), C = H·D; rows → heads when
/// `to_heads`, else heads → rows. parts = 3 for qkv, 1 for an attention output.
/// A thread moves `width` consecutive values of one head's row: a 16-byte pack
/// when `packed` (D a multiple of PACK, the buffers 16-byte aligned), else one.
/// Launch: grid ceil(parts·B·T·C / (256·width)), block 256.
extern "C" __global__ void attention_heads(floatX* heads, floatX* rows, int b, int t, int h,
                                           int d, int parts, int to_heads, int packed) {
    // 32-bit index arithmetic (the caller checks parts·B·T·C < 2^32): a 64-bit
    // division costs several times a 32-bit one, and there are four per element.
    const unsigned int width = packed ? PACK : 1;
    const unsigned int c = h * d;
    const unsigned int per_part = b * t * c;
    const unsigned int i = (blockIdx.x * blockDim.x + threadIdx.x) * width;
    if (i >= parts * per_part) {
        return;
    }
    // i indexes heads: (part, b, head, t, d).
    const unsigned int part = i / per_part;
    unsigned int rest = i % per_part;
    const unsigned int dd = rest % d;
    rest /= d;
    const unsigned int tt = rest % t;
    rest /= t;
    const unsigned int head = rest % h;
    const unsigned int bb = rest / h;
    const unsigned int r = ((bb * t + tt) * parts + part) * c + head * d + dd;
    if (packed) {
        Pack* dst = reinterpret_cast<Pack*>(to_heads ? heads + i : rows + r);
        *dst = *reinterpret_cast<const Pack*>(to_heads ? rows + r : heads + i);
    } else if (to_heads) {
        heads[i] = rows[r];
    } else {
        rows[r] = heads[i];
    }
}

/// Four f32 in one 16-byte access.
struct alignas(16) Floats4 {
    float v[4];
};

/// v[0..PACK) = the PACK scores at p (16-byte loads) when `packed`, else v[0] = *p.
__device__ __forceinline__ void load_scores(float (&v)[PACK], const float* p, int packed) {
    if (packed) {
#pragma unroll
        for (int q = 0; q < PACK / 4; q++) {
            const Floats4 f = *reinterpret_cast<const Floats4*>(p + 4 * q);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                v[4 * q + k] = f.v[k];
            }
        }
    } else {
        v[0] = *p;
    }
}

/// att (B·H, Tq, T) floatX = probabilities from the raw scores Q·Kᵀ in
/// scores (B·H, Tq, T) f32 (f32 so that no rounding of a score is amplified by exp):
/// P[i, j] = softmax_j(scale · S[i, j]) over j ≤ q0 + i, 0 for j > q0 + i.
/// Max and sum in f32, in one online pass over the visible scores; a second pass
/// writes P. A lane takes `width` consecutive columns at a time: PACK when `packed`
/// (T a multiple of PACK, both buffers 16-byte aligned), else 1.
/// Launch: grid ceil(B·H·Tq / 8), block 256; one warp per row.
extern "C" __global__ void attention_softmax_forward(floatX* att, const float* scores, int rows,
                                                     int tq, int t, int q0, float scale,
                                                     int packed) {
    const int row = warp_row(rows);
    if (row < 0) {
        return;
    }
    const int lane = threadIdx.x % WARP_SIZE;
    const int width = packed ? PACK : 1;
    const int visible = q0 + row % tq + 1;
    const float* s_row = scores + (size_t)row * t;
    floatX* p = att + (size_t)row * t;
    float v[PACK];
    float max = FLT_LOWEST;
    float sum = 0.0f;
    for (int j = lane * width; j < visible; j += WARP_SIZE * width) {
        load_scores(v, s_row + j, packed);
        float pack_max = FLT_LOWEST;
#pragma unroll
        for (int k = 0; k < PACK; k++) {
            if (k < width && j + k < visible) {
                pack_max = fmaxf(pack_max, scale * v[k]);
            }
        }
        const float new_max = fmaxf(max, pack_max);
        sum *= expf(max - new_max);
#pragma unroll
        for (int k = 0; k < PACK; k++) {
            if (k < width && j + k < visible) {
                sum += expf(scale * v[k] - new_max);
            }
        }
        max = new_max;
    }
    const float row_max = warp_max(max);
    sum = warp_sum(sum * expf(max - row_max));
    const float inv_sum = 1.0f / sum;
    for (int j = lane * width; j < t; j += WARP_SIZE * width) {
        if (j < visible) {
            load_scores(v, s_row + j, packed);
        }
#pragma unroll
        for (int k = 0; k < PACK; k++) {
            v[k] = j + k < visible ? expf(scale * v[k] - row_max) * inv_sum : 0.0f;
        }
        store_pack(p + j, v, packed);
    }
}

/// In place on datt (B·H, T, T): dP in, dS out (full passes, q0 = 0):
/// dS[i, j] = P[i, j] · (dP[i, j] − Σ_k≤i dP[i, k] P[i, k]) · scale for j ≤ i, else 0.
/// A lane takes `width` consecutive columns at a time, as the forward.
/// Launch: grid ceil(B·H·T / 8), block 256; one warp per row.
extern "C" __global__ void attention_softmax_backward(floatX* datt, const floatX* att, int rows,
                                                      int t, float scale, int packed) {
    const int row = warp_row(rows);
    if (row < 0) {
        return;
    }
    const int lane = threadIdx.x % WARP_SIZE;
    const int width = packed ? PACK : 1;
    const int visible = row % t + 1;
    floatX* dp = datt + (size_t)row * t;
    const floatX* p = att + (size_t)row * t;
    float dv[PACK], pv[PACK];
    float dot = 0.0f;
    for (int j = lane * width; j < visible; j += WARP_SIZE * width) {
        load_pack(dv, dp + j, packed);
        load_pack(pv, p + j, packed);
#pragma unroll
        for (int k = 0; k < PACK; k++) {
            dot += k < width && j + k < visible ? dv[k] * pv[k] : 0.0f;
        }
    }
    dot = warp_sum(dot);
    for (int j = lane * width; j < t; j += WARP_SIZE * width) {
        if (j < visible) {
            load_pack(dv, dp + j, packed);
            load_pack(pv, p + j, packed);
        }
#pragma unroll
        for (int k = 0; k < PACK; k++) {
            dv[k] = j + k < visible ? pv[k] * (dv[k] - dot) * scale : 0.0f;
        }
        store_pack(dp + j, dv, packed);
    }
}
