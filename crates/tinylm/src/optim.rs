//! Optimizers (SPEC §3): AdamW, the SGD example, the cosine learning-rate schedule
//! with warm-up and global-norm gradient clipping.
//!
//! Every function works on flat `f32` slices: the model's whole parameter buffer
//! (moments mirror it) or any single tensor (the Python API). Element-wise work
//! runs in fixed-size chunks on rayon; reductions sum the chunks in order, so the
//! results are bit-identical whatever the number of threads.

use crate::kernels::cpu::{sum_by, vectorized};
use crate::kernels::Float;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Elements per rayon task.
const CHUNK: usize = 1 << 15;

/// AdamW hyper-parameters (SPEC defaults β = (0.9, 0.999), ε = 1e-8).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdamWParams {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWParams {
    fn default() -> Self {
        AdamWParams {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// AdamW state: first and second moments mirroring the parameter buffer (host
/// vectors, or a backend's buffers while a model trains), and the number of steps taken.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamW<M = Vec<f32>> {
    pub hp: AdamWParams,
    pub m: M,
    pub v: M,
    pub step: u64,
}

impl AdamW {
    /// Zero moments for `n` parameters.
    pub fn new(n: usize, hp: AdamWParams) -> Self {
        AdamW {
            hp,
            m: vec![0.0; n],
            v: vec![0.0; n],
            step: 0,
        }
    }

    /// One update of a host buffer with learning rate `lr`; gradients are
    /// multiplied by `grad_scale` first (the clipping factor of [`clip_scale`]).
    pub fn update(&mut self, params: &mut [f32], grads: &[f32], lr: f64, grad_scale: f32) {
        self.step += 1;
        adamw_step(
            params,
            grads,
            &mut self.m,
            &mut self.v,
            self.step,
            lr,
            &self.hp,
            grad_scale,
        );
    }
}

/// AdamW step number `step` (from 1) on one array, exactly as SPEC §3:
/// `g ← s·g`; `m ← β1 m + (1−β1) g`; `v ← β2 v + (1−β2) g²`;
/// `α_t = α sqrt(1−β2^t)/(1−β1^t)`; `θ ← θ − α_t m/(sqrt(v)+ε)`; `θ ← θ − αλθ`.
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

/// The SPEC's SGD example, step `t` from 0: `θ ← θ − α/sqrt(t+1) · g`.
pub fn sgd_step(param: &mut [f32], grad: &[f32], t: u64, lr: f64) {
    assert_eq!(
        param.len(),
        grad.len(),
        "sgd_step: param and grad lengths differ"
    );
    let a = (lr / ((t + 1) as f64).sqrt()) as f32;
    param
        .par_chunks_mut(CHUNK)
        .zip(grad.par_chunks(CHUNK))
        .for_each(|(p, g)| p.iter_mut().zip(g).for_each(|(p, g)| *p -= a * g));
}

/// Cosine learning rate with linear warm-up at iteration `it` (SPEC §3):
/// `it < warmup`: `max·it/warmup`; `warmup ≤ it ≤ cycle`: `min + ½(1 + cos(π(it−warmup)/(cycle−warmup)))(max − min)`;
/// after `cycle`: `min`.
pub fn lr_cosine_schedule(it: u64, max_lr: f64, min_lr: f64, warmup: u64, cycle: u64) -> f64 {
    if it < warmup {
        max_lr * it as f64 / warmup as f64
    } else if it <= cycle {
        let progress = if cycle > warmup {
            (it - warmup) as f64 / (cycle - warmup) as f64
        } else {
            0.0
        };
        min_lr + 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()) * (max_lr - min_lr)
    } else {
        min_lr
    }
}

/// The global L2 norm of several arrays taken together (sum of squares in `f64`).
pub fn global_norm(arrays: &[&[f32]]) -> f64 {
    chunked_sum_squares(arrays.iter().flat_map(|a| a.chunks(CHUNK)).collect()).sqrt()
}

/// `Σ x²` of one array in `f64`, the same sum whatever the number of threads.
pub fn sum_squares<F: Float>(x: &[F]) -> f64 {
    chunked_sum_squares(x.chunks(CHUNK).collect())
}

/// Sums of squares of `chunks` in parallel (each in interleaved `f64` partial sums,
/// so it vectorizes), added in order.
fn chunked_sum_squares<F: Float>(chunks: Vec<&[F]>) -> f64 {
    let partial: Vec<f64> = chunks
        .par_iter()
        .map(|c| {
            vectorized(
                #[inline(always)]
                || sum_by(c, |x| x.to_f64() * x.to_f64()),
            )
        })
        .collect();
    partial.iter().sum()
}

/// The SPEC's ε of gradient clipping.
pub const CLIP_EPS: f64 = 1e-6;

/// The factor clipping multiplies gradients by: `max/(norm + eps)` when
/// `norm > max`, else 1 (also 1 when `max` is not positive: clipping off).
pub fn clip_scale(norm: f64, max: f64, eps: f64) -> f32 {
    if max > 0.0 && norm > max {
        (max / (norm + eps)) as f32
    } else {
        1.0
    }
}

/// Global-norm clipping of several arrays in place (scale `max/(norm + eps)`);
/// returns the norm before clipping.
pub fn clip_grad_norm_arrays(grads: &mut [&mut [f32]], max: f64, eps: f64) -> f64 {
    let norm = global_norm(&grads.iter().map(|g| &**g).collect::<Vec<_>>());
    let s = clip_scale(norm, max, eps);
    if s != 1.0 {
        grads
            .iter_mut()
            .flat_map(|g| g.chunks_mut(CHUNK))
            .collect::<Vec<_>>()
            .into_par_iter()
            .for_each(|c| c.iter_mut().for_each(|x| *x *= s));
    }
    norm
}

/// Global-norm clipping of one flat gradient buffer (SPEC ε = 1e-6); returns the
/// norm before clipping.
pub fn clip_grad_norm(grads: &mut [f32], max: f64) -> f64 {
    clip_grad_norm_arrays(&mut [grads], max, CLIP_EPS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_edge_cases() {
        // No warm-up: starts at max.
        assert_eq!(lr_cosine_schedule(0, 1.0, 0.1, 0, 10), 1.0);
        // Warm-up equal to the cycle: max at the boundary, min after.
        assert_eq!(lr_cosine_schedule(5, 1.0, 0.1, 5, 5), 1.0);
        assert_eq!(lr_cosine_schedule(6, 1.0, 0.1, 5, 5), 0.1);
    }
}
