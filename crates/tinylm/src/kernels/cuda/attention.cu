// Causal multi-head attention. CPU twin: kernels/cpu/attention.rs (same semantics:
// query row i is at position q0 + i and sees keys 0..=q0+i; later keys get
// probability exactly 0).
//
// Forward, per layer: one fused kernel, attention_forward_d{DP} (below): Q·Kᵀ, the
//   causal softmax with the 1/sqrt(D) scale and P·V per tile, on the tensor cores in
//   bf16, reading the heads straight from the fused qkv rows and writing out and P.
// Backward, llm.c style: heads ← qkv (to_heads, parts 3), dY ← dout (parts 1);
//   dV = Pᵀ dY;  dP = dY Vᵀ (batched cuBLASLt products, outside these kernels);
//   attention_softmax_backward(dP → dS);  dQ = dS K;  dK = dSᵀ Q;  dqkv ← dQ,dK,dV.

/// Moves `parts` tensors between fused rows and per-head layout:
/// rows (B, T, parts·C) ⇄ heads (parts, B, H, T, D), C = H·D; rows → heads when
/// `to_heads`, else heads → rows. parts = 3 for qkv and its gradient, 1 for dY.
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

/// c (16×8, the accumulator layout of `mma_16x8x16`) += A (16×16) · B (16×8), A's
/// rows at `a` (row stride `lda`); B[k][n] = b[n·ldb + k] when `B_COLUMNS` (B given
/// as its columns: the rows of K in Q·Kᵀ), else b[k·ldb + n] (the rows of V in P·V).
/// Every operand in shared memory, `a` and `b` 4-byte aligned, lda and ldb even.
/// bf16: one tensor-core `mma`; fp32: each lane's four sums of 16 products in IEEE
/// f32 (FMA), as cuBLASLt's f32 products do.
template <bool B_COLUMNS>
__device__ __forceinline__ void tile_product(float (&c)[4], const floatX* a, int lda,
                                             const floatX* b, int ldb) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int g = lane / 4, q = lane % 4;
#ifdef TINYLM_BF16
    const unsigned fa[4] = {pair_at(a + g * lda + 2 * q), pair_at(a + (g + 8) * lda + 2 * q),
                            pair_at(a + g * lda + 2 * q + 8),
                            pair_at(a + (g + 8) * lda + 2 * q + 8)};
    unsigned fb[2];
    if (B_COLUMNS) {
        fb[0] = pair_at(b + g * ldb + 2 * q);
        fb[1] = pair_at(b + g * ldb + 2 * q + 8);
    } else {
        fb[0] = pair_of(b[2 * q * ldb + g], b[(2 * q + 1) * ldb + g]);
        fb[1] = pair_of(b[(2 * q + 8) * ldb + g], b[(2 * q + 9) * ldb + g]);
    }
    mma_16x8x16(c, fa, fb);
#else
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const floatX* row = a + (g + 8 * (i >> 1)) * lda;
        const int n = 2 * q + (i & 1);
        float sum = c[i];
#pragma unroll
        for (int k = 0; k < 16; k++) {
            sum = fmaf(row[k], B_COLUMNS ? b[n * ldb + k] : b[k * ldb + n], sum);
        }
        c[i] = sum;
    }
#endif
}

/// Copies `n` rows of a head, row j at src + j·stride (`d` values), to dst (row
/// stride LD, DP columns), rows past `limit` and columns past `d` zero; in 16-byte
/// packs when `packed` (d a multiple of PACK, src and the stride aligned to it).
/// The block's threads share the rows.
template <int DP, int LD>
__device__ __forceinline__ void load_head_rows(floatX* dst, const floatX* src, int n,
                                               int limit, int d, size_t stride, int packed) {
    const int width = packed ? PACK : 1;
    for (int i = threadIdx.x * width; i < n * DP; i += blockDim.x * width) {
        const int r = i / DP, col = i % DP;
        const bool in = r < limit && col < d;
        const floatX* from = src + r * stride + col;
        if (packed) {
            Pack pack;
#pragma unroll
            for (int k = 0; k < PACK; k++) {
                pack.v[k] = to_x(0.0f);
            }
            if (in) {
                pack = *reinterpret_cast<const Pack*>(from);
            }
            *reinterpret_cast<Pack*>(dst + r * LD + col) = pack;
        } else {
            dst[r * LD + col] = in ? *from : to_x(0.0f);
        }
    }
}

