//! `tinylm.TransformerLM`: the Rust [`Model`] with a state dict of NumPy arrays.

use crate::arrays::{output, token_ids, Floats};
use crate::errors::{detached, invalid, model_error};
use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyDict, PyType};
use std::ops::ControlFlow;
use std::path::PathBuf;
use tinylm::checkpoint::CheckpointFile;
use tinylm::device::{resolve, AnyBackend, AnyModel, Device, CUDA_BUILT};
use tinylm::generate::{generate, Sampler};
use tinylm::kernels::Backend;
use tinylm::kernels::Precision;
use tinylm::params::ParamLayout;
use tinylm::{on_backend, on_model, Model, ModelConfig};

/// Python's `str`, to turn paths into JSON strings.
fn builtins_str(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    PyModule::import(py, "builtins")?.getattr("str")
}

/// A Python dict (or anything `json.dumps` takes; other values such as paths become
/// strings) as a serde value of type `T`.
pub fn from_py_json<T: serde::de::DeserializeOwned>(
    value: &Bound<'_, PyAny>,
    what: &str,
) -> PyResult<T> {
    let json = PyModule::import(value.py(), "json")?;
    let text: String = json
        .getattr("dumps")?
        .call(
            (value,),
            Some(&[("default", builtins_str(value.py())?)].into_py_dict(value.py())?),
        )
        .map_err(|e| invalid(format!("{what}: not JSON-like: {e}")))?
        .extract()?;
    serde_json::from_str(&text).map_err(|e| invalid(format!("{what}: {e}")))
}

/// A config as a Python dict.
pub fn to_py_json<'py, T: serde::Serialize>(
    py: Python<'py>,
    value: &T,
) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value).expect("serializes");
    PyModule::import(py, "json")?
        .getattr("loads")?
        .call1((text,))
}

/// The flat parameter buffer of `config`'s layout from a state dict: every tensor of
/// the layout must be there with its exact shape, and nothing else.
pub fn params_from_state_dict(
    config: &ModelConfig,
    state: &Bound<'_, PyDict>,
) -> PyResult<Vec<f32>> {
    let layout = ParamLayout::new(config);
    let specs = (layout.specs.iter()).map(|s| (s.name.as_str(), &s.shape[..]));
    let (params, mut problems) = read_tensors(state, specs)?;
    for key in state.keys() {
        let key: String = key.extract()?;
        if layout.get(&key).is_none() {
            problems.push(format!("unexpected '{key}'"));
        }
    }
    if !problems.is_empty() {
        return Err(invalid(format!(
            "the state dict does not match the model configuration: {}",
            problems.join("; ")
        )));
    }
    Ok(params)
}

/// The tensors `specs` (name, shape) of `state` in one buffer, in order, and a line
/// for each one missing or of another shape (the buffer is whole only without any).
pub fn read_tensors<'a>(
    state: &Bound<'_, PyDict>,
    specs: impl Iterator<Item = (&'a str, &'a [usize])>,
) -> PyResult<(Vec<f32>, Vec<String>)> {
    let (mut values, mut problems) = (Vec::new(), Vec::new());
    for (name, shape) in specs {
        match state.get_item(name)? {
            None => problems.push(format!("missing '{name}' of shape {shape:?}")),
            Some(value) => {
                let value = Floats::new(&value, name)?;
                if value.shape != shape {
                    problems.push(format!(
                        "'{name}' has shape {:?}, expected {shape:?}",
                        value.shape
                    ));
                } else {
                    values.extend_from_slice(value.data());
                }
            }
        }
    }
    Ok((values, problems))
}

/// `{name: array}` of a buffer in `layout` (parameters or gradients).
fn to_state_dict<'py>(
    py: Python<'py>,
    layout: &ParamLayout,
    buf: &[f32],
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (name, shape, values) in layout.tensors(buf) {
        dict.set_item(name, output(py, &shape, values.to_vec()))?;
    }
    Ok(dict)
}

/// A decoder-only Transformer LM (the engine's configuration keys: `vocab_size`,
/// `context_length`, `d_model`, `num_layers`, `num_heads`, `d_ff`, `rope_theta`,
/// and the ablations `norm`, `positional`, `ffn`, `tie_embeddings`).
#[pyclass(module = "tinylm")]
pub struct TransformerLM {
    model: AnyModel,
}

