//! Optimizers' host API (SPEC §3): the AdamW state, the SGD example, the cosine
//! learning-rate schedule with warm-up, and global-norm gradient clipping of host
//! arrays (the Python API).
//!
//! The per-element work is the kernel layer's: the AdamW update
//! ([`adamw_step`](crate::kernels::cpu::adamw::adamw_step)) and the sum of squares
//! ([`sum_squares_of`]), both bit-identical whatever the number of threads; a model
//! runs them through its backend ([`Backend::adamw`](crate::kernels::Backend::adamw)).

use crate::kernels::cpu::global_norm::sum_squares_of;
use crate::kernels::cpu::simd::CHUNK;
use crate::kernels::{clip_scale, AdamWParams};
use rayon::prelude::*;
use std::ops::Range;

/// AdamW state: first and second moments mirroring the parameter buffer (host
/// vectors, or a backend's buffers while a model trains), and the number of steps taken.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamW<M = Vec<f32>> {
    pub hp: AdamWParams,
    /// The parameters the moments cover: all of them, or under ZeRO-1 this rank's
    /// shard ([`crate::distributed::shard`]); `m` and `v` are that long.
    pub covers: Range<usize>,
    pub m: M,
    pub v: M,
    pub step: u64,
}

impl AdamW {
    /// Zero moments for `n` parameters.
    pub fn new(n: usize, hp: AdamWParams) -> Self {
        AdamW {
            hp,
            covers: 0..n,
            m: vec![0.0; n],
            v: vec![0.0; n],
            step: 0,
        }
    }
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
    sum_squares_of(arrays).sqrt()
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