/// The fused forward of one tile of BQ = 16·WARPS query rows of one (batch, head),
/// straight from the fused rows: out (B, Tq, C) and the probabilities att (B·H, Tq,
/// T) from qkv (B, T, 3C), query row i at position q0 + i seeing keys 0..=q0+i.
/// Q·Kᵀ and P·V run on 16×8 tiles (`tile_product`) over keys in chunks of KC, with
/// the head's D columns zero-padded to DP (a multiple of 16) in shared memory:
///   pass 1: the scores S = scale·Q·Kᵀ (f32, never stored), each row's max m and
///           Σ exp(S − m) online per lane, then over the row's four lanes;
///   pass 2: S again, P = exp(S − m) / Σ rounded to floatX, written to att and
///           multiplied by V into the warp's accumulators (Y = P̃·V, as the
///           two-kernel forward did); att's masked columns are written 0.
/// Warp w holds rows 16w..16w+16 of the tile; lane 4g + q rows g and g + 8, and of
/// each 8-key tile the columns 2q, 2q + 1 (the accumulator layout). `packed`: bit 0,
/// the heads' rows are read in 16-byte packs (D a multiple of PACK, qkv aligned);
/// bit 1, att's rows are written in packs (T a multiple of PACK, att aligned).
template <int DP, int WARPS, int KC>
__device__ __forceinline__ void attention_forward_tile(floatX* out, floatX* att,
                                                       const floatX* qkv, int t, int tq,
                                                       int q0, int h, int d, float scale,
                                                       int packed) {
    constexpr int BQ = 16 * WARPS;
    // Rows padded by 8 values: a warp's reads of 8 rows at one column fall in
    // different banks.
    constexpr int LD = DP + 8, LP = KC + 8;
    alignas(16) __shared__ floatX qs[BQ * LD];
    alignas(16) __shared__ floatX ks[KC * LD];
    alignas(16) __shared__ floatX vs[KC * LD];
    alignas(16) __shared__ floatX ps[WARPS * 16 * LP];
    if (blockDim.x != 32 * WARPS) {
        __trap();  // launched with another block than attention.rs's FORWARD_TILES says
    }
    const int bh = blockIdx.x, head = bh % h;
    const size_t bb = bh / h;
    const int row0 = blockIdx.y * BQ;
    const int c = h * d;
    const floatX* rows = qkv + bb * t * 3 * c + head * d;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int g = lane / 4, q = lane % 4;
    const size_t stride = 3 * (size_t)c;
    const int packed_rows = packed & 1, packed_att = packed >> 1 & 1;
    const int width_att = packed_att ? PACK : 1;
    load_head_rows<DP, LD>(qs, rows + (q0 + row0) * stride, BQ, tq - row0, d, stride,
                           packed_rows);
    // Keys the block's rows see, and the warp's rows (none past the last row).
    const int block_keys = q0 + min(row0 + BQ, tq);
    const int first = row0 + 16 * warp;
    const int warp_keys = first < tq ? q0 + min(first + 16, tq) : 0;
    const int chunks = (block_keys + KC - 1) / KC;
    const int visible[2] = {q0 + first + g + 1, q0 + first + g + 9};
    const floatX* qw = qs + 16 * warp * LD;
    // Loads keys (and values) [j0, j0 + KC) of the head into shared memory, rows past
    // T and columns past D zero.
    auto load = [&](int j0, bool values) {
        __syncthreads();  // every warp is done with the last chunk
        const floatX* keys = rows + j0 * stride + c;
        load_head_rows<DP, LD>(ks, keys, KC, t - j0, d, stride, packed_rows);
        if (values) {
            load_head_rows<DP, LD>(vs, keys + c, KC, t - j0, d, stride, packed_rows);
        }
        __syncthreads();
    };
    // s = scale·log2(e)·(Q Kᵀ) of the warp's rows and the 8 keys at n0 of the chunk:
    // the scores in base 2, so that each exponential is one exp2f (e^x = 2^(x·log2 e)).
    const float scale_log2 = scale * 1.44269504088896341f;
    auto scores = [&](float (&s)[4], int n0) {
        s[0] = s[1] = s[2] = s[3] = 0.0f;
#pragma unroll
        for (int k = 0; k < DP; k += 16) {
            tile_product<true>(s, qw + k, LD, ks + n0 * LD + k, LD);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s[i] *= scale_log2;
        }
    };
    float run_max[2] = {FLT_LOWEST, FLT_LOWEST}, run_sum[2] = {0.0f, 0.0f};
    for (int chunk = 0; chunk < chunks; chunk++) {
        load(chunk * KC, false);
        if (chunk * KC >= warp_keys) {
            continue;
        }
        for (int n0 = 0; n0 < KC; n0 += 8) {
            float s[4];
            scores(s, n0);
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int j = chunk * KC + n0 + 2 * q;
                float tile_max = FLT_LOWEST;
#pragma unroll
                for (int k = 0; k < 2; k++) {
                    tile_max = j + k < visible[r] ? fmaxf(tile_max, s[2 * r + k]) : tile_max;
                }
                const float new_max = fmaxf(run_max[r], tile_max);
                run_sum[r] *= exp2f(run_max[r] - new_max);
#pragma unroll
                for (int k = 0; k < 2; k++) {
                    run_sum[r] += j + k < visible[r] ? exp2f(s[2 * r + k] - new_max) : 0.0f;
                }
                run_max[r] = new_max;
            }
        }
    }
    // Each row's max and sum over its four lanes.
    float row_max[2], inv_sum[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        row_max[r] = run_max[r];
        for (int offset = 1; offset < 4; offset <<= 1) {
            row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(FULL_MASK, row_max[r], offset));
        }
        float row_sum = run_sum[r] * exp2f(run_max[r] - row_max[r]);
        for (int offset = 1; offset < 4; offset <<= 1) {
            row_sum += __shfl_xor_sync(FULL_MASK, row_sum, offset);
        }
        inv_sum[r] = 1.0f / row_sum;
    }
    float y[DP / 8][4] = {};
    floatX* pw = ps + warp * 16 * LP;
    floatX* att_rows = att + ((size_t)bh * tq + first) * t;
    for (int chunk = 0; chunk < chunks; chunk++) {
        load(chunk * KC, true);
        if (chunk * KC >= warp_keys) {
            continue;
        }
        for (int n0 = 0; n0 < KC; n0 += 8) {
            float s[4];
            scores(s, n0);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = i >> 1, j = chunk * KC + n0 + 2 * q + (i & 1);
                const float p = j < visible[r] ? exp2f(s[i] - row_max[r]) * inv_sum[r] : 0.0f;
                pw[(g + 8 * r) * LP + n0 + 2 * q + (i & 1)] = to_x(p);
            }
        }
        __syncwarp();
        for (int i = lane * width_att; i < 16 * KC; i += WARP_SIZE * width_att) {
            const int r = i / KC, j = chunk * KC + i % KC;
            if (first + r < tq && j < t) {
                floatX* to = att_rows + (size_t)r * t + j;
                const floatX* from = pw + r * LP + i % KC;
                if (packed_att) {
                    *reinterpret_cast<Pack*>(to) = *reinterpret_cast<const Pack*>(from);
                } else {
                    *to = *from;
                }
            }
        }
