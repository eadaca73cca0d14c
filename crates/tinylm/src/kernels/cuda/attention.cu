// Causal multi-head attention. CPU twin: kernels/cpu/attention.rs (same semantics:
// query row i is at position q0 + i and sees keys 0..=q0+i; later keys get
// probability exactly 0). Flash attention: no pass stores the T×T probabilities.
//
// Forward, per layer: attention_forward_d{DP}: S = scale·Q·Kᵀ, the causal softmax
//   and P·V per tile in one pass over the keys (an online softmax), on the tensor
//   cores in bf16, reading the heads straight from the fused qkv rows; writes out
//   and each row's log-sum-exp (f32), from which the backward recomputes P.
// Backward, two kernels, each of which recomputes S and P tile by tile
//   (with Dᵢ = Σ_d dYᵢ·Yᵢ = Σ_j dPᵢⱼ·Pᵢⱼ and dS = P ∘ (dP − D)·scale):
//   attention_backward_dq_d{DP}:  a block per query tile, Dᵢ and dQ = dS·K;
//   attention_backward_dkv_d{DP}: a block per key tile, dV = Pᵀ·dY, dK = dSᵀ·Q.
//   Each writes its part of dqkv (B, T, 3C) straight into the fused rows; neither
//   needs atomics, so the gradient is the same every run. Their P and dS go through
//   each warp's shared tiles: held in registers as the forward's P is
//   (`accumulate_tiles`), they took dkv to 124 registers and the pair ran 6% slower
//   on an H200 (641 against 604 µs at B 128, H 16, T 256, D 32).

#ifdef TINYLM_BF16
/// The A operand (16×16) of `mma_16x8x16` for this lane, A's rows at `a` (row
/// stride `lda`): tiles (rows 0–7, columns 0–7), (8–15, 0–7), (0–7, 8–15),
/// (8–15, 8–15), lane 8m + r giving row r of tile m.
__device__ __forceinline__ void a_fragment(unsigned (&fa)[4], const floatX* a, int lda) {
    const int lane = threadIdx.x % WARP_SIZE;
    load_tiles<4, false>(fa, a + (lane % 8 + 8 * (lane / 8 % 2)) * lda + 8 * (lane / 16));
}

/// The B operand (16×8) of `mma_16x8x16` for this lane: B[k][n] = b[n·ldb + k] when
/// `B_COLUMNS` (tiles k 0–7 and 8–15 of the 8 rows n), else b[k·ldb + n] (the 16 rows
/// k, transposed); see `tile_product`.
template <bool B_COLUMNS>
__device__ __forceinline__ void b_fragment(unsigned (&fb)[2], const floatX* b, int ldb) {
    const int lane = threadIdx.x % WARP_SIZE;
    if (B_COLUMNS) {
        load_tiles<2, false>(fb, b + lane % 8 * ldb + 8 * (lane / 8 % 2));
    } else {
        load_tiles<2, true>(fb, b + lane % 16 * ldb);
    }
}
#endif

