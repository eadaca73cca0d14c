//! Rotary position embedding on adjacent pairs `(2k, 2k+1)` of every query and key
//! head, `θ = pos / Θ^{2k/D}` from a precomputed table.

use super::simd::vectorized;
use crate::kernels::{AttnShape, Float};
use rayon::prelude::*;

/// `cos`, `sin` tables `(context_length, D/2)` for head dimension `d`, computed in f64.
pub fn rope_tables<F: Float>(context_length: usize, d: usize, theta: f64) -> (Vec<F>, Vec<F>) {
    let half = d / 2;
    let mut cos = Vec::with_capacity(context_length * half);
    let mut sin = Vec::with_capacity(context_length * half);
    for pos in 0..context_length {
        for k in 0..half {
            let angle = pos as f64 / theta.powf(2.0 * k as f64 / d as f64);
            cos.push(F::from_f64(angle.cos()));
            sin.push(F::from_f64(angle.sin()));
        }
    }
    (cos, sin)
}

/// Rotates the query and key heads of the new rows `qkv (B, Tq, 3C)` in place; row
/// `i` of each sequence is at position `q0 + i` (see [`AttnShape`]). `inverse`
/// rotates by `-θ`: the backward pass (a rotation's transpose is its inverse),
/// applied to `dqkv`.
pub fn rope<F: Float>(qkv: &mut [F], cos: &[F], sin: &[F], s: AttnShape, inverse: bool) {
    let (c, half) = (s.c(), s.d / 2);
    qkv.par_chunks_mut(3 * c)
        .enumerate()
        .for_each(|(row, qkv)| {
            vectorized(
                #[inline(always)]
                || {
                    let pos = s.q0 + row % s.tq();
                    let cos = &cos[pos * half..(pos + 1) * half];
                    let sin = &sin[pos * half..(pos + 1) * half];
                    // The q and k parts are the first 2C channels: 2H heads of D.
                    for head in qkv[..2 * c].chunks_exact_mut(s.d) {
                        for ((pair, &cs), &sn) in head.chunks_exact_mut(2).zip(cos).zip(sin) {
                            let sn = if inverse { -sn } else { sn };
                            let (x0, x1) = (pair[0], pair[1]);
                            pair[0] = x0 * cs - x1 * sn;
                            pair[1] = x0 * sn + x1 * cs;
                        }
                    }
                },
            )
        });
}