#pragma unroll
        for (int n = 0; n < DP / 8; n++) {
#pragma unroll
            for (int k = 0; k < KC; k += 16) {
                tile_product<false>(y[n], pw + k, LP, vs + k * LD + 8 * n, LD);
            }
        }
        __syncwarp();  // pw is rewritten by the next chunk
    }
    // Columns past the warp's last chunk are masked for all its rows.
    const int done = (warp_keys + KC - 1) / KC * KC;
    const float zeros[PACK] = {};
    for (int r = 0; r < 16 && first + r < tq; r++) {
        for (int j = done + lane * width_att; j < t; j += WARP_SIZE * width_att) {
            store_pack(att_rows + (size_t)r * t + j, zeros, packed_att);
        }
    }
#pragma unroll
    for (int n = 0; n < DP / 8; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = first + g + 8 * (i >> 1), col = 8 * n + 2 * q + (i & 1);
            if (row < tq && col < d) {
                out[(bb * tq + row) * c + head * d + col] = to_x(y[n][i]);
            }
        }
    }
}

// The fused forward for head dimensions up to 16, 32, 64 and 128 (DP), each with
// the warps and key chunk (per precision) that keep its shared memory under 48 KiB
// and ran fastest on an H200 (bench/attention_gpu.py); at D ≤ 32 in bf16 a cap of
// 64 registers lets 8 blocks share a multiprocessor (fp32's FMA tiles would spill).
// Launch: grid (B·H, ceil(Tq / (16·WARPS))), block 32·WARPS.
#define KEYS_BF16_F32(bf16, f32) (sizeof(floatX) == 2 ? (bf16) : (f32))
#define SMALL_HEAD_MIN_BLOCKS KEYS_BF16_F32(8, 1)
extern "C" __global__ void __launch_bounds__(128, SMALL_HEAD_MIN_BLOCKS) attention_forward_d16(
    floatX* out, floatX* att, const floatX* qkv, int t, int tq, int q0, int h, int d,
    float scale, int packed) {
    attention_forward_tile<16, 4, 64>(out, att, qkv, t, tq, q0, h, d, scale, packed);
}
extern "C" __global__ void __launch_bounds__(128, SMALL_HEAD_MIN_BLOCKS) attention_forward_d32(
    floatX* out, floatX* att, const floatX* qkv, int t, int tq, int q0, int h, int d,
    float scale, int packed) {
    attention_forward_tile<32, 4, KEYS_BF16_F32(64, 32)>(out, att, qkv, t, tq, q0, h, d, scale,
                                                         packed);
}
extern "C" __global__ void attention_forward_d64(floatX* out, floatX* att, const floatX* qkv,
                                                 int t, int tq, int q0, int h, int d,
                                                 float scale, int packed) {
    attention_forward_tile<64, 4, 32>(out, att, qkv, t, tq, q0, h, d, scale, packed);
}
extern "C" __global__ void attention_forward_d128(floatX* out, floatX* att, const floatX* qkv,
                                                  int t, int tq, int q0, int h, int d,
                                                  float scale, int packed) {
    attention_forward_tile<128, 2, 16>(out, att, qkv, t, tq, q0, h, d, scale, packed);
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
