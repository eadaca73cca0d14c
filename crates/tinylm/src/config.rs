//! The model's shape and ablation switches, with the CS336 names.

use crate::text::thousands;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// RMSNorm's ε (SPEC §2): every norm of every model, in both backends' kernels and
/// in every export.
pub const RMS_NORM_EPS: f64 = 1e-5;

/// Where RMSNorm sits: before each sub-layer (CS336 default), after each residual
/// add (post-norm, no `ln_final`), or nowhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Norm {
    #[default]
    Pre,
    Post,
    None,
}

/// RoPE on queries and keys, or no positional information at all (NoPE).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Positional {
    #[default]
    Rope,
    None,
}

/// The feed-forward network: `W2 (SiLU(W1 x) ⊙ W3 x)` or `W2 SiLU(W1 x)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Ffn {
    #[default]
    Swiglu,
    Silu,
}

/// The assignment's ablations of the model (CS336 §7.3), by name: `no-norm` (no
/// RMSNorm), `post-norm`, `nope` (no position embedding) and `silu` (the SiLU
/// feed-forward network with `d_ff = 4·d_model`, so that its parameter count is
/// about SwiGLU's at `d_ff = 8/3·d_model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ablation {
    NoNorm,
    PostNorm,
    Nope,
    Silu,
}

impl Ablation {
    pub const ALL: [Ablation; 4] = [
        Ablation::NoNorm,
        Ablation::PostNorm,
        Ablation::Nope,
        Ablation::Silu,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Ablation::NoNorm => "no-norm",
            Ablation::PostNorm => "post-norm",
            Ablation::Nope => "nope",
            Ablation::Silu => "silu",
        }
    }

    /// The ablation called `name`, if any.
    pub fn parse(name: &str) -> Option<Ablation> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// `model` with this ablation.
    pub fn apply(self, model: &mut ModelConfig) {
        match self {
            Ablation::NoNorm => model.norm = Norm::None,
            Ablation::PostNorm => model.norm = Norm::Post,
            Ablation::Nope => model.positional = Positional::None,
            Ablation::Silu => {
                model.ffn = Ffn::Silu;
                model.d_ff = 4 * model.d_model;
            }
        }
    }
}

/// A Transformer LM's configuration. JSON keys are exactly these field names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub vocab_size: usize,
    pub context_length: usize,
    pub d_model: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub d_ff: usize,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default)]
    pub norm: Norm,
    #[serde(default)]
    pub positional: Positional,
    #[serde(default)]
    pub ffn: Ffn,
    #[serde(default)]
    pub tie_embeddings: bool,
}

/// Limits that keep a config from asking for impossible amounts of memory.
const MAX_LAYERS: usize = 10_000;
const MAX_PARAMS: u128 = 1 << 40;

fn default_rope_theta() -> f64 {
    10_000.0
}

impl ModelConfig {
    /// The CS336 TinyStories model (~17M non-embedding parameters).
    pub fn tinystories() -> Self {
        ModelConfig {
            vocab_size: 10_000,
            context_length: 256,
            d_model: 512,
            num_layers: 4,
            num_heads: 16,
            d_ff: 1344,
            rope_theta: 10_000.0,
            norm: Norm::Pre,
            positional: Positional::Rope,
            ffn: Ffn::Swiglu,
            tie_embeddings: false,
        }
    }

    /// GPT-2 XL's shape with the CS336 architecture (SwiGLU, RoPE, RMSNorm).
    pub fn gpt2_xl() -> Self {
        ModelConfig {
            vocab_size: 50_257,
            context_length: 1024,
            d_model: 1600,
            num_layers: 48,
            num_heads: 25,
            d_ff: 6400,
            ..Self::tinystories()
        }
    }

    /// A named preset: `tinystories`, `gpt2-small`, `gpt2-medium`, `gpt2-large`, `gpt2-xl`.
    pub fn preset(name: &str) -> Result<Self> {
        let gpt2 = |num_layers, d_model, num_heads| ModelConfig {
            num_layers,
            d_model,
            num_heads,
            d_ff: 4 * d_model,
            ..Self::gpt2_xl()
        };
        Ok(match name {
            "tinystories" => Self::tinystories(),
            "gpt2-small" => gpt2(12, 768, 12),
            "gpt2-medium" => gpt2(24, 1024, 16),
            "gpt2-large" => gpt2(36, 1280, 20),
            "gpt2-xl" => Self::gpt2_xl(),
            other => {
                return Err(Error::Config(format!(
                    "unknown preset '{other}' (known: tinystories, gpt2-small, gpt2-medium, gpt2-large, gpt2-xl)"
                )))
            }
        })
    }

