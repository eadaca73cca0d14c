//! Checkpoints (SPEC §3): one safetensors file holding
//! - the weights under their SPEC names (`token_embeddings.weight`, …), so
//!   `model.load_state_dict(safetensors.torch.load_file(path), strict=False)`
//!   loads them into a PyTorch model with those names (the `optim.*` keys are the
//!   unexpected ones);
//! - the AdamW moments as `optim.m.<name>` and `optim.v.<name>` (optional);
//! - string metadata: `format` = `tinylm`, `config` (the model config as JSON),
//!   `optimizer` (AdamW hyper-parameters and step as JSON, with the moments), and
//!   whatever the caller adds (the training loop stores `step`, `tokens`,
//!   `wallclock_s`, `rng_state`, `last_step_s`, `last_eval_s`, `train_config`,
//!   `train_data`, `val_data`, `tokenizer`).
//!
//! Files are written to `<path>.tmp` and renamed, so a crash never leaves a torn file.

use crate::kernels::AdamWParams;
use crate::optim::AdamW;
use crate::params::{load_safetensors, save_safetensors, ParamLayout, Tensors};
use crate::{Error, ModelConfig, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const MOMENT_M: &str = "optim.m.";
const MOMENT_V: &str = "optim.v.";

/// The optimizer entry of the metadata.
#[derive(Serialize, Deserialize)]
struct OptimizerMeta {
    #[serde(flatten)]
    hp: AdamWParams,
    step: u64,
}

/// A loaded checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    pub config: ModelConfig,
    /// The flat parameter buffer in [`ParamLayout`] order.
    pub params: Vec<f32>,
    /// AdamW moments and step, when the file has them.
    pub optimizer: Option<AdamW>,
    /// Every metadata entry, including `config` and `optimizer`.
    pub metadata: BTreeMap<String, String>,
}

impl Checkpoint {
    /// A metadata entry parsed as JSON (numbers, strings, objects).
    pub fn meta<T: DeserializeOwned>(&self, key: &str, path: &Path) -> Result<T> {
        meta(&self.metadata, key, path)
    }
}

/// The metadata entry `key` of the checkpoint at `path`, parsed as JSON.
pub fn meta<T: DeserializeOwned>(
    metadata: &BTreeMap<String, String>,
    key: &str,
    path: &Path,
) -> Result<T> {
    let text = metadata.get(key).ok_or_else(|| {
        Error::Invalid(format!(
            "{}: not a tinylm checkpoint: no '{key}' entry",
            path.display()
        ))
    })?;
    serde_json::from_str(text).map_err(|e| {
        Error::Invalid(format!(
            "{}: checkpoint entry '{key}' is invalid: {e}",
            path.display()
        ))
    })
}

/// Writes a checkpoint of `params` (and the optimizer state) to `path`; `extra`
/// metadata values should be JSON text.
pub fn save(
    path: &Path,
    config: &ModelConfig,
    params: &[f32],
    optimizer: Option<&AdamW>,
    extra: &BTreeMap<String, String>,
) -> Result<()> {
    let layout = ParamLayout::new(config);
    let mut tensors = layout.tensors(params);
    let mut metadata = extra.clone();
    metadata.insert("format".into(), "\"tinylm\"".into());
    metadata.insert(
        "config".into(),
        serde_json::to_string(config).expect("serializes"),
    );
    if let Some(opt) = optimizer {
        for (prefix, buf) in [(MOMENT_M, &opt.m), (MOMENT_V, &opt.v)] {
            tensors.extend(
                layout
                    .tensors(buf)
                    .into_iter()
                    .map(|(name, shape, values)| (format!("{prefix}{name}"), shape, values)),
            );
        }
        let meta = OptimizerMeta {
            hp: opt.hp,
            step: opt.step,
        };
        metadata.insert(
            "optimizer".into(),
            serde_json::to_string(&meta).expect("serializes"),
        );
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    save_safetensors(&tmp, &tensors, &metadata)?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

/// Reads a checkpoint: the config, the weights (every tensor of the config's
/// layout with its exact shape) and, when present, the AdamW state.
pub fn load(path: &Path) -> Result<Checkpoint> {
    let (tensors, metadata) = load_safetensors(path)?;
    let config: ModelConfig = meta(&metadata, "config", path)?;
    config
        .validate()
        .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
    let layout = ParamLayout::new(&config);
    let (mut weights, mut m, mut v) = (Tensors::new(), Tensors::new(), Tensors::new());
    for (name, tensor) in tensors {
        if let Some(base) = name.strip_prefix(MOMENT_M) {
            m.insert(base.to_string(), tensor);
        } else if let Some(base) = name.strip_prefix(MOMENT_V) {
            v.insert(base.to_string(), tensor);
        } else {
            weights.insert(name, tensor);
        }
    }
    let params = layout.load_buffer(&weights, path)?;
    let optimizer = match metadata.contains_key("optimizer") {
        true => {
            let state: OptimizerMeta = meta(&metadata, "optimizer", path)?;
            Some(AdamW {
                hp: state.hp,
                covers: 0..params.len(),
                m: layout.load_buffer(&m, path)?,
                v: layout.load_buffer(&v, path)?,
                step: state.step,
            })
        }
        false => None,
    };
    Ok(Checkpoint {
        config,
        params,
        optimizer,
        metadata,
    })
}

/// Checks that `config` (the run's) equals the checkpoint's; the error names
/// every key that differs.
pub fn check_same_config(path: &Path, saved: &ModelConfig, config: &ModelConfig) -> Result<()> {
    let (a, b) = (
        serde_json::to_value(saved).expect("serializes"),
        serde_json::to_value(config).expect("serializes"),
    );
    let (a, b) = (
        a.as_object().expect("object"),
        b.as_object().expect("object"),
    );
    let diffs: Vec<String> = a
        .iter()
        .filter(|(k, v)| b.get(*k) != Some(v))
        .map(|(k, v)| format!("{k} is {v} in the checkpoint but {} here", b[k]))
        .collect();
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "cannot resume from {}: the model config differs: {}",
            path.display(),
            diffs.join("; ")
        )))
    }
}
