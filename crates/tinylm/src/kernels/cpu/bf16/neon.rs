//! The Arm BF16 micro-kernel (aarch64 with FEAT_BF16): `bfdot` multiplies 4 pairs of
//! bf16 values by one broadcast pair and adds both products into 4 `f32` lanes.
//! Its intrinsics are not stable Rust yet, so the instruction is inline assembly.
//!
//! The tile is `8 × 12`: 24 accumulators (8 rows × 3 vectors of 4 columns), three
//! vectors of `B`'s pairs and one broadcast pair of `A` per row and pair of `k`.
//! (`bfmmla`, which multiplies a 2 × 4 block by a 4 × 2 one, needs pairs of pairs
//! and is not used: no Arm machine was at hand to measure whether it pays.)

use super::pack::{Microkernel, Tile};
use std::arch::aarch64::*;
use std::arch::asm;

/// The Arm BF16 kernel.
pub struct ArmBf16;

/// Rows of the tile.
const MR: usize = 8;
/// Vectors of 4 columns in the tile.
const NV: usize = 3;
const NR: usize = 4 * NV;

impl ArmBf16 {
    /// Whether this CPU has the instructions.
    pub fn detected() -> bool {
        std::arch::is_aarch64_feature_detected!("bf16")
    }
}

impl Microkernel for ArmBf16 {
    const MR: usize = MR;
    const NR: usize = NR;

    #[target_feature(enable = "neon,bf16")]
    unsafe fn tile(x: Tile, c: *mut f32, ldc: usize, accumulate: bool) {
        let (kp, a, a_rs, a_ps, b) = (x.kp, x.a, x.a_rs, x.a_ps, x.b);
        let mut acc = [[vdupq_n_f32(0.0); NV]; MR];
        if accumulate {
            for (i, row) in acc.iter_mut().enumerate() {
                for (v, x) in row.iter_mut().enumerate() {
                    *x = vld1q_f32(c.add(i * ldc + 4 * v));
                }
            }
        }
        let rows: [*const u32; MR] = std::array::from_fn(|i| a.add(i * a_rs));
        for p in 0..kp {
            let bp = b.add(p * NR);
            let bv: [uint32x4_t; NV] = std::array::from_fn(|v| vld1q_u32(bp.add(4 * v)));
            for (row, ptr) in acc.iter_mut().zip(rows) {
                let pair = vld1q_dup_u32(ptr.add(p * a_ps));
                for (x, &bv) in row.iter_mut().zip(&bv) {
                    asm!(
                        "bfdot {acc:v}.4s, {b:v}.8h, {a:v}.8h",
                        acc = inout(vreg) *x,
                        b = in(vreg) bv,
                        a = in(vreg) pair,
                        options(pure, nomem, nostack, preserves_flags),
                    );
                }
            }
        }
        for (i, row) in acc.iter().enumerate() {
            for (v, &x) in row.iter().enumerate() {
                vst1q_f32(c.add(i * ldc + 4 * v), x);
            }
        }
    }
}
