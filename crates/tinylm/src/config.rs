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

/// Parameter counts by component: `tinylm info`'s table, and what
/// [`ModelConfig::validate`] limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamCounts {
    /// `token_embeddings.weight` (which is also the output projection when tied).
    pub embedding: u64,
    /// `q_proj`, `k_proj`, `v_proj`, `output_proj` of one block.
    pub attention_per_layer: u64,
    /// `w1`, `w2` (and `w3` with SwiGLU) of one block.
    pub ffn_per_layer: u64,
    /// `ln1` and `ln2` of one block (0 without RMSNorm).
    pub norms_per_layer: u64,
    pub num_layers: u64,
    /// `ln_final.weight` (pre-norm only).
    pub ln_final: u64,
    /// `lm_head.weight` (0 when tied to the embedding).
    pub lm_head: u64,
}

impl ParamCounts {
    /// The counts of a valid config (whose total [`ModelConfig::validate`] checks).
    pub fn new(c: &ModelConfig) -> Self {
        Self::checked(c).expect("a validated config's parameter count fits in a u64")
    }

    /// The counts of `c`, or `None` when its total does not fit in a `u64`.
    pub fn checked(c: &ModelConfig) -> Option<Self> {
        let (v, d, f) = (c.vocab_size as u64, c.d_model as u64, c.d_ff as u64);
        let ffn_mats = if c.ffn == Ffn::Swiglu { 3 } else { 2 };
        let embedding = v.checked_mul(d)?;
        let counts = ParamCounts {
            embedding,
            attention_per_layer: d.checked_mul(d)?.checked_mul(4)?,
            ffn_per_layer: d.checked_mul(f)?.checked_mul(ffn_mats)?,
            norms_per_layer: if c.norm == Norm::None {
                0
            } else {
                d.checked_mul(2)?
            },
            num_layers: c.num_layers as u64,
            ln_final: if c.norm == Norm::Pre { d } else { 0 },
            lm_head: if c.tie_embeddings { 0 } else { embedding },
        };
        counts.checked_total().map(|_| counts)
    }

    fn checked_total(&self) -> Option<u64> {
        let per_layer = (self.attention_per_layer)
            .checked_add(self.ffn_per_layer)?
            .checked_add(self.norms_per_layer)?;
        (self.num_layers.checked_mul(per_layer)?)
            .checked_add(self.embedding)?
            .checked_add(self.ln_final)?
            .checked_add(self.lm_head)
    }

    pub fn per_layer(&self) -> u64 {
        self.attention_per_layer + self.ffn_per_layer + self.norms_per_layer
    }

    pub fn total(&self) -> u64 {
        self.checked_total().expect("counted with overflow checks")
    }

    /// Everything but the token embedding (the CS336 convention: `lm_head` counts).
    pub fn non_embedding(&self) -> u64 {
        self.total() - self.embedding
    }
}