/// c (16×8, the accumulator layout of `mma_16x8x16`) += A (16×16) · B (16×8), A's
/// rows at `a` (row stride `lda`); B[k][n] = b[n·ldb + k] when `B_COLUMNS` (B given
/// as its columns: the rows of K in Q·Kᵀ), else b[k·ldb + n] (the rows of V in P·V).
/// Every operand in shared memory, `a` and `b` 4-byte aligned, lda and ldb even.
/// bf16: one tensor-core `mma`; fp32: each lane's four sums of 16 products in IEEE
/// f32 (FMA), as cuBLASLt's f32 products do.
template <bool B_COLUMNS>
__device__ __forceinline__ void tile_product(float (&c)[4], const floatX* a, int lda,
                                             const floatX* b, int ldb) {
#ifdef TINYLM_BF16
    unsigned fa[4], fb[2];
    a_fragment(fa, a, lda);
    b_fragment<B_COLUMNS>(fb, b, ldb);
    mma_16x8x16(c, fa, fb);
#else
    const int lane = threadIdx.x % WARP_SIZE;
    const int g = lane / 4, q = lane % 4;
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

/// The geometry every attention kernel shares: a block of WARPS warps, each taking
/// 16 rows of a tile (queries in the forward and dQ, keys in dK, dV), over the other
/// side's rows in chunks of KC, the head's D columns zero-padded to DP (a multiple
/// of 16) in shared memory, rows padded by 8 values so that a warp's reads of 8 rows
/// at one column fall in different banks. Lane 4g + q holds the fragment rows g and
/// g + 8 and, of each 8-column tile, the columns 2q and 2q + 1 (`mma_16x8x16`).
template <int DP, int WARPS, int KC>
struct Tiles {
    static constexpr int ROWS = 16 * WARPS;
    static constexpr int LD = DP + 8;
    static constexpr int LP = KC + 8;
};

/// Shared memory a kernel's tiles take: `rows_tiles` tiles of ROWS rows and
/// `chunk_tiles` of KC rows, DP wide, and `warp_tiles` per-warp 16 × KC tiles.
template <int DP, int WARPS, int KC>
__host__ __device__ constexpr int shared_bytes(int rows_tiles, int chunk_tiles, int warp_tiles) {
    using G = Tiles<DP, WARPS, KC>;
    return (int)sizeof(floatX) * ((rows_tiles * G::ROWS + chunk_tiles * KC) * G::LD +
                                  warp_tiles * WARPS * 16 * G::LP);
}
/// The most static shared memory a block may have.
#define MAX_STATIC_SHARED (48 * 1024)

/// Where a thread is in a launch of grid (B·H, row tiles), block 32·WARPS: its
/// block's (batch, head) `bh` = (bb, head) and first row, its warp, lane and fragment
/// coordinates g = lane / 4, q = lane % 4; and the head's rows in qkv (B, T, 3C),
/// C = H·D: the first at `rows`, one every `stride` values.
struct Place {
    int bh, head;
    size_t bb;
    int row0, warp, lane, g, q, c;
    size_t stride;
    const floatX* rows;
};
template <int WARPS>
__device__ __forceinline__ Place place(const floatX* qkv, int t, int h, int d) {
    if (blockDim.x != 32 * WARPS) {
        __trap();  // launched with another block than attention.rs's tables say
    }
    const int bh = blockIdx.x, row0 = blockIdx.y * 16 * WARPS;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const size_t bb = bh / h, stride = 3 * (size_t)(h * d);
    const floatX* rows = qkv + bb * t * stride + (bh % h) * d;
    return {bh, bh % h, bb, row0, warp, lane, lane / 4, lane % 4, h * d, stride, rows};
}

/// s = scale·log2(e)·(A Bᵀ) of a warp's 16 rows of `a` and the 8 rows at `b`, both
/// row stride LD: scores in base 2, so that each exponential is one exp2_approx
/// (e^x = 2^(x·log2 e)). The warp's rows are read again at each call: held in
/// registers across the chunks (bf16, D = 32), they saved `dkv` 16 of its 77 shared
/// loads a chunk for 16 registers more, a block fewer on each multiprocessor.
template <int DP, int LD>
__device__ __forceinline__ void scores_of(float (&s)[4], const floatX* a, const floatX* b,
                                          float scale_log2) {
    s[0] = s[1] = s[2] = s[3] = 0.0f;
#pragma unroll
    for (int k = 0; k < DP; k += 16) {
        tile_product<true>(s, a + k, LD, b + k, LD);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        s[i] *= scale_log2;
    }
}

/// acc (16 × DP) += A (16 × KC, row stride LP) · B (KC × DP, row stride LD), a warp's
/// accumulators in the layout of `mma_16x8x16`, one 16×8 tile per acc[n].
template <int DP, int KC, int LD, int LP>
__device__ __forceinline__ void accumulate_rows(float (&acc)[DP / 8][4], const floatX* a,
                                                const floatX* b) {
#pragma unroll
    for (int n = 0; n < DP / 8; n++) {
#pragma unroll
        for (int k = 0; k < KC; k += 16) {
            tile_product<false>(acc[n], a + k, LP, b + k * LD + 8 * n, LD);
        }
    }
}

/// acc (16 × DP) += A (16 × KC) · B (KC × DP, row stride LD), A a warp's tiles in
/// registers as the products leave them: a[n] the 16×8 tile of columns 8n.. in the
/// accumulator layout of `mma_16x8x16`, rounded to floatX here. bf16: straight from
/// registers, as two adjacent accumulator tiles hold exactly the A operand (16×16)
/// of the next `mma` (flash attention 2's trick); fp32: through the warp's shared
/// tile `aw` (16 × KC, row stride LP) and `accumulate_rows`. The same roundings
/// either way.
template <int DP, int KC, int LD, int LP>
__device__ __forceinline__ void accumulate_tiles(float (&acc)[DP / 8][4],
                                                 const float (&a)[KC / 8][4], floatX* aw,
                                                 const floatX* b) {
#ifdef TINYLM_BF16
    (void)aw;
#pragma unroll
    for (int k = 0; k < KC / 16; k++) {
        const float(&lo)[4] = a[2 * k];
        const float(&hi)[4] = a[2 * k + 1];
        const unsigned fa[4] = {
            pair_of(to_x(lo[0]), to_x(lo[1])), pair_of(to_x(lo[2]), to_x(lo[3])),
            pair_of(to_x(hi[0]), to_x(hi[1])), pair_of(to_x(hi[2]), to_x(hi[3]))};
#pragma unroll
        for (int n = 0; n < DP / 8; n++) {
            unsigned fb[2];
            b_fragment<false>(fb, b + 16 * k * LD + 8 * n, LD);
            mma_16x8x16(acc[n], fa, fb);
        }
    }
#else
    const int lane = threadIdx.x % WARP_SIZE;
    const int g = lane / 4, q = lane % 4;
#pragma unroll
    for (int n = 0; n < KC / 8; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            aw[(g + 8 * (i >> 1)) * LP + 8 * n + 2 * q + (i & 1)] = to_x(a[n][i]);
        }
    }
    __syncwarp();
    accumulate_rows<DP, KC, LD, LP>(acc, aw, b);
    __syncwarp();  // aw is rewritten by the next call
#endif
}

