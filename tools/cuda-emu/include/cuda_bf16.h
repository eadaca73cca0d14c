// The emulated GPU's `cuda_bf16.h`: `__nv_bfloat16` as its 16 bits, converted
// from float with round-to-nearest-even (NaN to the canonical 0x7fff) and to float
// exactly; arithmetic goes through float and rounds once, like the sm_80 operators.
#pragma once

#include <cstdint>
#include <cstring>

struct __nv_bfloat16;
static inline __nv_bfloat16 __float2bfloat16_rn(float x);
static inline float __bfloat162float(__nv_bfloat16 x);

struct __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f);
    __nv_bfloat16(double f) : __nv_bfloat16((float)f) {}
    __nv_bfloat16(int i) : __nv_bfloat16((float)i) {}
    operator float() const;
};
typedef __nv_bfloat16 nv_bfloat16;

static inline __nv_bfloat16 __float2bfloat16_rn(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    __nv_bfloat16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        b.__x = 0x7fff;
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
        b.__x = (unsigned short)(u >> 16);
    }
    return b;
}
static inline __nv_bfloat16 __float2bfloat16(float x) { return __float2bfloat16_rn(x); }
static inline float __bfloat162float(__nv_bfloat16 x) {
    uint32_t u = (uint32_t)x.__x << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline __nv_bfloat16 __double2bfloat16(double x) { return __float2bfloat16_rn((float)x); }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short x) {
    __nv_bfloat16 b;
    b.__x = x;
    return b;
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 x) { return x.__x; }

inline __nv_bfloat16::__nv_bfloat16(float f) : __x(__float2bfloat16_rn(f).__x) {}
inline __nv_bfloat16::operator float() const { return __bfloat162float(*this); }

#define CUEMU_BF16_OP(op, name)                                                        \
    static inline __nv_bfloat16 name(__nv_bfloat16 a, __nv_bfloat16 b) {               \
        return __float2bfloat16_rn(__bfloat162float(a) op __bfloat162float(b));        \
    }                                                                                  \
    static inline __nv_bfloat16 operator op(__nv_bfloat16 a, __nv_bfloat16 b) {        \
        return name(a, b);                                                             \
    }
CUEMU_BF16_OP(+, __hadd)
CUEMU_BF16_OP(-, __hsub)
CUEMU_BF16_OP(*, __hmul)
CUEMU_BF16_OP(/, __hdiv)
#undef CUEMU_BF16_OP
