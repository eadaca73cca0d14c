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
//! Files are written whole or not at all ([`crate::files`]), so a crash never leaves a
//! torn file.
//! They are written from the buffers where the values lie and read back tensor by
//! tensor into the buffers they go to ([`CheckpointFile`]): no copy of the whole
//! model or its moments is made on the way, on the CPU or from and to a GPU.

use crate::kernels::cpu::mixed::store;
use crate::kernels::{AdamWParams, Backend, Buffer, Stored};
use crate::model::Model;
use crate::optim::AdamW;
use crate::params::ParamLayout;
use crate::safetensors_io::{write_safetensors, FileBuffer, SafetensorsFile, TensorData};
use crate::{buffers, Error, ModelConfig, Result};
use half::bf16;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

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

    /// Runs `write` with host memory for at least `len` values, that fetched
    /// values cross in: where they are copied fastest (a `Vec` unless the buffer's
    /// backend says otherwise).
    fn with_staging(
        &self,
        len: usize,
        write: &mut dyn FnMut(&mut [f32]) -> Result<()>,
    ) -> Result<()> {
        write(&mut vec![0.0; len])
    }
}

impl FlatValues for &[f32] {
    fn values(&self, range: Range<usize>) -> TensorData<'_> {
        TensorData::Host(&self[range])
    }
}

impl FlatValues for &[bf16] {
    fn values(&self, range: Range<usize>) -> TensorData<'_> {
        TensorData::HostBf16(&self[range])
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