/// Writes a warp's accumulators acc (16 × DP) to rows first.. of `dst` (row stride
/// `stride`), rows from `limit` and columns from `d` left out.
template <int DP>
__device__ __forceinline__ void store_rows(floatX* dst, const float (&acc)[DP / 8][4],
                                           int first, int limit, int d, size_t stride) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int g = lane / 4, q = lane % 4;
#pragma unroll
    for (int n = 0; n < DP / 8; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = first + g + 8 * (i >> 1), col = 8 * n + 2 * q + (i & 1);
            if (row < limit && col < d) {
                dst[row * stride + col] = to_x(acc[n][i]);
            }
        }
    }
}

/// The fused forward of one tile of ROWS = 16·WARPS query rows of one (batch, head),
/// straight from the fused rows: out (B, Tq, C) and each row's base-2 log-sum-exp
/// lse (B·H, Tq) = log₂ Σ_j 2^(S_ij·log₂e) from qkv (B, T, 3C), query row i at
/// position q0 + i seeing keys 0..=q0+i, S = scale·Q·Kᵀ. Q·Kᵀ and P·V run on 16×8
/// tiles (`tile_product`) over keys in chunks of KC:
/// one pass, flash attention's online softmax: per chunk the scores (f32, never
/// stored), the rows' new max m (over each row's four lanes), P = 2^(S − m)
/// multiplied by V (`accumulate_tiles`) into the warp's accumulators, which are
/// first rescaled by 2^(m_old − m); at the end Y = P̃·V / Σ.
/// Scores are never rounded to bf16: the exponential would amplify that rounding.
/// `packed`: the heads' rows are read in 16-byte packs (D a multiple of PACK, qkv
/// aligned).
template <int DP, int WARPS, int KC>
__device__ __forceinline__ void attention_forward_tile(floatX* out, float* lse,
                                                       const floatX* qkv, int t, int tq,
                                                       int q0, int h, int d, float scale,
                                                       int packed) {
    using G = Tiles<DP, WARPS, KC>;
    constexpr int BQ = G::ROWS, LD = G::LD, LP = G::LP;
    static_assert(shared_bytes<DP, WARPS, KC>(1, 2, 1) <= MAX_STATIC_SHARED, "shared memory");
    alignas(16) __shared__ floatX qs[BQ * LD];
    alignas(16) __shared__ floatX ks[KC * LD];
    alignas(16) __shared__ floatX vs[KC * LD];
    alignas(16) __shared__ floatX ps[WARPS * 16 * LP];
    const auto [bh, head, bb, row0, warp, lane, g, q, c, stride, rows] =
        place<WARPS>(qkv, t, h, d);
    load_head_rows<DP, LD>(qs, rows + (q0 + row0) * stride, BQ, tq - row0, d, stride, packed);
    // Keys the block's rows see, and the warp's rows (none past the last row).
    const int block_keys = q0 + min(row0 + BQ, tq);
    const int first = row0 + 16 * warp;
    const int warp_keys = first < tq ? q0 + min(first + 16, tq) : 0;
    const int chunks = (block_keys + KC - 1) / KC;
    const int visible[2] = {q0 + first + g + 1, q0 + first + g + 9};
    const floatX* qw = qs + 16 * warp * LD;
    const float scale_log2 = scale * LOG2E;
    // One pass: each row's running max (the same in its four lanes) and each lane's
    // part of the row's sum; Y accumulates unnormalized and is rescaled whenever
    // the max grows.
    float row_max[2] = {FLT_LOWEST, FLT_LOWEST}, part_sum[2] = {0.0f, 0.0f};
    float y[DP / 8][4] = {};
    floatX* pw = ps + warp * 16 * LP;
    for (int chunk = 0; chunk < chunks; chunk++) {
        // Keys and values [j0, j0 + KC) of the head, rows past T and columns past D zero.
        __syncthreads();  // every warp is done with the last chunk
        const floatX* keys = rows + chunk * KC * stride + c;
        load_head_rows<DP, LD>(ks, keys, KC, t - chunk * KC, d, stride, packed);
        load_head_rows<DP, LD>(vs, keys + c, KC, t - chunk * KC, d, stride, packed);
        __syncthreads();
        if (chunk * KC >= warp_keys) {
            continue;
        }
        float s[KC / 8][4];
        float chunk_max[2] = {FLT_LOWEST, FLT_LOWEST};
#pragma unroll
        for (int n = 0; n < KC / 8; n++) {
            scores_of<DP, LD>(s[n], qw, ks + 8 * n * LD, scale_log2);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = i >> 1, j = chunk * KC + 8 * n + 2 * q + (i & 1);
                chunk_max[r] = j < visible[r] ? fmaxf(chunk_max[r], s[n][i]) : chunk_max[r];
            }
        }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            for (int offset = 1; offset < 4; offset <<= 1) {
                const float other = __shfl_xor_sync(FULL_MASK, chunk_max[r], offset);
                chunk_max[r] = fmaxf(chunk_max[r], other);
            }
            const float new_max = fmaxf(row_max[r], chunk_max[r]);
            alpha[r] = exp2_approx(row_max[r] - new_max);
            row_max[r] = new_max;
            part_sum[r] *= alpha[r];
        }
