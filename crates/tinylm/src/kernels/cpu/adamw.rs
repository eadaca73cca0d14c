//! The AdamW update (SPEC §3) over flat slices: the whole parameter buffer of a
//! model (moments mirror it) or any single tensor, and under mixed precision the
//! parameters' bf16 copy in the same pass. The CUDA twin is `kernels/cuda/adamw.cu`.

use super::simd::{vectorized, CHUNK};
use crate::kernels::float::Element;
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
    adamw_update::<F, F>(param, None, grad, m, v, step, lr, hp, grad_scale);
}

/// [`adamw_step`], and with `copy` each new `θ` also stored there in the same pass
/// (the products' bf16 copy of the parameters, under mixed precision).
#[allow(clippy::too_many_arguments)]
pub fn adamw_update<F: Float, C: Element<F>>(
    param: &mut [F],
    copy: Option<&mut [C]>,
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
    let update = |p: &mut [F], g: &[F], m: &mut [F], v: &mut [F], copy: Option<&mut [C]>| {
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
                if let Some(copy) = copy {
                    C::store_slice(copy, p);
                }
            },
        )
    };
    let chunks = param
        .par_chunks_mut(CHUNK)
        .zip(grad.par_chunks(CHUNK))
        .zip(m.par_chunks_mut(CHUNK))
        .zip(v.par_chunks_mut(CHUNK));
    match copy {
        Some(copy) => {
            assert_eq!(
                copy.len(),
                n,
                "adamw_step: the copy must have the params' length"
            );
            chunks
                .zip(copy.par_chunks_mut(CHUNK))
                .for_each(|((((p, g), m), v), c)| update(p, g, m, v, Some(c)));
        }
        None => chunks.for_each(|(((p, g), m), v)| update(p, g, m, v, None)),
    }
}
