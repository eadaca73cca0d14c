//! Helpers shared by the model test suites: models of every ablation and
//! perturbed parameters.

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