#pragma unroll
        for (int n = 0; n < KC / 8; n++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = i >> 1, j = chunk * KC + 8 * n + 2 * q + (i & 1);
                s[n][i] = j < visible[r] ? exp2_approx(s[n][i] - row_max[r]) : 0.0f;  // P
                part_sum[r] += s[n][i];
            }
        }
#pragma unroll
        for (int n = 0; n < DP / 8; n++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                y[n][i] *= alpha[i >> 1];
            }
        }
        accumulate_tiles<DP, KC, LD, LP>(y, s, pw, vs);
    }
    // Each row's sum over its four lanes; its log-sum-exp, and Y / Σ.
    float inv_sum[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float row_sum = part_sum[r];
        for (int offset = 1; offset < 4; offset <<= 1) {
            row_sum += __shfl_xor_sync(FULL_MASK, row_sum, offset);
        }
        inv_sum[r] = 1.0f / row_sum;
        const int row = first + g + 8 * r;
        if (q == 0 && row < tq) {
            lse[(size_t)bh * tq + row] = row_max[r] + log2f(row_sum);
        }
    }
#pragma unroll
    for (int n = 0; n < DP / 8; n++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            y[n][i] *= inv_sum[i >> 1];
        }
    }
    store_rows<DP>(out + bb * tq * c + head * d, y, first, tq, d, c);
}

