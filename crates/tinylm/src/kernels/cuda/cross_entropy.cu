// Cross-entropy over the LM head's logits fused with its gradient: one block per
// row, an online (max, sum) pass over the vocabulary in strided chunks, then the
// gradient written in place. CPU twin: kernels/cpu/cross_entropy.rs.

/// Combines two online-softmax partials (max m, sum s of e^{x − m}).
__device__ __forceinline__ void online_merge(float& m, float& s, float m2, float s2) {
    const float new_max = fmaxf(m, m2);
    s = s * expf(m - new_max) + s2 * expf(m2 - new_max);
    m = new_max;
}

/// losses (N) f32 = logsumexp(logits[n]) − logits[n, targets[n]] for logits (N, V);
/// with `grad`, each row is overwritten by (softmax − onehot(target)) / rows, `rows`
/// the positions of the whole batch these N are part of. A thread reads `width`
/// consecutive logits at a time: a 16-byte pack when `packed` (V a multiple of
/// PACK, the logits 16-byte aligned), else one.
/// Launch: grid N, block 512 (a multiple of 32, at most 1024); one block per row.
extern "C" __global__ void cross_entropy_forward_backward(floatX* logits, float* losses,
                                                          const unsigned int* targets, int rows,
                                                          int v, int grad, int packed) {
    __shared__ float warp_max_s[WARP_SIZE];
    __shared__ float warp_sum_s[WARP_SIZE];
    const int row = blockIdx.x;
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    const int width = packed ? PACK : 1;
    floatX* x = logits + (size_t)row * v;
    float m = FLT_LOWEST;
    float s = 0.0f;
    float xv[PACK];
    for (int j = threadIdx.x * width; j < v; j += blockDim.x * width) {
        load_pack(xv, x + j, packed);
        // The pack's own (max, sum), then one merge: PACK + 1 exponentials.
        float pack_max = xv[0];
#pragma unroll
        for (int k = 1; k < PACK; k++) {
            pack_max = k < width ? fmaxf(pack_max, xv[k]) : pack_max;
        }
        float pack_sum = 0.0f;
#pragma unroll
        for (int k = 0; k < PACK; k++) {
            pack_sum += k < width ? expf(xv[k] - pack_max) : 0.0f;
        }
        online_merge(m, s, pack_max, pack_sum);
    }
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        const float m2 = __shfl_xor_sync(FULL_MASK, m, offset);
        const float s2 = __shfl_xor_sync(FULL_MASK, s, offset);
        online_merge(m, s, m2, s2);
    }
    if (lane == 0) {
        warp_max_s[warp] = m;
        warp_sum_s[warp] = s;
    }
    __syncthreads();
    m = FLT_LOWEST;
    s = 0.0f;
    for (int w = 0; w < warps; w++) {
        online_merge(m, s, warp_max_s[w], warp_sum_s[w]);
    }
    const unsigned int target = targets[row];
    if (threadIdx.x == 0) {
        losses[row] = (m - to_f32(x[target])) + logf(s);
    }
    if (!grad) {
        return;
    }
    // Thread 0 has read x[target] above before any thread overwrites it.
    __syncthreads();
    const float inv_rows = 1.0f / rows;
    const float k_scale = inv_rows / s;
    for (int j = threadIdx.x * width; j < v; j += blockDim.x * width) {
        load_pack(xv, x + j, packed);
#pragma unroll
        for (int k = 0; k < PACK; k++) {
            float g = expf(xv[k] - m) * k_scale;
            if (j + k == (int)target) {
                g -= inv_rows;
            }
            xv[k] = g;
        }
        store_pack(x + j, xv, packed);
    }
}

/// loss (1) f32 = Σ losses (N) / rows, summed in f64 in a fixed order; with
/// `accumulate`, added to the loss already there (the earlier parts of the batch).
/// Launch: grid 1, block 1024.
extern "C" __global__ void cross_entropy_mean(float* loss, const float* losses, int n, int rows,
                                              int accumulate) {
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        sum += losses[i];
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
        const float part = (float)(sum / rows);
        *loss = accumulate ? *loss + part : part;
    }
}
