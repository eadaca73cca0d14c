//! The AdamW update (SPEC §3) over flat slices: the whole parameter buffer of a
//! model (moments mirror it) or any single tensor. The CUDA twin is
//! `kernels/cuda/adamw.cu`.

use super::simd::{vectorized, CHUNK};
use crate::kernels::{AdamWParams, Float};
use rayon::prelude::*;

/// AdamW step number `step` (from 1) on one array, exactly as SPEC §3:
/// `g ← s·g`; `m ← β1 m + (1−β1) g`; `v ← β2 v + (1−β2) g²`;
/// `α_t = α sqrt(1−β2^t)/(1−β1^t)`; `θ ← θ − α_t m/(sqrt(v)+ε)`; `θ ← θ − αλθ`,
/// with `s = grad_scale` (the clipping factor of [`clip_scale`](crate::kernels::clip_scale)).
#[allow(clippy::too_many_arguments)]
pub fn adamw_step<F: Float>(
    param: &mut [F],
    grad: &[F],
    m: &mut [F],
    v: &mut [F],
    step: u64,
    lr: f64,
    hp: &AdamWParams,
    grad_scale: f32,
) {
    let n = param.len();
    assert!(
        grad.len() == n && m.len() == n && v.len() == n,
        "adamw_step: param, grad, m and v must have the same length"
    );
    assert!(step >= 1, "adamw_step: steps count from 1");
    let t = step as i32;
    let alpha_t = F::from_f64(lr * (1.0 - hp.beta2.powi(t)).sqrt() / (1.0 - hp.beta1.powi(t)));
    let f = F::from_f64;
    let (b1, b2, eps) = (f(hp.beta1), f(hp.beta2), f(hp.eps));
    let decay = f(lr * hp.weight_decay);
    let (one, grad_scale) = (F::ONE, F::from_f64(grad_scale as f64));
    param
        .par_chunks_mut(CHUNK)
        .zip(grad.par_chunks(CHUNK))
        .zip(m.par_chunks_mut(CHUNK))
        .zip(v.par_chunks_mut(CHUNK))
        .for_each(|(((p, g), m), v)| {
            vectorized(
                #[inline(always)]
                || {
                    for i in 0..p.len() {
                        let g = g[i] * grad_scale;
                        m[i] = b1 * m[i] + (one - b1) * g;
                        v[i] = b2 * v[i] + (one - b2) * g * g;
                        let theta = p[i] - alpha_t * m[i] / (v[i].sqrt() + eps);
                        p[i] = theta - decay * theta;
                    }
                },
            )
        });
}