/// Loads `n` f32 values of a row's statistics from src[0..limit) into dst, zero past
/// it; the block's threads share them.
__device__ __forceinline__ void load_stats(float* dst, const float* src, int n, int limit) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        dst[i] = i < limit ? src[i] : 0.0f;
    }
}

/// dQ of one tile of ROWS = 16·WARPS query rows of one (batch, head), and each row's
/// Dᵢ = Σ_d dYᵢ·Yᵢ into drow (B·H, T) for `attention_backward_dkv_tile` (from Y and
/// dY in shared memory, each row's two halves summed by two lanes). Over keys
/// in chunks of KC (keys 0..=i for row i): S again, P = 2^(S − lse), dP = dY·Vᵀ,
/// dS = P ∘ (dP − D)·scale rounded to floatX in the warp's shared tile, dQ += dS·K.
/// dout (B, T, C) and out (B, T, C) are the forward's dY and Y, lse its log-sum-exp.
template <int DP, int WARPS, int KC>
__device__ __forceinline__ void attention_backward_dq_tile(floatX* dqkv, float* drow,
                                                           const floatX* dout,
                                                           const floatX* out,
                                                           const floatX* qkv, const float* lse,
                                                           int t, int h, int d, float scale,
                                                           int packed) {
    using G = Tiles<DP, WARPS, KC>;
    constexpr int BQ = G::ROWS, LD = G::LD, LP = G::LP;
    static_assert(shared_bytes<DP, WARPS, KC>(3, 2, 1) <= MAX_STATIC_SHARED, "shared memory");
    alignas(16) __shared__ floatX qs[BQ * LD];
    alignas(16) __shared__ floatX dys[BQ * LD];
    alignas(16) __shared__ floatX ys[BQ * LD];
    alignas(16) __shared__ floatX ks[KC * LD];
    alignas(16) __shared__ floatX vs[KC * LD];
    alignas(16) __shared__ floatX ps[WARPS * 16 * LP];
    const auto [bh, head, bb, row0, warp, lane, g, q, c, stride, rows] =
        place<WARPS>(qkv, t, h, d);
    const size_t y0 = bb * t * c + head * d;  // the head's first row of Y and dY
    load_head_rows<DP, LD>(qs, rows + row0 * stride, BQ, t - row0, d, stride, packed);
    load_head_rows<DP, LD>(dys, dout + y0 + row0 * c, BQ, t - row0, d, c, packed);
    load_head_rows<DP, LD>(ys, out + y0 + row0 * c, BQ, t - row0, d, c, packed);
    __syncthreads();
    const int first = row0 + 16 * warp;
    const int warp_keys = first < t ? min(first + 16, t) : 0;
    const int chunks = (min(row0 + BQ, t) + KC - 1) / KC;
    const int visible[2] = {first + g + 1, first + g + 9};
    const floatX* qw = qs + 16 * warp * LD;
    const floatX* dyw = dys + 16 * warp * LD;
    // Dᵢ of the warp's 16 rows: lanes 2r and 2r + 1 sum the two halves of row r's
    // columns (zero past D); lane 4g + q keeps those of its rows g and g + 8.
    float sum = 0.0f;
    const floatX* yw = ys + 16 * warp * LD;
#pragma unroll
    for (int col = (lane % 2) * DP / 2; col < (lane % 2 + 1) * DP / 2; col++) {
        sum += to_f32(dyw[lane / 2 * LD + col]) * to_f32(yw[lane / 2 * LD + col]);
    }
    sum += __shfl_xor_sync(FULL_MASK, sum, 1);
    if (lane % 2 == 0 && first + lane / 2 < t) {
        drow[(size_t)bh * t + first + lane / 2] = sum;
    }
    const float rowsum[2] = {__shfl_sync(FULL_MASK, sum, 2 * g),
                             __shfl_sync(FULL_MASK, sum, 2 * g + 16)};
    float row_lse[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = first + g + 8 * r;
        row_lse[r] = row < t ? lse[(size_t)bh * t + row] : 0.0f;
    }
    const float scale_log2 = scale * LOG2E;
    float dq[DP / 8][4] = {};
    floatX* pw = ps + warp * 16 * LP;
    for (int chunk = 0; chunk < chunks; chunk++) {
        __syncthreads();  // every warp is done with the last chunk
        const floatX* keys = rows + chunk * KC * stride + c;
        load_head_rows<DP, LD>(ks, keys, KC, t - chunk * KC, d, stride, packed);
        load_head_rows<DP, LD>(vs, keys + c, KC, t - chunk * KC, d, stride, packed);
        __syncthreads();
        if (chunk * KC >= warp_keys) {
            continue;
        }
        for (int n0 = 0; n0 < KC; n0 += 8) {
            float s[4], dp[4];
            scores_of<DP, LD>(s, qw, ks + n0 * LD, scale_log2);
            scores_of<DP, LD>(dp, dyw, vs + n0 * LD, 1.0f);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = i >> 1, j = chunk * KC + n0 + 2 * q + (i & 1);
                const float p = j < visible[r] ? exp2_approx(s[i] - row_lse[r]) : 0.0f;
                pw[(g + 8 * r) * LP + n0 + 2 * q + (i & 1)] = to_x(p * (dp[i] - rowsum[r]) * scale);
            }
        }
        __syncwarp();
        accumulate_rows<DP, KC, LD, LP>(dq, pw, ks);
        __syncwarp();  // pw is rewritten by the next chunk
    }
    store_rows<DP>(dqkv + bb * t * stride + head * d, dq, first, t, d, stride);
}

