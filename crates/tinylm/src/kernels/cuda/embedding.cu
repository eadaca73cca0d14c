// Token embedding: a row lookup from the f32 master table and its scatter-add
// backward into the f32 gradient. CPU twin: kernels/cpu/embedding.rs.

/// out (N, C) = table[ids], table (V, C) f32 (ids checked by the caller). A thread
/// writes `width` consecutive values: a pack when `packed` (C a multiple of PACK,
/// out and table 16-byte aligned), read in 16-byte f32 packs, else one value.
/// Launch: grid ceil(N·C / (256·width)), block 256.
extern "C" __global__ void embedding_forward(floatX* out, const unsigned int* ids,
                                             const float* table, int n, int c, int packed) {
    // 32-bit index arithmetic (the caller checks N·C < 2^32).
    const int width = packed ? PACK : 1;
    const unsigned int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= (unsigned int)n * c / width) {
        return;
    }
    const unsigned int i = p * width;
    const float* row = table + (size_t)ids[i / c] * c + i % c;
    float v[PACK];
    load_f32_pack(v, row, packed);
    store_pack(out + i, v, packed);
}

/// dtable (V, C) f32 += scatter(dout (N, C)) at rows ids (N). Rows that repeat are
/// added with atomics, so their f32 sum may round differently from run to run.
/// Launch: grid ceil(N·C / 256), block 256; one thread per element of dout.
extern "C" __global__ void embedding_backward(float* dtable, const floatX* dout,
                                              const unsigned int* ids, int n, int c) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (unsigned int)n * c) {
        return;
    }
    const unsigned int row = i / c;
    const unsigned int col = i % c;
    atomicAdd(&dtable[(size_t)ids[row] * c + col], to_f32(dout[i]));
}
