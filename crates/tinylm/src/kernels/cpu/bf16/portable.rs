//! The portable bf16 micro-kernel: the same bf16 values as the native kernels,
//! widened to `f32` (exact: a shift) and multiplied-added in `f32` in the order
//! `vdpbf16ps` documents (a pair's upper product, then its lower one), compiled for
//! the widest vectors the CPU has (`simd::vectorized`). Each pair costs two
//! multiplications and two additions where an `f32` product costs one FMA per value,
//! so it runs at about half the `f32` products' speed or less: a CPU without native
//! bf16 is faster in `f32`.

use super::pack::{Microkernel, Tile};
use super::round::bf16_to_f32;
use crate::kernels::cpu::simd::vectorized;

/// The portable kernel (any CPU).
pub struct Portable;

const MR: usize = 4;
const NR: usize = 16;

impl Microkernel for Portable {
    const MR: usize = MR;
    const NR: usize = NR;

    unsafe fn tile(x: Tile, c: *mut f32, ldc: usize, accumulate: bool) {
        let (kp, a, a_rs, a_ps, b) = (x.kp, x.a, x.a_rs, x.a_ps, x.b);
        vectorized(
            #[inline(always)]
            || {
                let mut acc = [[0f32; NR]; MR];
                if accumulate {
                    for (i, row) in acc.iter_mut().enumerate() {
                        row.copy_from_slice(std::slice::from_raw_parts(c.add(i * ldc), NR));
                    }
                }
                for p in 0..kp {
                    let b = std::slice::from_raw_parts(b.add(p * NR), NR);
                    let lo: [f32; NR] = std::array::from_fn(|j| bf16_to_f32(b[j] as u16));
                    let hi: [f32; NR] = std::array::from_fn(|j| bf16_to_f32((b[j] >> 16) as u16));
                    for (i, row) in acc.iter_mut().enumerate() {
                        let pair = *a.add(i * a_rs + p * a_ps);
                        let (a_lo, a_hi) =
                            (bf16_to_f32(pair as u16), bf16_to_f32((pair >> 16) as u16));
                        for j in 0..NR {
                            // Products of bf16 values are exact in f32: no FMA needed
                            // for the same result.
                            row[j] = (row[j] + a_hi * hi[j]) + a_lo * lo[j];
                        }
                    }
                }
                for (i, row) in acc.iter().enumerate() {
                    std::slice::from_raw_parts_mut(c.add(i * ldc), NR).copy_from_slice(row);
                }
            },
        )
    }
}