/// dK and dV of one tile of ROWS = 16·WARPS keys of one (batch, head), over the
/// queries that see them (i ≥ j for key j) in chunks of KC: Sᵀ = scale·K·Qᵀ,
/// Pᵀ = 2^(Sᵀ − lse), dPᵀ = V·dYᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − D)·scale, with lse and D of
/// each query row (`attention_backward_dq_tile`'s drow); Pᵀ and dSᵀ rounded to
/// floatX in the warp's shared tiles, then dV += Pᵀ·dY and dK += dSᵀ·Q.
template <int DP, int WARPS, int KC>
__device__ __forceinline__ void attention_backward_dkv_tile(floatX* dqkv, const floatX* dout,
                                                            const floatX* qkv, const float* lse,
                                                            const float* drow, int t, int h,
                                                            int d, float scale, int packed) {
    using G = Tiles<DP, WARPS, KC>;
    constexpr int BK = G::ROWS, LD = G::LD, LP = G::LP;
    static_assert(shared_bytes<DP, WARPS, KC>(2, 2, 2) + 2 * KC * 4 <= MAX_STATIC_SHARED,
                  "shared memory");
    alignas(16) __shared__ floatX ks[BK * LD];
    alignas(16) __shared__ floatX vs[BK * LD];
    alignas(16) __shared__ floatX qs[KC * LD];
    alignas(16) __shared__ floatX dys[KC * LD];
    alignas(16) __shared__ floatX ps[WARPS * 16 * LP];
    alignas(16) __shared__ floatX dss[WARPS * 16 * LP];
    __shared__ float lses[KC], rowsums[KC];
    const auto [bh, head, bb, key0, warp, lane, g, q, c, stride, rows] =
        place<WARPS>(qkv, t, h, d);
    const size_t y0 = bb * t * c + head * d;  // the head's first row of Y and dY
    load_head_rows<DP, LD>(ks, rows + key0 * stride + c, BK, t - key0, d, stride, packed);
    load_head_rows<DP, LD>(vs, rows + key0 * stride + 2 * c, BK, t - key0, d, stride, packed);
    const int first = key0 + 16 * warp;
    const int keys[2] = {first + g, first + g + 8};
    const floatX* kw = ks + 16 * warp * LD;
    const floatX* vw = vs + 16 * warp * LD;
    const float scale_log2 = scale * LOG2E;
    float dk[DP / 8][4] = {}, dv[DP / 8][4] = {};
    floatX* pw = ps + warp * 16 * LP;
    floatX* dsw = dss + warp * 16 * LP;
    for (int chunk = key0 / KC; chunk * KC < t; chunk++) {
        const int i0 = chunk * KC;
        __syncthreads();  // every warp is done with the last chunk
        load_head_rows<DP, LD>(qs, rows + i0 * stride, KC, t - i0, d, stride, packed);
        load_head_rows<DP, LD>(dys, dout + y0 + i0 * c, KC, t - i0, d, c, packed);
        load_stats(lses, lse + (size_t)bh * t + i0, KC, t - i0);
        load_stats(rowsums, drow + (size_t)bh * t + i0, KC, t - i0);
        __syncthreads();
        // A warp whose keys all come after the chunk's queries, or past T, skips it.
        if (i0 + KC <= first || first >= t) {
            continue;
        }
        for (int n0 = 0; n0 < KC; n0 += 8) {
            float s[4], dp[4];
            scores_of<DP, LD>(s, kw, qs + n0 * LD, scale_log2);
            scores_of<DP, LD>(dp, vw, dys + n0 * LD, 1.0f);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = i >> 1, col = n0 + 2 * q + (i & 1), query = i0 + col;
                const bool seen = query < t && keys[r] <= query;
                const float p = seen ? exp2_approx(s[i] - lses[col]) : 0.0f;
                pw[(g + 8 * r) * LP + col] = to_x(p);
                dsw[(g + 8 * r) * LP + col] = to_x(p * (dp[i] - rowsums[col]) * scale);
            }
        }
        __syncwarp();
        accumulate_rows<DP, KC, LD, LP>(dv, pw, dys);
        accumulate_rows<DP, KC, LD, LP>(dk, dsw, qs);
        __syncwarp();  // pw and dsw are rewritten by the next chunk
    }
    floatX* dkv = dqkv + bb * t * stride + head * d;
    store_rows<DP>(dkv + c, dk, first, t, d, stride);
    store_rows<DP>(dkv + 2 * c, dv, first, t, d, stride);
}

