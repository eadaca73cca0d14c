//! Helpers shared by the model test suites: models of every ablation, perturbed
//! parameters, and pieces of the naive references.
#![allow(dead_code)] // each suite uses its own part

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tinylm::config::{Ffn, ModelConfig, Norm, Positional};
use tinylm::params::ParamLayout;

/// Every ablation of the shape `config` builds, all 24: pre-, post- and no norm ×
/// RoPE or NoPE × SwiGLU or SiLU × untied or tied embeddings.
pub fn ablations(config: fn(Norm, Positional, Ffn, bool) -> ModelConfig) -> Vec<ModelConfig> {
    let mut all = Vec::new();
    for norm in [Norm::Pre, Norm::Post, Norm::None] {
        for positional in [Positional::Rope, Positional::None] {
            for ffn in [Ffn::Swiglu, Ffn::Silu] {
                for tied in [false, true] {
                    all.push(config(norm, positional, ffn, tied));
                }
            }
        }
    }
    all
}

/// Initial parameters with every value moved a little (the gains off 1, so the
/// norms' gains matter).
pub fn perturbed_params(c: &ModelConfig, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut p = ParamLayout::new(c).init(seed);
    p.iter_mut()
        .for_each(|x| *x += 0.2 * (rng.random::<f32>() - 0.5));
    p
}

/// The softmax of `scores`, computed after subtracting their maximum.
pub fn softmax(scores: &[f64]) -> Vec<f64> {
    let max = scores.iter().cloned().fold(f64::MIN, f64::max);
    let z: f64 = scores.iter().map(|s| (s - max).exp()).sum();
    scores.iter().map(|s| (s - max).exp() / z).collect()
}

/// The largest `|got - want|` over the two slices, in `f64`.
pub fn max_abs_diff<T: Copy + Into<f64>>(got: &[T], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (g.into() - w).abs())
        .fold(0.0, f64::max)
}