    /// The backend's staging memory (page-locked on a GPU).
    fn with_staging(
        &self,
        len: usize,
        write: &mut dyn FnMut(&mut [f32]) -> Result<()>,
    ) -> Result<()> {
        let mut staging = self.backend.alloc_staging(len)?;
        write(self.backend.staged(&mut staging)?)
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
/// fetched one tensor at a time into one staging buffer, `params`'s
/// [`FlatValues::with_staging`]).
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
    let longest = (tensors.iter())
        .filter(|(_, _, data)| matches!(data, TensorData::Fetch(_)))
        .map(|(_, shape, _)| shape.iter().product())
        .max()
        .unwrap_or(0);
    params.with_staging(longest, &mut |staging| {
        write_safetensors(path, &tensors, &metadata, staging)
    })
}

/// Writes a model's weights alone (a checkpoint without the optimizer state, which
/// every command that reads a model opens), as `f32` or rounded to bf16 (to
/// nearest, ties to even: half the size). A CPU model under bf16 that only runs
/// forward maps a bf16 file as the weights it multiplies, taking no fresh memory
/// for them ([`Backend::map_params`]), as a CPU model in `f32` maps an `f32` one.
pub fn save_weights(
    path: &Path,
    config: &ModelConfig,
    params: &[f32],
    stored: Stored,
    extra: &BTreeMap<String, String>,
) -> Result<()> {
    match stored {
        Stored::F32 => save_from(path, config, &params, None, extra),
        Stored::Bf16 => {
            let mut rounded = vec![bf16::ZERO; params.len()];
            store(&mut rounded, params);
            save_from(path, config, &rounded.as_slice(), None, extra)
        }
    }
}

/// Reads a checkpoint: the config, the weights (every tensor of the config's
/// layout with its exact shape) and, when present, the AdamW state.
pub fn load(path: &Path) -> Result<Checkpoint> {
    CheckpointFile::open(path)?.load()
}

/// A checkpoint opened for reading: its header checked (a valid model config, the
/// weights of its layout and, when the metadata has an `optimizer` entry, both
/// moments, each tensor with its exact shape), its tensors read when asked, one at
/// a time, into host memory ([`CheckpointFile::load`]) or straight into a
/// backend's buffers ([`CheckpointFile::model`], [`CheckpointFile::adamw`]).
pub struct CheckpointFile {
    file: SafetensorsFile,
    config: ModelConfig,
    layout: ParamLayout,
    /// The AdamW hyper-parameters and step, when the file has the moments.
    optimizer: Option<OptimizerMeta>,
}

impl CheckpointFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = SafetensorsFile::open(path)?;
        let config: ModelConfig = meta(file.metadata(), "config", path)?;
        config
            .validate()
            .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
        let layout = file.layout(&config)?;
        let mut opened = CheckpointFile {
            file,
            config,
            layout,
            optimizer: None,
        };
        opened.weights()?;
        if opened.metadata().contains_key("optimizer") {
            let state: OptimizerMeta = opened.meta("optimizer")?;
            opened.moment(MOMENT_M)?;
            opened.moment(MOMENT_V)?;
            opened.optimizer = Some(state);
        }
        Ok(opened)
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Every metadata entry, including `config` and `optimizer`.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        self.file.metadata()
    }

    /// A metadata entry parsed as JSON.
    pub fn meta<T: DeserializeOwned>(&self, key: &str) -> Result<T> {
        meta(self.metadata(), key, self.path())
    }

    /// The weights: every tensor but the moments.
    fn weights(&self) -> Result<FileBuffer<'_>> {
        let weight = |name: &str| !name.starts_with(MOMENT_M) && !name.starts_with(MOMENT_V);
        self.file
            .buffer(&self.layout, |name| weight(name).then_some(name))
    }

    /// The moment whose tensors' names start with `prefix`.
    fn moment(&self, prefix: &str) -> Result<FileBuffer<'_>> {
        self.file
            .buffer(&self.layout, |name| name.strip_prefix(prefix))
    }

    /// An error naming the file unless it holds the AdamW state.
    pub fn require_optimizer(&self) -> Result<()> {
        match self.optimizer {
            Some(_) => Ok(()),
            None => Err(self.no_optimizer()),
        }
    }

    fn no_optimizer(&self) -> Error {
        Error::Invalid(format!(
            "{}: no optimizer state (optim.m.*, optim.v.*) to resume from",
            self.path().display()
        ))
    }

    /// The whole checkpoint in host memory.
    pub fn load(&self) -> Result<Checkpoint> {
        let all = 0..self.layout.total;
        let optimizer = match &self.optimizer {
            Some(state) => Some(AdamW {
                hp: state.hp,
                covers: all.clone(),
                m: self.moment(MOMENT_M)?.to_vec(all.clone())?,
                v: self.moment(MOMENT_V)?.to_vec(all.clone())?,
                step: state.step,
            }),
            None => None,
        };
        Ok(Checkpoint {
            config: self.config.clone(),
            params: self.weights()?.to_vec(all)?,
            optimizer,
            metadata: self.metadata().clone(),
        })
    }

    /// A model run by `backend` with the checkpoint's weights, mapped where the
    /// backend can (a CPU model, [`FileBuffer::map`]), else read into its
    /// parameter buffer (the moments are not read).
    pub fn model<B: Backend<f32>>(&self, backend: B) -> Result<Model<f32, B>> {
        model_from(&self.weights()?, self.config.clone(), backend, Load::Map)
    }

    /// [`CheckpointFile::model`] to train on: the weights read into the model's
    /// own memory, never mapped (training writes every weight at every step).
    pub fn model_to_train<B: Backend<f32>>(&self, backend: B) -> Result<Model<f32, B>> {
        model_from(&self.weights()?, self.config.clone(), backend, Load::Read)
    }

    /// `model`'s AdamW state for the parameters `covers` (all of them, or a ZeRO-1
    /// rank's shard) in its backend's buffers: of each moment, the values `covers`
    /// alone are read. An error names the file when it has no moments.
    pub fn adamw<B: Backend<f32>>(
        &self,
        model: &Model<f32, B>,
        covers: Range<usize>,
    ) -> Result<AdamW<B::Buf>> {
        let state = self.optimizer.as_ref().ok_or_else(|| self.no_optimizer())?;
        let mut opt = model.new_adamw_for(state.hp, covers.clone())?;
        opt.step = state.step;
        let (backend, mut staging) = (model.backend(), None);
        let m = self.moment(MOMENT_M)?;
        m.read_into(backend, covers.clone(), &mut opt.m, &mut staging)?;
        let v = self.moment(MOMENT_V)?;
        v.read_into(backend, covers, &mut opt.v, &mut staging)?;
        Ok(opt)
    }
}

/// How a model's weights come from a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Load {
    /// Mapped where the backend can ([`FileBuffer::map`]), for a model that runs:
    /// no fresh memory, no copy. Else read.
    Map,
    /// Read into fresh memory, tensor by tensor, for a model that trains: it writes
    /// every weight each step, which in a mapping would copy each page at its
    /// first write and keep the file's old pages (the file a run replaces) until
    /// the run ends.
    Read,
}