// Each kernel for head dimensions up to 16, 32, 64 and 128 (DP), each with the
// warps and chunk (per precision) that keep its shared memory under 48 KiB; at
// D = 32 those that ran fastest on an H200 (bench/attention_gpu.py: 4 warps and
// chunks of 32 for all three; the forward's chunk of 64 spills its scores under
// the cap), and at D ≤ 32 in bf16 a cap of 64 registers lets 8 forward blocks
// share a multiprocessor (fp32's FMA tiles would spill).
// Launch: grid (B·H, ceil(rows / (16·WARPS))), block 32·WARPS, rows = Tq for the
// forward and dQ, T for dK, dV.
#define BF16_F32(bf16, f32) (sizeof(floatX) == 2 ? (bf16) : (f32))
#define SMALL_HEAD_MIN_BLOCKS BF16_F32(8, 1)
// Each kernel's parameters, and the same names passed on to its tile function.
#define FORWARD_ARGS                                                                       \
    floatX *out, float *lse, const floatX *qkv, int t, int tq, int q0, int h, int d,       \
        float scale, int packed
#define FORWARD_PASS out, lse, qkv, t, tq, q0, h, d, scale, packed
#define DQ_ARGS                                                                            \
    floatX *dqkv, float *drow, const floatX *dout, const floatX *out, const floatX *qkv,   \
        const float *lse, int t, int h, int d, float scale, int packed
