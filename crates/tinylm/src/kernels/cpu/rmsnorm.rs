//! RMSNorm: `out = x / sqrt(mean(x²) + eps) ⊙ g`, statistics in the working
//! precision (f32 for the model); the output stored as the buffer's [`Element`]
//! says (bf16 when only matrix products read it).

use super::simd::{dot3, sum_by, vectorized, CHUNK};
use crate::kernels::float::{store_tiled, Element, Float};
use rayon::prelude::*;

/// `out (N, C)`, `rstd (N)` = `1 / sqrt(mean(x²) + eps)` from `x (N, C)`, `g (C)`
/// (stored as `G`: `F`, or the bf16 of a model mapped from a bf16 file).
pub fn rmsnorm_forward<F: Float, O: Element<F>, G: Element<F>>(
    out: &mut [O],
    rstd: &mut [F],
    x: &[F],
    g: &[G],
    eps: f64,
) {
    let c = g.len();
    let rows_per_task = (CHUNK / c).max(1);
    out.par_chunks_mut(c * rows_per_task)
        .zip(rstd.par_chunks_mut(rows_per_task))
        .zip(x.par_chunks(c * rows_per_task))
        .for_each(|((out, rstd), x)| {
            vectorized(
                #[inline(always)]
                || {
                    for ((out, r), x) in out.chunks_exact_mut(c).zip(rstd).zip(x.chunks_exact(c)) {
                        let ms = sum_by(x, |v| v * v) / F::from_f64(c as f64);
                        *r = F::ONE / (ms + F::from_f64(eps)).sqrt();
                        let s = *r;
                        store_tiled(
                            out,
                            #[inline(always)]
                            |r, tile| {
                                for ((t, &v), &g) in tile.iter_mut().zip(&x[r.clone()]).zip(&g[r]) {
                                    *t = v * s * g.load();
                                }
                            },
                        );
                    }
                },
            )
        });
}

/// Backward of [`rmsnorm_forward`]: with `x̂ = x·rstd`,
/// `dx = rstd · (dout⊙g − x̂ · mean(dout⊙g⊙x̂))` (overwritten, or added when
/// `accumulate`), `dg += Σ_rows dout ⊙ x̂`.
pub fn rmsnorm_backward<F: Float>(
    dx: &mut [F],
    dg: &mut [F],
    dout: &[F],
    x: &[F],
    g: &[F],
    rstd: &[F],
    accumulate: bool,
) {
    let c = g.len();
    let rows_per_task = (CHUNK / c).max(1);
    dx.par_chunks_mut(c * rows_per_task)
        .zip(dout.par_chunks(c * rows_per_task))
        .zip(x.par_chunks(c * rows_per_task))
        .zip(rstd.par_chunks(rows_per_task))
        .for_each(|(((dx, dout), x), rstd)| {
            vectorized(
                #[inline(always)]
                || {
                    for (((dx, dout), x), &r) in dx
                        .chunks_exact_mut(c)
                        .zip(dout.chunks_exact(c))
                        .zip(x.chunks_exact(c))
                        .zip(rstd)
                    {
                        let dot = dot3(dout, g, x);
                        // mean(dout⊙g⊙x̂) · rstd, folded: x̂·mean(…)·rstd = x·r³·dot/C.
                        let k = dot * r * r / F::from_f64(c as f64);
                        for (((o, &d), &g), &x) in dx.iter_mut().zip(dout).zip(g).zip(x) {
                            let v = r * (d * g - x * k);
                            *o = if accumulate { *o + v } else { v };
                        }
                    }
                },
            )
        });
    for ((dout, x), &r) in dout.chunks_exact(c).zip(x.chunks_exact(c)).zip(rstd) {
        for ((dg, &d), &x) in dg.iter_mut().zip(dout).zip(x) {
            *dg += d * x * r;
        }
    }
}