    /// Per-head dimension `d_k = d_model / num_heads`.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.num_heads
    }

    /// Checks the shape is one the kernels can run.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::Config(msg));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("context_length", self.context_length),
            ("d_model", self.d_model),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("d_ff", self.d_ff),
        ] {
            if v == 0 {
                return bad(format!("{name} must be positive"));
            }
        }
        if !self.d_model.is_multiple_of(self.num_heads) {
            return bad(format!(
                "d_model {} is not divisible by num_heads {}",
                self.d_model, self.num_heads
            ));
        }
        if self.positional == Positional::Rope && !self.head_dim().is_multiple_of(2) {
            return bad(format!(
                "RoPE needs an even head dimension, got d_model/num_heads = {}",
                self.head_dim()
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad(format!(
                "rope_theta must be positive, got {}",
                self.rope_theta
            ));
        }
        if self.vocab_size > u32::MAX as usize {
            return bad(format!("vocab_size {} is too large", self.vocab_size));
        }
        if self.num_layers > MAX_LAYERS {
            return bad(format!(
                "num_layers {} is more than {MAX_LAYERS}",
                self.num_layers
            ));
        }
        // An upper bound of the parameter count (every optional tensor present).
        let (v, d, f, l) = (
            self.vocab_size as u128,
            self.d_model as u128,
            self.d_ff as u128,
            self.num_layers as u128,
        );
        let params = 2 * v * d + l * (4 * d * d + 3 * d * f + 2 * d) + d;
        if params > MAX_PARAMS {
            return bad(format!(
                "{params} parameters is more than this build can hold ({MAX_PARAMS})"
            ));
        }
        Ok(())
    }

    /// Reads and validates a JSON config file.
    pub fn from_json_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let config: ModelConfig = serde_json::from_str(&text)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        config
            .validate()
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        Ok(config)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("config serializes")
    }

    /// The configuration for people, in two lines: the shape, then the ablations
    /// in their JSON spelling.
    pub fn describe(&self) -> String {
        let spelling = |value: serde_json::Value| value.as_str().unwrap_or_default().to_string();
        let json = serde_json::to_value(self).expect("config serializes");
        format!(
            "model: vocab_size {} · context_length {} · d_model {} · num_layers {} · num_heads {} (d_k {}) · d_ff {}\n       norm {} · positional {} · ffn {} · {} · rope_theta {}",
            thousands(self.vocab_size as u64),
            thousands(self.context_length as u64),
            thousands(self.d_model as u64),
            self.num_layers,
            self.num_heads,
            self.head_dim(),
            thousands(self.d_ff as u64),
            spelling(json["norm"].clone()),
            spelling(json["positional"].clone()),
            spelling(json["ffn"].clone()),
            if self.tie_embeddings { "tied embeddings" } else { "untied" },
            self.rope_theta,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_uses_cs336_keys_and_defaults() {
        let c: ModelConfig = serde_json::from_str(
            r#"{"vocab_size":10,"context_length":8,"d_model":4,"num_layers":1,"num_heads":2,"d_ff":8}"#,
        )
        .unwrap();
        assert_eq!(c.norm, Norm::Pre);
        assert_eq!(c.positional, Positional::Rope);
        assert_eq!(c.ffn, Ffn::Swiglu);
        assert!(!c.tie_embeddings);
        let json = c.to_json();
        for key in [
            "vocab_size",
            "context_length",
            "d_model",
            "num_layers",
            "num_heads",
            "d_ff",
            "rope_theta",
            "\"norm\": \"pre\"",
            "\"positional\": \"rope\"",
            "\"ffn\": \"swiglu\"",
            "tie_embeddings",
        ] {
            assert!(json.contains(key), "{key} missing from {json}");
        }
        assert_eq!(serde_json::from_str::<ModelConfig>(&json).unwrap(), c);
    }

    #[test]
    fn invalid_shapes_are_rejected() {
        let mut c = ModelConfig::tinystories();
        c.num_heads = 7;
        assert!(c.validate().unwrap_err().to_string().contains("divisible"));
        let mut c = ModelConfig::tinystories();
        c.d_model = 48;
        c.num_heads = 16; // head dim 3
        assert!(c.validate().unwrap_err().to_string().contains("even"));
        c.positional = Positional::None;
        assert!(c.validate().is_ok());
        assert!(ModelConfig::preset("nope").is_err());
        let mut c = ModelConfig::tinystories();
        c.vocab_size = 4_000_000_000;
        c.d_model = 4096;
        c.num_heads = 32;
        assert!(c.validate().unwrap_err().to_string().contains("parameters"));
    }
}