#define DQ_PASS dqkv, drow, dout, out, qkv, lse, t, h, d, scale, packed
#define DKV_ARGS                                                                           \
    floatX *dqkv, const floatX *dout, const floatX *qkv, const float *lse,                 \
        const float *drow, int t, int h, int d, float scale, int packed
#define DKV_PASS dqkv, dout, qkv, lse, drow, t, h, d, scale, packed
extern "C" __global__ void __launch_bounds__(128, SMALL_HEAD_MIN_BLOCKS)
    attention_forward_d16(FORWARD_ARGS) {
    attention_forward_tile<16, 4, 32>(FORWARD_PASS);
}
extern "C" __global__ void __launch_bounds__(128, SMALL_HEAD_MIN_BLOCKS)
    attention_forward_d32(FORWARD_ARGS) {
    attention_forward_tile<32, 4, 32>(FORWARD_PASS);
}
extern "C" __global__ void attention_forward_d64(FORWARD_ARGS) {
    attention_forward_tile<64, 4, 32>(FORWARD_PASS);
}
extern "C" __global__ void attention_forward_d128(FORWARD_ARGS) {
    attention_forward_tile<128, 2, 16>(FORWARD_PASS);
}
extern "C" __global__ void attention_backward_dq_d16(DQ_ARGS) {
    attention_backward_dq_tile<16, 4, BF16_F32(32, 16)>(DQ_PASS);
}
extern "C" __global__ void attention_backward_dkv_d16(DKV_ARGS) {
    attention_backward_dkv_tile<16, 4, BF16_F32(32, 16)>(DKV_PASS);
}
extern "C" __global__ void attention_backward_dq_d32(DQ_ARGS) {
    attention_backward_dq_tile<32, 4, BF16_F32(32, 16)>(DQ_PASS);
}
extern "C" __global__ void attention_backward_dkv_d32(DKV_ARGS) {
    attention_backward_dkv_tile<32, 4, BF16_F32(32, 16)>(DKV_PASS);
}
extern "C" __global__ void attention_backward_dq_d64(DQ_ARGS) {
    attention_backward_dq_tile<64, 2, BF16_F32(64, 16)>(DQ_PASS);
}
extern "C" __global__ void attention_backward_dkv_d64(DKV_ARGS) {
    attention_backward_dkv_tile<64, 2, BF16_F32(64, 16)>(DKV_PASS);
}
extern "C" __global__ void attention_backward_dq_d128(DQ_ARGS) {
    attention_backward_dq_tile<128, 1, BF16_F32(32, 16)>(DQ_PASS);
}
extern "C" __global__ void attention_backward_dkv_d128(DKV_ARGS) {
    attention_backward_dkv_tile<128, 1, BF16_F32(32, 16)>(DKV_PASS);
}