/// A model run by `backend` with the weights `weights` (of `config`'s layout),
/// mapped or read into its parameter buffer tensor by tensor as `load` says.
pub(crate) fn model_from<B: Backend<f32>>(
    weights: &FileBuffer,
    config: ModelConfig,
    backend: B,
    load: Load,
) -> Result<Model<f32, B>> {
    Model::with_backend_from(config, backend, |backend, layout| {
        if let Some(params) = (load == Load::Map).then(|| weights.map(backend)).flatten() {
            return Ok(params);
        }
        let mut params = buffers::parameters(backend, layout)?;
        weights.read_into(backend, 0..layout.total, &mut params, &mut None)?;
        Ok(params)
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

    fn small() -> ModelConfig {
        ModelConfig {
            vocab_size: 64,
            context_length: 8,
            d_model: 16,
            num_layers: 2,
            num_heads: 2,
            d_ff: 40,
            ..ModelConfig::tinystories()
        }
    }

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

    /// The file the mapping that holds `addr` maps, from `/proc/self/maps` (empty
    /// or a name in brackets for anonymous memory).
    #[cfg(target_os = "linux")]
    fn mapped_file(addr: usize) -> String {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps.lines().find(|line| {
            let (start, end) = line
                .split_whitespace()
                .next()
                .unwrap()
                .split_once('-')
                .unwrap();
            let hex = |h| usize::from_str_radix(h, 16).unwrap();
            (hex(start)..hex(end)).contains(&addr)
        });
        let fields = line
            .expect("a mapping holds the address")
            .split_whitespace();
        fields.skip(5).collect::<Vec<_>>().join(" ")
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_cpu_model_maps_the_parameters_tinylm_wrote_and_reads_any_other_order() {
        let config = small();
        let trained = Model::<f32, Cpu>::new(config.clone(), 3).unwrap();
        let opt = AdamW::new(trained.params().len(), AdamWParams::default());
        let dir = tempfile::tempdir().unwrap();
        let (ours, reversed) = (
            dir.path().join("ours.safetensors"),
            dir.path().join("rev.safetensors"),
        );
        save(
            &ours,
            &config,
            trained.params(),
            Some(&opt),
            &BTreeMap::new(),
        )
        .unwrap();
        let layout = ParamLayout::new(&config);
        let mut tensors = layout.tensors(trained.params());
        tensors.reverse();
        crate::safetensors_io::save_safetensors(&reversed, &tensors, &BTreeMap::new()).unwrap();

        let mut mapped = CheckpointFile::open(&ours).unwrap().model(Cpu).unwrap();
        let read = crate::weights::open(&reversed, Some(&config))
            .unwrap()
            .model(Cpu)
            .unwrap();
        assert_eq!(mapped.params(), trained.params());
        assert_eq!(read.params(), trained.params());
        let file_of = |m: &Model| mapped_file(m.params().as_ptr() as usize);
        assert_eq!(
            file_of(&mapped),
            ours.canonicalize().unwrap().display().to_string()
        );
        // A file in another order is read into memory, and so are the weights of
        // a model that trains.
        let to_train = CheckpointFile::open(&ours)
            .unwrap()
            .model_to_train(Cpu)
            .unwrap();
        assert_eq!(to_train.params(), trained.params());
        for model in [&read, &to_train] {
            assert!(
                !file_of(model).ends_with(".safetensors"),
                "{}",
                file_of(model)
            );
        }
        // A write changes the model's values, never the file's.
        mapped.params_mut()[1] += 1.0;
        let again = CheckpointFile::open(&ours).unwrap().model(Cpu).unwrap();
        assert_eq!(again.params(), trained.params());
        assert_ne!(mapped.params(), trained.params());
    }

    /// A forward-only model under bf16 maps a bf16 weights file as the weights it
    /// multiplies, and under bf16 or Q8_0 an `f32` file's values (making its copy
    /// from them): the same logits, bit for bit, as from the same values read in
    /// from a file in another order. Q8_0 reads a bf16 file.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_forward_only_mixed_model_maps_a_bf16_weights_file_and_an_f32_files_values() {
        use crate::kernels::CpuMixed;
        // Q8_0 blocks of 32 values split every row.
        let config = ModelConfig {
            d_model: 32,
            d_ff: 64,
            ..small()
        };
        let trained = Model::<f32, Cpu>::new(config.clone(), 3).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        let none = BTreeMap::new();
        save_weights(&path("f32"), &config, trained.params(), Stored::F32, &none).unwrap();
        save_weights(
            &path("bf16"),
            &config,
            trained.params(),
            Stored::Bf16,
            &none,
        )
        .unwrap();
        // Both files' values in reversed order: read in, never mapped.
        let rounded: Vec<f32> = (trained.params().iter())
            .map(|&x| bf16::from_f32(x).to_f32())
            .collect();
        let layout = ParamLayout::new(&config);
        for (name, values) in [("f32 rev", trained.params()), ("bf16 rev", &rounded[..])] {
            let mut tensors = layout.tensors(values);
            tensors.reverse();
            crate::safetensors_io::save_safetensors(&path(name), &tensors, &none).unwrap();
        }
        let ids: Vec<u32> = (0..16).map(|i| (i * 7 % 64) as u32).collect();
        // (The logits of two sequences, the file the parameters' values lie in.)
        let run = |name: &str, backend: CpuMixed| {
            let opened = crate::weights::open(&path(name), Some(&config)).unwrap();
            let mut model = opened.model(backend).unwrap();
            let file = mapped_file(model.param_buffer().values_addr());
            (model.forward(&ids, 2, 8).unwrap().to_vec(), file)
        };
        let in_file = |name: &str| path(name).canonicalize().unwrap().display().to_string();
        let bf16 = CpuMixed::new().forward_only();
        let cases = [
            ("bf16", bf16, true),
            ("f32", bf16, true),
            ("f32", CpuMixed::q8(), true),
            ("bf16", CpuMixed::q8(), false),
        ];
        for (name, backend, maps) in cases {
            let (mapped, file) = run(name, backend);
            let (read, read_file) = run(&format!("{name} rev"), backend);
            assert!(!read_file.ends_with("rev"), "{read_file}");
            assert_eq!(file == in_file(name), maps, "{name} on {backend:?}: {file}");
            assert!(mapped == read, "{name} on {backend:?}: other logits");
        }
    }

    #[test]
    fn a_checkpoint_written_from_the_buffers_is_the_host_copys_byte_for_byte() {
        let config = small();
        let model = Model::<f32, Cpu>::new(config.clone(), 3).unwrap();
        let mut opt = model.new_adamw(AdamWParams::default()).unwrap();
        for (i, (m, v)) in opt.m.iter_mut().zip(opt.v.iter_mut()).enumerate() {
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
        assert_eq!(load(&direct).unwrap().optimizer.unwrap().m, &opt.m[..]);
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
            num_layers: 1,
            ..small()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.safetensors");
        let err = save_from(&path, &config, &Failing, None, &BTreeMap::new()).unwrap_err();
        assert!(err.to_string().contains("the GPU is gone"), "{err}");
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
    }

    #[test]
    fn a_checkpoint_reads_into_the_buffers_and_a_shard_reads_its_moments_alone() {
        let config = small();
        let layout = ParamLayout::new(&config);
        let (total, params) = (layout.total, layout.init(3));
        let mut opt = AdamW::new(total, AdamWParams::default());
        opt.m = layout.init(4);
        opt.v = layout.init(5).iter().map(|x| x * x).collect();
        opt.step = 9;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.safetensors");
        save(&path, &config, &params, Some(&opt), &BTreeMap::new()).unwrap();
        let ckpt = CheckpointFile::open(&path).unwrap();
        let model = ckpt.model(Cpu).unwrap();
        assert_eq!(model.params(), params);
        // Two ranks' shards, each boundary inside a tensor.
        let half = total / 2 + 3;
        for covers in [0..half, half..total] {
            let shard = ckpt.adamw(&model, covers.clone()).unwrap();
            assert_eq!((shard.covers.clone(), shard.step), (covers.clone(), 9));
            assert_eq!(shard.m[..], opt.m[covers.clone()]);
            assert_eq!(shard.v[..], opt.v[covers]);
        }
        save(&path, &config, &params, None, &BTreeMap::new()).unwrap();
        let ckpt = CheckpointFile::open(&path).unwrap();
        let err = ckpt.adamw(&model, 0..total).err().unwrap().to_string();
        assert!(err.contains("c.safetensors: no optimizer state"), "{err}");
    }

    #[test]
    fn a_bad_checkpoint_is_one_line_naming_the_file_and_the_tensors() {
        let config = ModelConfig {
            num_layers: 1,
            ..small()
        };
        let layout = ParamLayout::new(&config);
        let params = layout.init(1);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.safetensors");
        let meta = BTreeMap::from([
            (
                "config".to_string(),
                serde_json::to_string(&config).unwrap(),
            ),
            ("optimizer".to_string(), {
                let state = OptimizerMeta {
                    hp: AdamWParams::default(),
                    step: 2,
                };
                serde_json::to_string(&state).unwrap()
            }),
        ]);
        let mut tensors = layout.tensors(&params);
        let moments: Vec<_> = (tensors.iter())
            .map(|(n, s, v)| (format!("{MOMENT_M}{n}"), s.clone(), *v))
            .collect();
        tensors.extend(moments);
        // The query projection flattened.
        tensors[2].1 = vec![16 * 16];
        tensors.push(("extra.bias".to_string(), vec![1], &params[..1]));
        crate::safetensors_io::save_safetensors(&path, &tensors, &meta).unwrap();
        let err = CheckpointFile::open(&path).err().unwrap().to_string();
        let name = &layout.specs[2].name;
        assert!(!err.contains('\n'), "{err}");
        for part in [
            format!("{}: the weights do not match", path.display()),
            format!("tensor '{name}' has shape [256], expected [16, 16]"),
            "unexpected tensor 'extra.bias'".to_string(),
        ] {
            assert!(err.contains(&part), "{part} not in {err}");
        }
        // The weights right, the second moment missing.
        tensors[2].1 = layout.specs[2].shape.clone();
        tensors.pop();
        crate::safetensors_io::save_safetensors(&path, &tensors, &meta).unwrap();
        let err = CheckpointFile::open(&path).err().unwrap().to_string();
        assert!(
            err.contains("bad.safetensors")
                && err.contains("missing tensor 'token_embeddings.weight'"),
            "{err}"
        );
    }
}
