// Cross-entropy over the LM head's logits fused with its gradient: one block per
// row, two passes over it (the second reads it back from cache). CPU twin:
// kernels/cpu/cross_entropy.rs.
//
// The exponentials are base 2 of y = x·log2(e), each one FFMA and one MUFU.EX2:
// the natural `expf` is about eight instructions, and with an online (max, sum)
// merge per pack it was the kernel's largest cost. A logit is exponentiated once in
// each pass.

#define LN2 0.6931471805599453f

/// losses (N) f32 = logsumexp(logits[n]) − logits[n, targets[n]] for logits (N, V);
/// with `grad`, each row is overwritten by (softmax − onehot(target)) / rows, `rows`
/// the positions of the whole batch these N are part of. A thread reads `width`
/// consecutive logits at a time: a 16-byte pack when `packed` (V a multiple of
/// PACK, the logits 16-byte aligned), else one.
/// Launch: grid N, block 256 (a multiple of 32, at most 1024); one block per row.
extern "C" __global__ void cross_entropy_forward_backward(floatX* logits, float* losses,
                                                          const unsigned int* targets, int rows,
                                                          int v, int grad, int packed) {
    const int row = blockIdx.x;
    const int width = packed ? PACK : 1;
    floatX* x = logits + (size_t)row * v;
    const unsigned int target = targets[row];
    // Read by every thread before the barrier that precedes the first write.
    const float target_logit = to_f32(x[target]);
    // Pass 1: this thread's max m of y and s = Σ 2^{y − m}; s is rescaled only when
    // a pack raises m (rarely, after the first packs).
    float m = FLT_LOWEST;
    float s = 0.0f;
    float xv[PACK];
    for (int j = threadIdx.x * width; j < v; j += blockDim.x * width) {
        load_pack(xv, x + j, packed);
        float pack_max = xv[0];
#pragma unroll
        for (int k = 1; k < PACK; k++) {
            pack_max = k < width ? fmaxf(pack_max, xv[k]) : pack_max;
        }
        const float y_max = pack_max * LOG2E;
        if (y_max > m) {
            s *= exp2_approx(m - y_max);
            m = y_max;
        }
#pragma unroll
        for (int k = 0; k < PACK; k++) {
            s += k < width ? exp2_approx(fmaf(xv[k], LOG2E, -m)) : 0.0f;
        }
    }
    // The row's max, then its sum: one rescaling exponential a thread (an idle
    // thread's s = 0 stays 0).
    const float row_max = block_max(m);
    const float sum = block_sum(s * exp2_approx(m - row_max));
    if (threadIdx.x == 0) {
        losses[row] = (row_max + log2f(sum)) * LN2 - target_logit;
    }
    if (!grad) {
        return;
    }
    // Pass 2: the gradient; the thread that writes the target's pack then corrects
    // the target (its own later write, so it lands last).
    const float inv_rows = 1.0f / rows;
    const float scale = inv_rows / sum;
    for (int j = threadIdx.x * width; j < v; j += blockDim.x * width) {
        load_pack(xv, x + j, packed);
#pragma unroll
        for (int k = 0; k < PACK; k++) {
            xv[k] = exp2_approx(fmaf(xv[k], LOG2E, -row_max)) * scale;
        }
        store_pack(x + j, xv, packed);
    }
    if ((int)(target / width) % blockDim.x == threadIdx.x) {
        x[target] = to_x(exp2_approx(fmaf(target_logit, LOG2E, -row_max)) * scale - inv_rows);
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