/// Where a model's weights come from.
enum Source<'a> {
    /// A configuration and its flat parameter buffer.
    Params(ModelConfig, &'a [f32]),
    /// A checkpoint's weights, read into the model's buffer tensor by tensor.
    Checkpoint(&'a CheckpointFile),
}

impl Source<'_> {
    fn model<B: Backend<f32>>(self, backend: B) -> PyResult<Model<f32, B>> {
        match self {
            Source::Params(config, params) => Model::with_backend(config, params, backend),
            Source::Checkpoint(ckpt) => ckpt.model(backend),
        }
        .map_err(model_error)
    }
}

/// A model with the weights of `source` on `device` (`cpu`, `cuda`, `cuda:N`,
/// `auto`) in `precision` (`auto`, `bf16`, `fp32`; by default fp32 on the CPU — the
/// exact results of the CS336 interfaces — and auto on a GPU), on the backend
/// [`AnyBackend::open`] chooses.
fn open_model(source: Source, device: &str, precision: Option<&str>) -> PyResult<AnyModel> {
    let device: Device = device.parse().map_err(model_error)?;
    let device = resolve(device).map_err(model_error)?;
    let precision: Precision = match (precision, device) {
        // The package's models train: q8_0 (generation's) is refused, saying so.
        (Some(precision), _) => precision
            .parse::<Precision>()
            .and_then(Precision::for_training)
            .map_err(model_error)?,
        (None, Device::Cpu) => Precision::Fp32,
        (None, _) => Precision::Auto,
    };
    if matches!(device, Device::Cuda(_)) && !CUDA_BUILT {
        return Err(invalid(format!(
            "device {device} ({precision}): this tinylm was built without CUDA support; \
                 build the package with the cargo feature `cuda` (maturin build --features cuda)"
        )));
    }
    let backend = AnyBackend::open(device, precision).map_err(model_error)?;
    on_backend!(backend, backend => source.model(backend).map(AnyModel::from))
}

impl TransformerLM {
    /// Token ids `(..., T)` as `(shape, ids, B, T)`.
    fn batch(
        &self,
        ids: &Bound<'_, PyAny>,
        name: &str,
    ) -> PyResult<(Vec<usize>, Vec<u32>, usize, usize)> {
        let (shape, ids) = token_ids(ids, name, self.model.config().vocab_size)?;
        let t = *shape
            .last()
            .ok_or_else(|| invalid(format!("{name}: expected at least 1 dimension (…, seq)")))?;
        let b = ids.len() / t.max(1);
        Ok((shape, ids, b, t))
    }
}

/// The configuration of a named model (`tinystories`, `bench-small`, `gpt2-small`,
/// … : the engine's table of presets) as a dict for [`TransformerLM`] or `train`.
#[pyfunction]
pub fn preset_config<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    to_py_json(py, &ModelConfig::preset(name).map_err(model_error)?)
}

#[pymethods]
impl TransformerLM {
    /// A freshly initialized model (SPEC init, from `seed`) on `device` (`cpu`,
    /// `cuda`, `cuda:N` or `auto`) in `precision` (`auto`, `bf16` or `fp32`; by
    /// default fp32 on the CPU and auto on a GPU).
    #[new]
    #[pyo3(signature = (config, seed = 0, device = "cpu", precision = None))]
    fn new(
        py: Python<'_>,
        config: &Bound<'_, PyAny>,
        seed: u64,
        device: &str,
        precision: Option<&str>,
    ) -> PyResult<Self> {
        let config: ModelConfig = from_py_json(config, "config")?;
        config.validate().map_err(model_error)?;
        let model = detached(py, || {
            let params = ParamLayout::new(&config).init(seed);
            open_model(Source::Params(config, &params), device, precision)
        })?;
        Ok(TransformerLM { model })
    }

    /// A model from a checkpoint file, or a run directory holding
    /// `checkpoint.safetensors`, on `device` in `precision`.
    #[classmethod]
    #[pyo3(signature = (path, device = "cpu", precision = None))]
    fn from_pretrained(
        _cls: &Bound<'_, PyType>,
        py: Python<'_>,
        path: PathBuf,
        device: &str,
        precision: Option<&str>,
    ) -> PyResult<Self> {
        let path = if path.is_dir() {
            path.join("checkpoint.safetensors")
        } else {
            path
        };
        let model = detached(py, || {
            let ckpt = CheckpointFile::open(&path).map_err(model_error)?;
            open_model(Source::Checkpoint(&ckpt), device, precision)
        })?;
        Ok(TransformerLM { model })
    }

