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

use crate::kernels::{AdamWParams, Backend, Buffer};
use crate::optim::AdamW;
use crate::params::{load_safetensors, write_safetensors, ParamLayout, TensorData, Tensors};
use crate::{Error, ModelConfig, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::Range;
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
    let moments = optimizer.map(|opt| (opt, opt.m.as_slice(), opt.v.as_slice()));
    let moments = moments.as_ref().map(|(opt, m, v)| Moments {
        hp: opt.hp,
        step: opt.step,
        m,
        v,
    });
    save_from(path, config, &params, moments, extra)
}

/// A flat buffer in the parameter layout, wherever it lies.
pub trait FlatValues {
    /// The values `range` as they are to be written.
    fn values(&self, range: Range<usize>) -> TensorData<'_>;
}

impl FlatValues for &[f32] {
    fn values(&self, range: Range<usize>) -> TensorData<'_> {
        TensorData::Host(&self[range])
    }
}

/// A backend's buffer: written from where it lies when the backend keeps it in host
/// memory (the CPU), else fetched one tensor at a time (a GPU).
pub struct BackendValues<'a, B: Backend<f32>> {
    pub backend: &'a B,
    pub buf: &'a B::Buf,
}

impl<B: Backend<f32>> FlatValues for BackendValues<'_, B> {
    fn values(&self, range: Range<usize>) -> TensorData<'_> {
        match self.backend.host(self.buf.at(range.clone())) {
            Some(values) => TensorData::Host(values),
            None => TensorData::Fetch(Box::new(move |out| {
                self.backend.download(self.buf.at(range.clone()), out)
            })),
        }
    }
}

/// The AdamW state a checkpoint holds: hyper-parameters, step, and both moments
/// for every parameter.
pub struct Moments<'a> {
    pub hp: AdamWParams,
    pub step: u64,
    pub m: &'a dyn FlatValues,
    pub v: &'a dyn FlatValues,
}

/// [`save`] from buffers wherever they lie ([`FlatValues`]): the same file, byte for
/// byte, written without a host copy of the model or the moments (a GPU's are
/// fetched one tensor at a time).
pub fn save_from<'a>(
    path: &Path,
    config: &ModelConfig,
    params: &'a dyn FlatValues,
    optimizer: Option<Moments<'a>>,
    extra: &BTreeMap<String, String>,
) -> Result<()> {
    let layout = ParamLayout::new(config);
    let tensors_of = |prefix: &str, buf: &'a dyn FlatValues| {
        layout
            .specs
            .iter()
            .map(|s| {
                (
                    format!("{prefix}{}", s.name),
                    s.shape.clone(),
                    buf.values(s.range()),
                )
            })
            .collect::<Vec<_>>()
    };
    let mut tensors = tensors_of("", params);
    let mut metadata = extra.clone();
    metadata.insert("format".into(), "\"tinylm\"".into());
    metadata.insert(
        "config".into(),
        serde_json::to_string(config).expect("serializes"),
    );
    if let Some(opt) = optimizer {
        tensors.extend(tensors_of(MOMENT_M, opt.m));
        tensors.extend(tensors_of(MOMENT_V, opt.v));
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
    write_safetensors(&tmp, &tensors, &metadata)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Cpu;
    use crate::Model;

    /// A buffer that must be fetched, as a GPU's is.
    struct Fetched<'a>(&'a [f32]);

    impl FlatValues for Fetched<'_> {
        fn values(&self, range: Range<usize>) -> TensorData<'_> {
            TensorData::Fetch(Box::new(move |out| {
                out.copy_from_slice(&self.0[range.clone()]);
                Ok(())
            }))
        }
    }

    #[test]
    fn a_checkpoint_written_from_the_buffers_is_the_host_copys_byte_for_byte() {
        let config = ModelConfig {
            vocab_size: 64,
            context_length: 8,
            d_model: 16,
            num_layers: 2,
            num_heads: 2,
            d_ff: 40,
            ..ModelConfig::tinystories()
        };
        let model = Model::<f32, Cpu>::new(config.clone(), 3).unwrap();
        let mut opt = model.new_adamw(AdamWParams::default()).unwrap();
        for (i, (m, v)) in opt.m.iter_mut().zip(&mut opt.v).enumerate() {
            (*m, *v) = (i as f32 * 1e-3, (i % 7) as f32);
        }
        opt.step = 5;
        let extra = BTreeMap::from([("step".to_string(), "5".to_string())]);
        let dir = tempfile::tempdir().unwrap();
        let (copy, direct, fetched) = (
            dir.path().join("copy.safetensors"),
            dir.path().join("direct.safetensors"),
            dir.path().join("fetched.safetensors"),
        );
        let host = model.download_params().unwrap();
        save(
            &copy,
            &config,
            &host,
            Some(&model.download_adamw(&opt).unwrap()),
            &extra,
        )
        .unwrap();
        let on_cpu = |buf| BackendValues {
            backend: model.backend(),
            buf,
        };
        let (m, v) = (on_cpu(&opt.m), on_cpu(&opt.v));
        let moments = |m, v| Moments {
            hp: opt.hp,
            step: opt.step,
            m,
            v,
        };
        let params = on_cpu(model.param_buffer());
        save_from(&direct, &config, &params, Some(moments(&m, &v)), &extra).unwrap();
        let (m, v, p) = (Fetched(&opt.m), Fetched(&opt.v), Fetched(&host));
        save_from(&fetched, &config, &p, Some(moments(&m, &v)), &extra).unwrap();
        // The same header (the safetensors crate orders metadata as its HashMap
        // does, so only its content compares) and the same data, byte for byte.
        let parts = |p: &Path| {
            let bytes = std::fs::read(p).unwrap();
            let n = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let header: serde_json::Value = serde_json::from_slice(&bytes[8..n]).unwrap();
            (header, bytes[n..].to_vec())
        };
        let same = |a: &Path, b: &Path| assert!(parts(a) == parts(b), "{a:?} differs");
        same(&direct, &copy);
        same(&fetched, &copy);
        assert_eq!(load(&direct).unwrap().optimizer.unwrap().m, opt.m);
    }

    #[test]
    fn a_fetch_that_fails_is_the_error_and_leaves_no_file() {
        struct Failing;
        impl FlatValues for Failing {
            fn values(&self, _: Range<usize>) -> TensorData<'_> {
                TensorData::Fetch(Box::new(|_| Err(Error::Device("the GPU is gone".into()))))
            }
        }
        let config = ModelConfig {
            vocab_size: 64,
            context_length: 8,
            d_model: 16,
            num_layers: 1,
            num_heads: 2,
            d_ff: 40,
            ..ModelConfig::tinystories()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.safetensors");
        let err = save_from(&path, &config, &Failing, None, &BTreeMap::new()).unwrap_err();
        assert!(err.to_string().contains("the GPU is gone"), "{err}");
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
    }
}