/// Limits that keep a config from asking for impossible amounts of memory.
const MAX_LAYERS: usize = 10_000;
const MAX_PARAMS: u64 = 1 << 40;

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

    /// The keys a configuration must give (the others have defaults).
    pub const SHAPE_KEYS: [&'static str; 6] = [
        "vocab_size",
        "context_length",
        "d_model",
        "num_layers",
        "num_heads",
        "d_ff",
    ];

    /// The named models, in one table that `--preset` of every command, `tinylm
    /// bench`'s default model and the Python package's `preset_config` read.
    pub const PRESETS: [&'static str; 6] = [
        "tinystories",
        "bench-small",
        "gpt2-small",
        "gpt2-medium",
        "gpt2-large",
        "gpt2-xl",
    ];

    /// A named model of [`ModelConfig::PRESETS`]: the CS336 TinyStories model; the
    /// benchmark model `bench-small` (its shape at a quarter of the width, a
    /// vocabulary of 4,096 and a context of 128); GPT-2's four shapes with the CS336
    /// architecture.
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
            "bench-small" => ModelConfig {
                vocab_size: 4096,
                context_length: 128,
                d_model: 256,
                num_heads: 8,
                d_ff: 704,
                ..Self::tinystories()
            },
            "gpt2-small" => gpt2(12, 768, 12),
            "gpt2-medium" => gpt2(24, 1024, 16),
            "gpt2-large" => gpt2(36, 1280, 20),
            "gpt2-xl" => Self::gpt2_xl(),
            other => {
                return Err(Error::Config(format!(
                    "unknown preset '{other}' (known: {})",
                    Self::PRESETS.join(", ")
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
        match ParamCounts::checked(self).map(|p| p.total()) {
            Some(params) if params <= MAX_PARAMS => {}
            params => {
                let params = params.map_or("more than 2^64".into(), |n| n.to_string());
                return bad(format!(
                    "{params} parameters is more than this build can hold ({MAX_PARAMS})"
                ));
            }
        }
        // The keys and values of one sequence over the whole context in every layer,
        // what generation holds: this also bounds RoPE's tables and the context in
        // `tinylm info`'s arithmetic.
        let cache = [self.context_length, 3, self.d_model, self.num_layers]
            .into_iter()
            .try_fold(1u64, |values, n| values.checked_mul(n as u64));
        if cache.is_none_or(|values| values > MAX_PARAMS) {
            return bad(format!(
                "context_length {} is too long for this model: one sequence's keys and values (context_length × 3 × d_model × num_layers) would be more than {MAX_PARAMS} values",
                self.context_length
            ));
        }
        Ok(())
    }

    /// Reads and validates a JSON config file: the model's keys, or a run's
    /// `config.json`, which holds them under `model`.
    pub fn from_json_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let bad = |e: serde_json::Error| Error::Config(format!("{}: {e}", path.display()));
        let mut value: serde_json::Value = serde_json::from_str(&text).map_err(bad)?;
        if let Some(model) = value.get_mut("model").filter(|m| m.is_object()) {
            value = model.take();
        }
        let config: ModelConfig = serde_json::from_value(value).map_err(bad)?;
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
        let defaulted = [
            "rope_theta",
            "\"norm\": \"pre\"",
            "\"positional\": \"rope\"",
            "\"ffn\": \"swiglu\"",
            "tie_embeddings",
        ];
        for key in ModelConfig::SHAPE_KEYS.into_iter().chain(defaulted) {
            assert!(json.contains(key), "{key} missing from {json}");
        }
        assert_eq!(serde_json::from_str::<ModelConfig>(&json).unwrap(), c);
    }

    /// A model's config file, and a run's (the model's keys under `model`, beside
    /// the run's own); an unknown key is an error naming the file and the key.
    #[test]
    fn config_files_are_a_model_s_or_a_run_s() {
        let dir = tempfile::tempdir().unwrap();
        let model = ModelConfig::tinystories();
        let read = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            ModelConfig::from_json_file(&path)
        };
        assert_eq!(read("model.json", &model.to_json()).unwrap(), model);
        let run = format!(
            r#"{{"model": {}, "steps": 10, "lr_max": 0.001}}"#,
            model.to_json()
        );
        assert_eq!(read("config.json", &run).unwrap(), model);
        let err = read("typo.json", r#"{"vocab_sise": 10}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("typo.json") && err.contains("vocab_sise"),
            "{err}"
        );
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

    #[test]
    fn the_shape_keys_are_the_ones_a_configuration_must_give() {
        let full = serde_json::to_value(ModelConfig::tinystories()).unwrap();
        let only = |keys: &[&str]| {
            let map = (keys.iter()).map(|&k| (k.to_string(), full[k].clone()));
            serde_json::from_value::<ModelConfig>(serde_json::Value::Object(map.collect()))
        };
        assert!(only(&ModelConfig::SHAPE_KEYS).is_ok());
        for missing in ModelConfig::SHAPE_KEYS {
            let rest: Vec<&str> = (ModelConfig::SHAPE_KEYS.into_iter())
                .filter(|&k| k != missing)
                .collect();
            assert!(only(&rest).is_err(), "{missing} has a default");
        }
    }

    #[test]
    fn every_preset_in_the_table_is_a_valid_model() {
        for name in ModelConfig::PRESETS {
            let c = ModelConfig::preset(name).unwrap();
            c.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let err = ModelConfig::preset("nope").unwrap_err().to_string();
        assert!(err.contains(&ModelConfig::PRESETS.join(", ")), "{err}");
    }

    /// `d_model = 2^63` overflowed the 128-bit bound of the parameter count (a
    /// panic in a build with overflow checks).
    #[test]
    fn a_shape_whose_parameter_count_overflows_is_refused() {
        for d_model in [1 << 63, usize::MAX - 3, 1 << 32] {
            let c = ModelConfig {
                d_model,
                num_heads: 2,
                ..ModelConfig::tinystories()
            };
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("parameters is more than"), "{err}");
        }
    }

    /// A context whose KV cache (and RoPE tables) no machine holds, which a
    /// checkpoint's config can claim at no cost in its file's size.
    #[test]
    fn a_context_longer_than_the_kv_cache_limit_is_refused() {
        let c = ModelConfig::tinystories();
        let longest = (MAX_PARAMS / (3 * 512 * 4)) as usize;
        let at = |context_length| {
            ModelConfig {
                context_length,
                ..c.clone()
            }
            .validate()
        };
        assert!(at(longest).is_ok());
        for context_length in [longest + 1, usize::MAX] {
            let err = at(context_length).unwrap_err().to_string();
            assert!(
                err.contains(&format!("context_length {context_length} is too long")),
                "{err}"
            );
        }
    }
}
