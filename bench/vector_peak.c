// One core's peak of the two instructions the CPU products are made of: `vector_peak`
// runs a loop of 12 independent `vfmadd231ps` (f32: 16 multiply-adds) and then of 12
// `vdpbf16ps` (bf16 pairs: 32 multiply-adds into 16 f32 sums), each on its own
// accumulator so that only the throughput limits them, and prints the time per
// instruction and GFLOP/s, three times. Where `vdpbf16ps` runs at under half the
// FMA's rate, bf16 products cannot beat f32 ones on that CPU. Needs AVX512_BF16:
//
//   gcc -O2 -mavx512f bench/vector_peak.c -o target/vector_peak && target/vector_peak
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// 12 instructions `op`, accumulator zmm0..zmm11, operands zmm30 and zmm31 (zeros).
#define ONE(op, i) op " %%zmm30, %%zmm31, %%zmm" #i "\n"
#define TWELVE(op)                                                                        \
    ONE(op, 0) ONE(op, 1) ONE(op, 2) ONE(op, 3) ONE(op, 4) ONE(op, 5) ONE(op, 6) ONE(op, 7) \
    ONE(op, 8) ONE(op, 9) ONE(op, 10) ONE(op, 11)

// Seconds for `n` iterations of 12 instructions `op`.
#define TIME(op, n)                                                                       \
    ({                                                                                    \
        long left = (n);                                                                  \
        double t = now();                                                                 \
        __asm__ volatile("vpxord %%zmm30, %%zmm30, %%zmm30\n"                             \
                         "vpxord %%zmm31, %%zmm31, %%zmm31\n"                             \
                         "1:\n" TWELVE(op) "dec %0\n"                                     \
                         "jnz 1b\n"                                                       \
                         : "+r"(left)                                                     \
                         :                                                                \
                         : "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", \
                           "zmm8", "zmm9", "zmm10", "zmm11", "zmm30", "zmm31", "cc");     \
        now() - t;                                                                        \
    })

int main(void) {
    const long n = 100000000;
    for (int round = 0; round < 3; round++) {
        double fma = TIME("vfmadd231ps", n), bf16 = TIME("vdpbf16ps", n);
        printf("one core: vfmadd231ps %.3f ns each, %.0f GFLOP/s; "
               "vdpbf16ps %.3f ns each, %.0f GFLOP/s\n",
               fma / (12.0 * n) * 1e9, 12.0 * n * 32 / fma * 1e-9,
               bf16 / (12.0 * n) * 1e9, 12.0 * n * 64 / bf16 * 1e-9);
    }
    return 0;
}
