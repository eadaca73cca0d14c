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
/// Launch: grid ceil(parts·B·T·C / 256), block 256; one thread per element.
extern "C" __global__ void attention_heads(floatX* heads, floatX* rows, int b, int t, int h,
                                           int d, int parts, int to_heads) {
    // 32-bit index arithmetic (the caller checks parts·B·T·C < 2^32): a 64-bit
    // division costs several times a 32-bit one, and there are four per element.
    const unsigned int c = h * d;
    const unsigned int per_part = b * t * c;
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
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
    if (to_heads) {
        heads[i] = rows[r];
    } else {
        rows[r] = heads[i];
    }
}

/// att (B·H, Tq, T) floatX = probabilities from the raw scores Q·Kᵀ in
/// scores (B·H, Tq, T) f32 (f32 so that no rounding of a score is amplified by exp):
/// P[i, j] = softmax_j(scale · S[i, j]) over j ≤ q0 + i, 0 for j > q0 + i.
/// Max and sum in f32, in one online pass; a second pass writes P.
/// Launch: grid ceil(B·H·Tq / 8), block 256; one warp per row.
extern "C" __global__ void attention_softmax_forward(floatX* att, const float* scores, int rows,
                                                     int tq, int t, int q0, float scale) {
    const int row = warp_row(rows);
    if (row < 0) {
        return;
    }
    const int lane = threadIdx.x % WARP_SIZE;
    const int visible = q0 + row % tq + 1;
    const float* s_row = scores + (size_t)row * t;
    floatX* p = att + (size_t)row * t;
    float max = FLT_LOWEST;
    float sum = 0.0f;
    for (int j = lane; j < visible; j += WARP_SIZE) {
        const float s = scale * s_row[j];
        const float new_max = fmaxf(max, s);
        sum = sum * expf(max - new_max) + expf(s - new_max);
        max = new_max;
    }
    const float row_max = warp_max(max);
    sum = warp_sum(sum * expf(max - row_max));
    const float inv_sum = 1.0f / sum;
    for (int j = lane; j < t; j += WARP_SIZE) {
        p[j] = j < visible ? to_x(expf(scale * s_row[j] - row_max) * inv_sum) : to_x(0.0f);
    }
}

/// In place on datt (B·H, T, T): dP in, dS out (full passes, q0 = 0):
/// dS[i, j] = P[i, j] · (dP[i, j] − Σ_k≤i dP[i, k] P[i, k]) · scale for j ≤ i, else 0.
/// Launch: grid ceil(B·H·T / 8), block 256; one warp per row.
extern "C" __global__ void attention_softmax_backward(floatX* datt, const floatX* att, int rows,
                                                      int t, float scale) {
    const int row = warp_row(rows);
    if (row < 0) {
        return;
    }
    const int lane = threadIdx.x % WARP_SIZE;
    const int visible = row % t + 1;
    floatX* dp = datt + (size_t)row * t;
    const floatX* p = att + (size_t)row * t;
    float dot = 0.0f;
    for (int j = lane; j < visible; j += WARP_SIZE) {
        dot += to_f32(dp[j]) * to_f32(p[j]);
    }
    dot = warp_sum(dot);
    for (int j = lane; j < t; j += WARP_SIZE) {
        dp[j] = j < visible ? to_x(to_f32(p[j]) * (to_f32(dp[j]) - dot) * scale) : to_x(0.0f);
    }
}