    /// The configuration as a dict.
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py_json(py, self.model.config())
    }

    /// Replaces every parameter: `state` must hold exactly the model's tensors.
    fn load_state_dict(&mut self, state: &Bound<'_, PyDict>) -> PyResult<()> {
        let params = params_from_state_dict(self.model.config(), state)?;
        on_model!(&mut self.model, m => m.upload_params(&params)).map_err(model_error)
    }

    /// Copies of the parameters by CS336 name, float32.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let params = on_model!(&self.model, m => m.download_params()).map_err(model_error)?;
        to_state_dict(py, self.model.layout(), &params)
    }

    /// Logits `(..., T, vocab_size)` for token ids `(..., T)`, `T ≤ context_length`.
    fn forward<'py>(
        &mut self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (mut shape, ids, b, t) = self.batch(ids, "ids")?;
        let model = &mut self.model;
        let logits = detached(
            py,
            || on_model!(model, m => Ok(m.forward(&ids, b, t).map_err(model_error)?.to_vec())),
        )?;
        shape.push(self.model.config().vocab_size);
        Ok(output(py, &shape, logits).into_any())
    }

    /// The mean cross-entropy of predicting `targets` from `ids` (both `(..., T)`) and
    /// its gradient for every parameter, by name.
    fn loss_and_grads<'py>(
        &mut self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
        targets: &Bound<'py, PyAny>,
    ) -> PyResult<(f64, Bound<'py, PyDict>)> {
        let (shape, ids, b, t) = self.batch(ids, "ids")?;
        let (target_shape, targets, _, _) = self.batch(targets, "targets")?;
        if target_shape != shape {
            return Err(invalid(format!(
                "targets of shape {target_shape:?} do not match ids of shape {shape:?}"
            )));
        }
        let model = &mut self.model;
        let (loss, grads) = detached(py, || {
            on_model!(model, m => {
                let loss = m.forward_loss(&ids, &targets, b, t).map_err(model_error)?;
                m.backward().map_err(model_error)?;
                Ok((loss as f64, m.download_grads().map_err(model_error)?))
            })
        })?;
        Ok((loss, to_state_dict(py, self.model.layout(), &grads)?))
    }

    /// Continues `prompt_ids` with at most `max_new_tokens` tokens sampled with
    /// `temperature` (0: greedy) and nucleus `top_p`, stopping at `eos_id`; returns
    /// the new tokens only. The defaults are
    /// [`Sampling::UNCHANGED`](tinylm::generate::Sampling::UNCHANGED)'s, written as
    /// literals: Python reads a signature's defaults only as literals (the stubs too).
    #[pyo3(signature = (prompt_ids, max_new_tokens, temperature = 1.0, top_p = 1.0, seed = None, eos_id = None))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &mut self,
        py: Python<'_>,
        prompt_ids: Vec<u32>,
        max_new_tokens: usize,
        temperature: f32,
        top_p: f32,
        seed: Option<u64>,
        eos_id: Option<u32>,
    ) -> PyResult<Vec<u32>> {
        let seed = seed.unwrap_or_else(crate::data::random_seed);
        let mut sampler = Sampler::new(temperature, top_p, None, seed).map_err(model_error)?;
        let model = &mut self.model;
        detached(py, || {
            on_model!(model, m => generate(
                m,
                &prompt_ids,
                max_new_tokens,
                &mut sampler,
                eos_id,
                |_| ControlFlow::Continue(()),
            ))
            .map_err(model_error)
        })
    }

    /// Same as `forward`.
    fn __call__<'py>(
        &mut self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.forward(py, ids)
    }

    fn __repr__(&self) -> String {
        let c = self.model.config();
        format!(
            "TransformerLM(vocab_size={}, context_length={}, d_model={}, num_layers={}, num_heads={}, d_ff={}, params={})",
            c.vocab_size,
            c.context_length,
            c.d_model,
            c.num_layers,
            c.num_heads,
            c.d_ff,
            self.model.layout().total
        )
    }
}
