// Conversions between the f32 master copies and floatX activations, and fills.

/// dst (n) floatX = src (n) f32 (round to nearest even for bf16).
/// Launch: grid ceil(n / 256), block 256; one thread per element.
extern "C" __global__ void convert_f32_to_x(floatX* dst, const float* src, size_t n) {
    const size_t i = thread_index();
    if (i < n) {
        dst[i] = to_x(src[i]);
    }
}

/// dst (n) f32 = src (n) floatX (exact).
/// Launch: grid ceil(n / 256), block 256; one thread per element.
extern "C" __global__ void convert_x_to_f32(float* dst, const floatX* src, size_t n) {
    const size_t i = thread_index();
    if (i < n) {
        dst[i] = to_f32(src[i]);
    }
}

/// dst (n) floatX = value.
/// Launch: grid ceil(n / 256), block 256; one thread per element.
extern "C" __global__ void fill(floatX* dst, float value, size_t n) {
    const size_t i = thread_index();
    if (i < n) {
        dst[i] = to_x(value);
    }
}
