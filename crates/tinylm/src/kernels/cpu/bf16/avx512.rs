//! The AVX512_BF16 micro-kernel (x86-64: AMD Zen 4 and later, Intel Cooper Lake,
//! Sapphire Rapids and later): `vdpbf16ps` multiplies 16 pairs of bf16 values by
//! one broadcast pair and adds both products into 16 `f32` lanes — 32
//! multiply-adds per instruction, twice an `f32` FMA's 16.
//!
//! The tile is `8 × 48`: 24 accumulators (8 rows × 3 vectors of 16 columns), three
//! vectors of `B`'s pairs loaded per pair of `k` and each row's pair of `A`
//! broadcast once, 24 `vdpbf16ps` per 11 loads.

use super::pack::Microkernel;
use std::arch::x86_64::*;

/// The AVX512_BF16 kernel.
pub struct Avx512Bf16;

/// Rows of the tile.
const MR: usize = 8;
/// Vectors of 16 columns in the tile.
const NV: usize = 3;
const NR: usize = 16 * NV;

impl Avx512Bf16 {
    /// Whether this CPU has the instructions.
    pub fn detected() -> bool {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
    }
}

impl Microkernel for Avx512Bf16 {
    const MR: usize = MR;
    const NR: usize = NR;

    unsafe fn tile(
        kp: usize,
        a: *const u32,
        a_rs: usize,
        a_ps: usize,
        b: *const u32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        tile(kp, a, a_rs, a_ps, b, c, ldc, accumulate)
    }
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile(
    kp: usize,
    a: *const u32,
    a_rs: usize,
    a_ps: usize,
    b: *const u32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
    if accumulate {
        for (i, row) in acc.iter_mut().enumerate() {
            for (v, x) in row.iter_mut().enumerate() {
                *x = _mm512_loadu_ps(c.add(i * ldc + 16 * v));
            }
        }
    }
    let rows: [*const u32; MR] = std::array::from_fn(|i| a.add(i * a_rs));
    for p in 0..kp {
        let bp = b.add(p * NR);
        let bv: [__m512bh; NV] =
            std::array::from_fn(|v| std::mem::transmute(_mm512_loadu_si512(bp.add(16 * v).cast())));
        for (row, ptr) in acc.iter_mut().zip(rows) {
            let pair: __m512bh = std::mem::transmute(_mm512_set1_epi32(*ptr.add(p * a_ps) as i32));
            for (x, &bv) in row.iter_mut().zip(&bv) {
                *x = _mm512_dpbf16_ps(*x, bv, pair);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (v, &x) in row.iter().enumerate() {
            _mm512_storeu_ps(c.add(i * ldc + 16 * v), x);
        }
    }
}
